"""``--log-connection-stats``: gate means, rSkip ratios and activation gains in the
training log (console, ``--log-format json``, ``--tensorboard-logdir``).

Off by default; with the flag unset no hook is registered, so training costs nothing
extra. With it, the ``resnmt_translation`` task (``--task resnmt_translation``, which
the flag requires) attaches :class:`~resnmt.analysis.hooks.StatsCollector` hooks when
training begins (``begin_epoch``); they measure every training forward (never
validation or generation) and log through ``fairseq.logging.metrics.log_scalar``;
fairseq averages the values of the updates between two log lines. Building or loading
a model never attaches them, so ``fairseq-generate`` and ``resnmt-analyze`` on a
checkpoint trained with the flag run without hooks.

Levels:

* ``side`` (default, ``--log-connection-stats`` alone): one key per statistic and side,
  the mean over that side's sublayers, e.g. ``sas_alpha_enc``, ``sas_gamma_dec``,
  ``rskip_ratio_enc``, ``hw_gate_dec``, ``act_lambda_enc`` (6 keys for an SAS model);
* ``layer``: the ``side`` keys plus one per layer and sublayer, e.g.
  ``sas_alpha_enc0_self``, ``sas_beta_dec5_cross``, ``act_rho_dec2`` (90 more for a
  6+6 SAS model: 6 x 2 + 6 x 3 sublayers, 3 gates each).
"""
from typing import Optional

from fairseq.logging import metrics
from torch import Tensor, nn

from resnmt.analysis.hooks import STATISTICS, Site, StatsCollector
from resnmt.options import Option

LEVELS = ("side", "layer")
PRIORITY = 500  # after fairseq's own keys (loss ... wall) in the console line
ROUND = 3


TASK_REQUIRED = "resnmt_translation"


LOG_CONNECTION_STATS = Option(
    "log_connection_stats", kind="choice", choices=LEVELS, nargs="?", const="side", metavar="LEVEL",
    help="log what each connection learns (SAS alpha/beta/gamma, the rSkip effective skip:residual "
    "ratio, the highway gate, the skip:residual norm ratio of xskip/deepnorm/admin, learned lambda, "
    "Admin omega, ReZero a) and NReLU/NSwish rho, rho', lambda at every --log-interval, averaged over real "
    "(non-padding) tokens: 'side' (the flag alone) = one value per encoder/decoder side "
    "(keys like sas_alpha_enc), 'layer' = also per layer and sublayer (sas_alpha_enc0_self). "
    "Costs one extra gate evaluation per sublayer in training. Needs --task resnmt_translation, "
    "which attaches the hooks in training only (default: off)")


def log_key(statistic: str, site: Site, per_layer: bool) -> str:
    """``("sas_alpha", ("encoder", 0, "self"))`` -> ``sas_alpha_enc`` or ``sas_alpha_enc0_self``.

    Activation keys drop the sublayer (it is always the FFN): ``act_rho_dec2``.
    """
    short = STATISTICS[statistic].log_key
    side, layer, sublayer = site
    if not per_layer:
        return f"{short}_{side[:3]}"
    if statistic.startswith("act_"):
        return f"{short}_{side[:3]}{layer}"
    return f"{short}_{side[:3]}{layer}_{sublayer}"


class MetricsSink:
    """Logs each measurement's batch mean (a 0-dim tensor: no device sync here) with
    weight 1, so a side key is the mean over sublayers and updates of per-batch means."""

    def __init__(self, level: str):
        if level not in LEVELS:
            raise ValueError(f"--log-connection-stats must be one of {', '.join(LEVELS)}, got {level!r}")
        self.per_layer = level == "layer"

    def __call__(self, site: Site, name: str, total: Tensor, count: Tensor) -> None:
        value = (total / count.clamp(min=1)).detach()
        metrics.log_scalar(log_key(name, site, False), value, weight=1, priority=PRIORITY, round=ROUND)
        if self.per_layer:
            metrics.log_scalar(log_key(name, site, True), value, weight=1, priority=PRIORITY + 1, round=ROUND)


def attach_training_logger(model: nn.Module, level: Optional[str]) -> Optional[StatsCollector]:
    """Register the training-time hooks on ``model`` for ``--log-connection-stats LEVEL``;
    returns the collector (``.remove()`` takes the hooks off), or None when ``level`` is
    unset. Called by the ``resnmt_translation`` task when training begins, never when a
    model is built, so a checkpoint trained with the flag loads without hooks."""
    if not level:
        return None
    return StatsCollector(model, MetricsSink(level), training_only=True)


def training_level(model: nn.Module) -> Optional[str]:
    """The ``--log-connection-stats`` level a model was built with (None: off)."""
    return getattr(getattr(model, "args", None), "log_connection_stats", None)


def check_log_connection_stats_task(args) -> None:
    """At argument parsing: the flag needs the task that attaches the hooks."""
    if getattr(args, "log_connection_stats", None) and getattr(args, "task", TASK_REQUIRED) != TASK_REQUIRED:
        raise ValueError(
            f"--log-connection-stats needs --task {TASK_REQUIRED} (got --task {args.task}): "
            "that task attaches the statistics hooks in training"
        )
