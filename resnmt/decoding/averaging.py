"""Checkpoint averaging (``resnmt-average``, the pipeline and the benchmarks call it).

Floating-point tensors of ``model`` (parameters and float buffers) are averaged in
float64 and cast back to their dtype; integer and bool buffers (counters, masks)
are copied from the newest checkpoint, as is everything outside ``model`` (cfg /
args, extra_state, optimizer_history, task_state) except the optimizer state
(``last_optimizer_state``), which is dropped: the output is for decoding.
"""
import pickle
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from resnmt.atomic import atomic_open

EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
# fairseq's checkpoint of the last update: the only one a run stopped mid-epoch (--max-update) saves there
LAST = "checkpoint_last.pt"


class AverageError(Exception):
    """A refusal: printed as one line, exit status 1, nothing written."""


def numbered_checkpoints(directory: Path, by: str, upper_bound: Optional[int] = None) -> List[Tuple[int, Path]]:
    """``(number, path)`` of the epoch (``by="epoch"``: ``checkpointE.pt``) or update
    (``by="update"``: ``checkpoint_E_U.pt``, numbered by U) checkpoints in ``directory``
    numbered at most ``upper_bound``, oldest first."""
    pattern = EPOCH_RE if by == "epoch" else UPDATE_RE
    found = []
    for entry in Path(directory).iterdir() if Path(directory).is_dir() else ():
        m = pattern.match(entry.name)
        if m and entry.is_file():
            number = int(m.group(m.lastindex))  # epoch E, or update U
            if upper_bound is None or number <= upper_bound:
                found.append((number, entry))
    return sorted(found)


def checkpoint_updates(path: Path) -> int:
    """The number of updates a fairseq checkpoint was saved at (its optimizer history),
    read without loading its tensors (memory-mapped)."""
    from resnmt.training.checkpoint_compat import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(state["optimizer_history"][-1]["num_updates"])
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, KeyError, IndexError, TypeError) as e:
        raise AverageError(f"cannot read the update count of {path}: {str(e).splitlines()[0] if str(e) else e!r}") \
            from None


def with_last_checkpoint(directory: Path, paths: Sequence[Path]) -> List[Path]:
    """``paths`` (numbered checkpoints of ``directory``, oldest first) and, after them,
    ``checkpoint_last.pt`` when it was saved at a later update than the newest of them: a
    run that stopped mid-epoch (``--max-update``) saved its last update there only."""
    last = Path(directory) / LAST
    if not last.is_file():
        return list(paths)
    newest = checkpoint_updates(paths[-1]) if paths else -1
    return [*paths, last] if checkpoint_updates(last) > newest else list(paths)


def select_checkpoints(directory: Path, n: int, by: str, upper_bound: Optional[int] = None,
                       include_last: bool = False) -> List[Path]:
    """The last ``n`` epoch (``by="epoch"``) or update (``by="update"``) checkpoints, oldest
    first; with ``include_last`` (and no ``upper_bound``), checkpoint_last.pt counts as the
    newest when training stopped after the newest numbered one (``with_last_checkpoint``)."""
    if n <= 0:
        flag = "--num-epoch-checkpoints" if by == "epoch" else "--num-update-checkpoints"
        raise AverageError(f"{flag} must be a positive number of checkpoints, got {n}")
    if not directory.is_dir():
        raise AverageError(f"{directory} is not a directory (selecting by {by} needs one directory in --inputs)")
    name = "checkpointE.pt" if by == "epoch" else "checkpoint_E_U.pt"
    found = [path for _, path in numbered_checkpoints(directory, by, upper_bound)]
    if include_last and upper_bound is None:
        found = with_last_checkpoint(directory, found)
        name += f" (or {LAST})"
    bound = f" with {by} <= {upper_bound}" if upper_bound is not None else ""
    if not found:
        raise AverageError(f"no {name} checkpoints{bound} in {directory}")
    if n > len(found):
        raise AverageError(
            f"asked for the last {n} {by} checkpoints but {directory} has only {len(found)} {name} "
            f"files{bound}"
        )
    return found[-n:]


def load_checkpoint(path: Path) -> dict:
    """``torch.load`` with ``weights_only=True`` (fairseq's types allow-listed by resnmt)."""
    from resnmt.training.checkpoint_compat import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AverageError(f"cannot load {path} with weights_only=True: {first}") from None
    except (OSError, RuntimeError, EOFError) as e:
        raise AverageError(f"cannot read {path} as a torch checkpoint: {str(e).splitlines()[0]}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise AverageError(f"{path} is not a fairseq checkpoint: expected a dict with a 'model' state dict")
    return state


def average_checkpoints(paths: Sequence[Path], log=None) -> dict:
    """The newest checkpoint (``paths[-1]``) with its ``model`` averaged over ``paths``.

    Raises AverageError if the checkpoints' model keys, shapes or kinds of dtype differ.
    """
    if not paths:
        raise AverageError("no checkpoints to average")
    ref_path, ref_sig = None, None
    sums: Dict[str, torch.Tensor] = {}
    newest = None
    for i, path in enumerate(paths, 1):
        state = load_checkpoint(path)
        model = state["model"]
        sig = _signature(model)
        if ref_sig is None:
            ref_path, ref_sig = path, sig
        else:
            _check_compatible(ref_path, ref_sig, path, sig)
        for key, value in model.items():
            if torch.is_tensor(value) and value.is_floating_point():
                if key in sums:
                    sums[key].add_(value.detach().to(torch.float64))
                else:
                    sums[key] = value.detach().to(torch.float64, copy=True)
        if log:
            log(f"[{i}/{len(paths)}] loaded {path} ({len(model)} model entries)")
        if i == len(paths):
            newest = state
        del state, model
    averaged = {}
    for key, value in newest["model"].items():
        if key in sums:
            averaged[key] = sums[key].div_(len(paths)).to(value.dtype)
        else:  # integer/bool buffers and any non-tensor entries: the newest checkpoint's
            averaged[key] = value
    newest["model"] = averaged
    newest.pop("last_optimizer_state", None)
    newest["resnmt_averaged_from"] = [str(p) for p in paths]
    return newest


def _signature(model: dict) -> Dict[str, tuple]:
    """Per key: (type name, shape, is floating point, dtype name); what must agree across inputs."""
    sig = {}
    for key, value in model.items():
        if torch.is_tensor(value):
            sig[key] = ("Tensor", tuple(value.shape), value.is_floating_point(), str(value.dtype).replace("torch.", ""))
        else:
            sig[key] = (type(value).__name__, None, None, None)
    return sig


def _check_compatible(ref_path, ref_sig, path, sig) -> None:
    for key in ref_sig:
        if key not in sig:
            raise AverageError(f"{path} has no model key '{key}' (present in {ref_path})")
    for key in sig:
        if key not in ref_sig:
            raise AverageError(f"{path} has model key '{key}' that {ref_path} does not have")
    for key, (kind, shape, is_float, dtype) in sig.items():
        ref_kind, ref_shape, ref_float, ref_dtype = ref_sig[key]
        if kind != ref_kind:
            raise AverageError(f"{path}: model key '{key}' is a {kind}, expected a {ref_kind} as in {ref_path}")
        if kind != "Tensor":
            continue
        if shape != ref_shape:
            raise AverageError(f"{path}: model key '{key}' has shape {shape}, expected {ref_shape} as in {ref_path}")
        if is_float != ref_float:
            raise AverageError(
                f"{path}: model key '{key}' has dtype {dtype}, expected a "
                f"{'floating-point' if ref_float else 'non-floating-point'} dtype like {ref_path}'s {ref_dtype}"
            )


def save_atomic(state: dict, output: Path) -> None:
    """``torch.save`` to ``output`` atomically (flushed to disk before the rename)."""
    with atomic_open(output, "wb", fsync=True) as f:
        torch.save(state, f)
