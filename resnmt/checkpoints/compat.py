"""Let fairseq load its own checkpoints under torch >= 2.6 without disabling safety.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses to
unpickle anything but tensors and plain containers. fairseq checkpoints of legacy
(argparse) models store the model configuration as an ``argparse.Namespace`` inside
``cfg["model"]``, so ``fairseq-generate``, ``--restore-file``/resume, the hub
interface and checkpoint averaging all fail with an "Unsupported global:
argparse.Namespace" error.

Instead of passing ``weights_only=False`` everywhere (which would let a malicious
checkpoint run code), we allow-list exactly the classes fairseq checkpoints hold.
The list was found with ``torch.serialization.get_unsafe_globals_in_checkpoint`` on
checkpoints written by ``fairseq-train`` (``checkpoint_last``, ``_best``, epoch and
update checkpoints): it is ``argparse.Namespace`` alone.
"""
import argparse

import torch

FAIRSEQ_CHECKPOINT_GLOBALS = (argparse.Namespace,)


def allow_fairseq_checkpoints() -> None:
    """Register the classes fairseq checkpoints contain as safe for ``torch.load``.

    Idempotent; a no-op on torch versions without ``add_safe_globals``.
    """
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4 loads everything anyway
        return
    add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))
