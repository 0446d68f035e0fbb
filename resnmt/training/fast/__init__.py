"""``--fast-path`` (a flag of the ``resnmt_translation`` task): training at the card's speed.

One flag turns on, for every connection kind and activation:

* ``buckets``: static shapes, the training batches in ``--shape-buckets`` fixed shapes
  (the padding they add logged once);
* ``update`` and ``step``: an update with no host synchronisation
  (:class:`~resnmt.training.fast.step.FastPathTrainer`), losses, norm and the
  non-finite check on the device, read at ``--log-interval``;
* ``capture``: on CUDA, the forward-backward of each batch shape and the update
  recorded once as CUDA graphs and replayed.

:func:`install` makes fairseq-train build :class:`FastPathTrainer` instead of fairseq's
``Trainer``: ``fairseq_cli.train.main`` looks the name ``Trainer`` up in its module when it
builds the trainer, after the task is set up, so the task replaces it there (process-wide,
as ``--fused-master-weights`` patches fairseq's optimizer; :func:`uninstall` puts it back):
the ``fast-path-trainer`` patch, applied by resnmt.fairseq_patches.
Nothing is imported here: a process that never sets the flag loads none of it.
"""
import logging
import sys

logger = logging.getLogger(__name__)
_ORIGINAL = {}


def install() -> bool:
    """fairseq-train's ``Trainer`` becomes :class:`FastPathTrainer` where fairseq-train's
    module is loaded (it is in ``fairseq-train`` and ``resnmt-train``; a Python session
    that builds its own Trainer chooses its class itself). Returns whether it was."""
    train_cli = sys.modules.get("fairseq_cli.train")
    if train_cli is None:
        return False
    from resnmt.training.fast.step import FastPathTrainer

    if "Trainer" not in _ORIGINAL:
        _ORIGINAL["Trainer"] = train_cli.Trainer
    train_cli.Trainer = FastPathTrainer
    return True


def uninstall() -> None:
    train_cli = sys.modules.get("fairseq_cli.train")
    if train_cli is not None and "Trainer" in _ORIGINAL:
        train_cli.Trainer = _ORIGINAL.pop("Trainer")


def installed() -> bool:
    return "Trainer" in _ORIGINAL
