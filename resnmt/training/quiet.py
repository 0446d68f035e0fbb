"""Hide the deprecation notices fairseq 0.12 causes in its dependencies (and the DEBUG level
its import leaves on the root logger), torch's notice that memory is not pinned without
a GPU, and, in resnmt's commands (unless ``--verbose``), fairseq's dumps of its
configuration and model, the lines it logs each time it batches a dataset (the per-epoch
``can_reuse_epoch_itr = ...``, ``reuse_dataloader = ...``, ``rebuild_batches = ...``,
``creating new batches for epoch N``: 4 lines per epoch of training, per validation, per
``translate()`` of the hub) and its notice that the ``--user-dir`` is imported already;
nothing else.

fairseq builds its configuration with hydra's old API (``hydra.experimental``
``initialize``/``compose``, ``strict=``, ``# @package _group_`` headers, schemas matched
by name), so every command that converts its arguments (``fairseq-train``,
``fairseq-generate``, ``resnmt-train`` ...) opens with about 24 lines of hydra
``UserWarning``s about hydra's 1.1-1.4 migrations; and it calls torch APIs that torch
has deprecated since (``torch.cuda.amp.autocast(...)`` in every training step, masks of
mixed types in ``multi_head_attention_forward``). Nobody running resnmt can act on
them. ``hide_third_party_deprecations`` ignores exactly those, by category and the
module that raises them (by their text where the module is not telling):

* ``UserWarning``s raised from hydra's modules (``Hydra14MigrationWarning`` included),
  and the one about schema matching that hydra attributes to no module (``sys:1``);
* torch's ``FutureWarning`` that ``torch.cuda.amp.X(args...)`` is deprecated, raised
  from fairseq's modules;
* torch's ``UserWarning`` that mismatched ``key_padding_mask`` and ``attn_mask`` types
  are deprecated (``torch.nn.functional``).

* torch's ``UserWarning`` that ``pin_memory`` is set but no accelerator is found
  (``torch.utils.data.dataloader``): fairseq asks every data loader to pin memory, so a
  CPU run printed it at every epoch of training and decoding.

Every other warning is shown as before. ``import resnmt`` installs the filters, so they
apply to resnmt's commands and to fairseq's commands run with ``--user-dir resnmt``
(fairseq imports the user directory before it composes its configuration), and calls
``lower_fairseqs_debug_logging`` (below).
"""
import re
import warnings

# (message regex, category, module regex); warnings.filterwarnings matches both from
# their start (the message case-insensitively), so the module regexes end the name
THIRD_PARTY_DEPRECATIONS = (
    # hydra.core.utils.deprecation_warning attributes its warnings to the hydra module calling it ...
    ("", UserWarning, r"hydra(\.|$)"),
    # ... except this one, raised with a stacklevel deeper than the stack
    (r"\s*'[^']*' is validated against ConfigStore schema with the same name", UserWarning, ""),
    (r"`torch\.cuda\.amp\.\w+\(args\.\.\.\)` is deprecated", FutureWarning, r"fairseq(\.|$)"),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning, r"torch\.nn\.functional$"),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning,
     r"torch\.utils\.data\.dataloader$"),
)


def hide_third_party_deprecations() -> None:
    """Install the filters of THIRD_PARTY_DEPRECATIONS (idempotent: ``filterwarnings``
    moves a filter that is already there to the front instead of adding it twice)."""
    for message, category, module in THIRD_PARTY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def lower_fairseqs_debug_logging() -> None:
    """Undo the DEBUG level importing fairseq gives the root logger, keeping its handler.

    ``fairseq/models/wav2vec/wav2vec2_classification.py`` calls
    ``logging.basicConfig(level=logging.DEBUG)`` at import; ``fairseq-train`` configures
    logging before it imports fairseq, but ``fairseq-generate``, ``fairseq-interactive``
    and a Python session do not, so they print hydra's ``DEBUG:hydra.core.utils:Setting
    JobRuntime`` lines (and any library's debug output). When the root logger is exactly
    that configuration (level DEBUG, one stderr handler with ``logging.BASIC_FORMAT``) it
    goes back to ``$LOGLEVEL`` or INFO, fairseq's level, and its lines take fairseq-train's
    format (``2026-01-01 12:00:00 | INFO | fairseq_cli.generate | ...``); where they go is
    unchanged. ``LOGLEVEL=DEBUG`` (fairseq's own switch) keeps DEBUG.
    """
    import logging
    import os
    import sys

    root = logging.getLogger()
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    if root.level != logging.DEBUG or level == "DEBUG" or len(root.handlers) != 1:
        return
    handler = root.handlers[0]
    if type(handler) is not logging.StreamHandler or handler.stream is not sys.stderr:
        return
    if handler.formatter is None or handler.formatter._fmt != logging.BASIC_FORMAT:
        return
    root.setLevel(level)
    handler.setFormatter(logging.Formatter(FAIRSEQ_LOG_FORMAT, FAIRSEQ_LOG_DATEFMT))  # as fairseq-train's lines


# fairseq-train's log format (fairseq_cli/train.py), which fairseq-generate's lines take too
FAIRSEQ_LOG_FORMAT, FAIRSEQ_LOG_DATEFMT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s", "%Y-%m-%d %H:%M:%S"
# a fairseq INFO line, in fairseq-train's format or the logging module's default
_INFO_LINE_RE = re.compile(r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| INFO \| |INFO:)")


def is_info_line(line: str) -> bool:
    """True for a line fairseq logged at INFO level (what resnmt-experiment leaves out without --verbose)."""
    return bool(_INFO_LINE_RE.match(line))


# fairseq_cli's INFO line holding its whole configuration ("{'_name': None, 'common': ...",
# several KB), in fairseq-train's format or the logging module's default
_CONFIG_DUMP_RE = re.compile(r"fairseq_cli\.\w+(?: \| |:)\{'_name': ")
# fairseq-train's INFO line that opens the model's repr (one line per module after it, up to ")")
_MODEL_REPR_RE = re.compile(r"fairseq_cli\.train \| \w+\($")
# what fairseq.tasks.fairseq_task logs each time it batches a dataset (get_batch_iterator)
BATCHING_LOGGER = "fairseq.tasks.fairseq_task"
_BATCHING_RE = re.compile(r"(?:can_reuse_epoch_itr|reuse_dataloader|rebuild_batches) = \w+$"
                          r"|creating new batches for epoch \d+$|batches will be rebuilt for each epoch$")
# ... as a line of a command's output, in fairseq-train's format or the logging module's default
_BATCHING_LINE_RE = re.compile(re.escape(BATCHING_LOGGER) + r"(?: \| |:)(?:" + _BATCHING_RE.pattern + ")")


class FairseqNoise:
    """``keep(line)``: False for the lines of fairseq's configuration dump, of the model
    repr fairseq-train logs and of its batching, which resnmt's commands leave out of what
    they print (the training log keeps them; ``--verbose`` shows them)."""

    def __init__(self):
        self.in_model = False

    def keep(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        if self.in_model:
            self.in_model = text != ")"
            return False
        if _CONFIG_DUMP_RE.search(text) or _BATCHING_LINE_RE.search(text):
            return False
        if _MODEL_REPR_RE.search(text):
            self.in_model = True
            return False
        return True


def hide_fairseq_dumps(logger_name: str = "fairseq_cli.train") -> None:
    """Drop the records of ``logger_name`` that dump the whole configuration or model
    (``logger.info(cfg)``, ``logger.info(model)`` in fairseq_cli.train), and fairseq's
    batching lines (``hide_batching_lines``): resnmt-train's output without ``--verbose``.
    By the record's type, so every other line stays."""
    import argparse
    import logging

    def keep(record) -> bool:
        import torch
        from omegaconf import DictConfig

        return not isinstance(record.msg, (DictConfig, argparse.Namespace, torch.nn.Module))

    logging.getLogger(logger_name).addFilter(keep)
    logging.getLogger(BATCHING_LOGGER).addFilter(_not_batching)


def _not_batching(record) -> bool:
    return not _BATCHING_RE.match(record.getMessage())


class hide_batching_lines:
    """``with hide_batching_lines():`` fairseq's batching lines are not logged inside (the
    hub's ``generate``, whose every call batches its sentences anew)."""

    def __enter__(self):
        import logging

        self.filter = lambda record: _not_batching(record)  # its own: removing it leaves any other
        logging.getLogger(BATCHING_LOGGER).addFilter(self.filter)

    def __exit__(self, *exc):
        import logging

        logging.getLogger(BATCHING_LOGGER).removeFilter(self.filter)


def _not_user_dir_notice(record) -> bool:
    return "has already been imported" not in record.getMessage()


def hide_user_dir_notice() -> None:
    """Drop fairseq's INFO line that the ``--user-dir`` it imports is imported already:
    resnmt's commands import resnmt before fairseq does, nothing to act on."""
    import logging

    logging.getLogger("fairseq.utils").addFilter(_not_user_dir_notice)
