"""One NMT experiment, each step written once: prepare, train, average, decode, score, record.

* ``options``: how a command-line option is declared (name, type, default, help and check
  together) and the errors a bad value raises;
* ``presets``: the papers' training presets and model sizes (``TrainRequest``,
  ``plan_training``, ``SIZES``) for a built-in dataset or a prepared directory;
* ``fairseq_flags``: fairseq-train's own parser answering a bad flag in one line, and the check
  of a planned command's flags (those after ``--`` too) with it;
* ``runtime``: the environment and logging of the external programs the steps run;
* ``steps``: the steps, one function each (``train``, ``average``, ``decode``, ``score``,
  ``analyze``), and ``FairseqLog``, the one reader of fairseq-train's log;
* ``results``: the records of finished experiments (JSON lines, names of decoding settings);
* ``pipeline``: ``Experiment``, the steps chained for one model (``resnmt-experiment``, the demo).

The command lines are in ``resnmt.cli.experiment`` and ``resnmt.cli.demo``.
"""
