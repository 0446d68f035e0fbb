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

A file whose pickle asks for any other global (a crafted checkpoint's ``posix.system``) is
refused by torch; ``unsafe_checkpoint`` words that refusal in one line naming the global,
which averaging, analysis, the hub and decoding (``refuse_unsafe_checkpoints``) all say.
"""
import argparse
import pickle
import re
from typing import Optional

import torch

FAIRSEQ_CHECKPOINT_GLOBALS = (argparse.Namespace,)


def allow_fairseq_checkpoints() -> None:
    """Register the classes fairseq checkpoints contain as safe for ``torch.load`` (a no-op on
    torch versions without ``add_safe_globals``). Applied once, by resnmt.fairseq_patches."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4 loads everything anyway
        return
    add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))


_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)")


def unsafe_checkpoint(error: BaseException, path) -> Optional[str]:
    """For ``torch.load(weights_only=True)``'s refusal of a global in the file ``path``: one line
    saying that the file is unsafe and naming the global its pickle asks for; None for any
    other error."""
    found = _GLOBAL_RE.search(str(error))
    if not isinstance(error, pickle.UnpicklingError) or "Weights only load failed" not in str(error) or not found:
        return None
    return (f"{path} is an unsafe file, not loaded: its pickle asks for {found.group(1)}, which no fairseq "
            "checkpoint holds (only tensors, plain containers and argparse.Namespace); nothing in it was run")


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint refused as unsafe (``unsafe_checkpoint``): one line, no traceback from a command."""

    one_line = True  # printed as "PROG: error: ..." where uncaught (resnmt.fairseq_patches)


def refuse_unsafe_checkpoints() -> None:
    """fairseq's checkpoint loading (fairseq-generate, the hub, resnmt-analyze) raises
    UnsafeCheckpointError naming the file and the global where torch refuses a pickle, and a
    command that does not catch it ends with that line alone (exit status 1: the
    ``one-line-errors`` patch). Applied once, by resnmt.fairseq_patches."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu

    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except pickle.UnpicklingError as e:
            reason = unsafe_checkpoint(e, path)
            if reason is None:
                raise
            raise UnsafeCheckpointError(reason) from None

    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
