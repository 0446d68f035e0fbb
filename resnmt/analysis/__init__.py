"""Analysis of residual connections: what the gates, ratios and activation gains of a
``resnmt_transformer`` are, layer by layer, and how gradients reach each block.

* :mod:`resnmt.analysis.statistics` - per-position statistics from a module's inputs;
* :mod:`resnmt.analysis.hooks` - forward hooks collecting them while the model runs;
* :mod:`resnmt.analysis.training_log` - ``--log-connection-stats`` (fairseq metrics);
* :mod:`resnmt.analysis.gradients` - gradient norms of each block's output;
* :mod:`resnmt.analysis.plotting` - one PNG per statistic (matplotlib, Agg backend).

``resnmt-analyze`` (:mod:`resnmt.cli.analyze`) ties them together; see ``docs/analysis.md``.
"""
