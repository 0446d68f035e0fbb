"""The study's protocol as a library: what ``resnmt-study verdict`` (a kind of one's own
against the shipped rows) calls, and what a campaign of one's own trains its rows with.

From the ground up: ``records`` (what a results line records beside its numbers: the
settings' key, portable paths, the machine), ``flags`` (the command-line flags the study's
commands share), ``rows`` (a row: a kind as an arch and its flags), ``lines`` (reading the
study's lines: settings, sizes, the verdict budgets), ``verdicts`` (the verdict rule on a
claim), ``runs`` (training to a budget, resuming, and scoring an average), ``milestones``
(one run trained to each milestone in turn, resumably, one line each; the options that make
a run's settings), ``cost`` (what a verdict costs on this machine, from a measured rate),
``jobs`` (each run a submitit job, here or on a SLURM cluster) and ``verdict`` (the
protocols, and a kind's rows beside the shipped ones, ``reference.jsonl``, with the study's
verdicts).
"""
