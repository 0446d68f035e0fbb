"""The curves study as a library: what ``resnmt-study curves`` (the project's own study) and
``resnmt-study verdict`` (a kind of one's own against it) both call.

From the ground up: ``records`` (what a results line records beside its numbers: the
settings' key, portable paths, the machine), ``flags`` (the command-line flags the study and
the benchmarks share), ``rows`` (the rows the study trains, each size's milestones),
``verdicts`` (the verdict rule on a claim), ``runs`` (training to a budget, resuming, and
scoring an average), ``tables`` (the study's tables and verdicts from its lines), ``plan``
(each language pair's runs in priority order, the GPU study's schedule), ``milestones`` (one
run trained to each milestone in turn, resumably, one line each) and ``verdict`` (a kind's
rows beside the shipped ones, with the study's verdicts).
"""
