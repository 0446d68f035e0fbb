"""Checkpoint averaging (``resnmt-average``, the pipeline and the benchmarks call it).

Floating-point tensors of ``model`` (parameters and float buffers) are averaged in
float64 and cast back to their dtype; integer and bool buffers (counters, masks)
are copied from the newest checkpoint, as is everything outside ``model`` (cfg /
args, extra_state, optimizer_history, task_state) except the optimizer state
(``last_optimizer_state``), which is dropped: the output is for decoding.

``read_checkpoint`` is the one reader of the files (a file that is not a checkpoint is one
line naming it and what is wrong); ``select_checkpoints`` chooses the last N epoch or
update checkpoints of a directory for ``resnmt-average`` and ``resnmt-experiment`` alike
(all there are when fewer, checkpoint_last.pt when it is newer), and says what it could
not give (``Selection.notes``).
"""
import re
import warnings
import zipfile
from dataclasses import dataclass
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


# ------------------------------------------------------------------------ reading files

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6 is a zip archive
PICKLE_PROTO = 0x80  # the first byte of a pickle (torch.save's legacy format)


def _zip_problem(path: Path) -> Optional[str]:
    """What keeps ``path`` from being a complete torch zip archive (None: nothing); reads
    only the archive's directory (at its end), not the tensors."""
    try:
        with zipfile.ZipFile(path) as z:
            if any(name.endswith("data.pkl") for name in z.namelist()):
                return None
            return "it is a zip archive without data.pkl, not one torch.save wrote"
    except (OSError, zipfile.BadZipFile):
        return "its zip archive is incomplete (cut short while it was saved or copied)"


def checkpoint_complete(path: Path) -> bool:
    """A complete torch zip file (its central directory, at the end, is intact)."""
    return _zip_problem(path) is None


def _file_problem(path: Path) -> Optional[str]:
    """Why ``path`` cannot be a file torch.save wrote, seen from its first bytes (None: it may be)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        return e.strerror or type(e).__name__
    if not head:
        return "the file is empty (0 bytes)"
    if head.startswith(ZIP_MAGIC):
        return _zip_problem(path)
    if head[0] == PICKLE_PROTO:
        return None
    text = head.decode("utf-8", errors="replace")  # a character cut at byte 64 is one U+FFFD at the end
    if all(c.isprintable() or c.isspace() for c in text.rstrip("\ufffd")):
        return f"it is a text file (starting {text.split(chr(10))[0][:30]!r}), not one torch.save wrote"
    return "it is neither a zip archive (torch.save's format) nor a pickle"


def _load_error(e: Exception) -> str:
    """The one line that says why torch.load failed (its weights_only refusal is a page)."""
    text = str(e)
    if "WeightsUnpickler error:" in text:  # the essay about weights_only around the reason
        reason = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation")[0]
        reason = " ".join(reason.split()).split(". ")[0].rstrip(".")
        return f"torch.load(weights_only=True) refused it: {reason}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"torch.load failed: {first}" if first else f"torch.load failed ({type(e).__name__})"


def read_checkpoint(path: Path, mmap: bool = False) -> dict:
    """A fairseq checkpoint (a dict with a ``model`` state dict), loaded with
    ``torch.load(weights_only=True)`` (fairseq's types allow-listed by resnmt); ``mmap``:
    its tensors memory-mapped, not read (a zip checkpoint). Anything else is an AverageError
    naming the file and what is wrong with it, on one line."""
    from resnmt import fairseq_patches
    from resnmt.checkpoints.compat import unsafe_checkpoint

    path = Path(path)
    problem = _file_problem(path)
    if problem:
        raise AverageError(f"{path} is not a checkpoint: {problem}")
    fairseq_patches.apply("safe-checkpoint-globals")  # done when torch was loaded, unless resnmt was imported after
    zipped = checkpoint_complete(path)
    try:
        with warnings.catch_warnings():  # a plain pickle's protocol: the error below says what is wrong
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipped)
    except Exception as e:  # torch.load's errors are of every kind (KeyError, OSError, RuntimeError ...)
        raise AverageError(unsafe_checkpoint(e, path) or f"{path} is not a checkpoint: {_load_error(e)}") from None
    if not isinstance(state, dict):
        raise AverageError(f"{path} is not a fairseq checkpoint: it holds a {type(state).__name__}, not a dict "
                           "with a 'model' state dict")
    if not isinstance(state.get("model"), dict):
        what = "it has no 'model'" if "model" not in state else \
            f"its 'model' is of type {type(state['model']).__name__}"
        raise AverageError(f"{path} is not a fairseq checkpoint: {what}, not a state dict")
    return state


def updates_of(state: dict) -> Optional[int]:
    """The number of updates a loaded checkpoint was saved at (its optimizer history), or
    None when it has none (not saved by fairseq-train)."""
    try:
        return int(state["optimizer_history"][-1]["num_updates"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def checkpoint_updates(path: Path) -> Optional[int]:
    """The number of updates a fairseq checkpoint was saved at, read without loading its
    tensors (memory-mapped); None when it has no optimizer history. AverageError when
    ``path`` is not a checkpoint."""
    return updates_of(read_checkpoint(path, mmap=True))


def describe(path: Path, updates: Optional[int]) -> str:
    """'checkpoint3.pt (update 60)'."""
    return f"{Path(path).name} (update {'unknown' if updates is None else updates})"

# ---------------------------------------------------------------------- choosing files


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


NAMES = {"epoch": "checkpointE.pt", "update": "checkpoint_E_U.pt"}


@dataclass
class Selection:
    """The checkpoints of a directory chosen for averaging (``select_checkpoints``), and
    what the choice could not give: fewer than asked, a newer checkpoint_last.pt left out."""

    directory: Path
    by: str  # "epoch" or "update"
    asked: int
    paths: List[Path]  # oldest first
    updates: List[Optional[int]]  # each one's update
    available: int  # the checkpoints there were to choose from
    with_last: bool  # checkpoint_last.pt is the newest of paths
    newer_last: Optional[int] = None  # the update of a newer checkpoint_last.pt not among paths

    @property
    def kind(self) -> str:
        """'epoch', 'update', 'epoch+last' or 'update+last'."""
        return self.by + ("+last" if self.with_last else "")

    def notes(self, flag: str, last_flag: Optional[str] = None) -> List[str]:
        """What the choice could not give, one line each: ``flag`` asked for more checkpoints
        than there were (those there were are averaged); a newer checkpoint_last.pt was left
        out, ``last_flag`` the option that takes it."""
        notes = []
        if len(self.paths) < self.asked:
            held = f"{self.available - self.with_last} {NAMES[self.by]} file(s)" + \
                (f" and a newer {LAST}" if self.with_last else "")
            notes.append(f"{flag} {self.asked}: {self.directory} holds {held}, fewer than asked: all "
                         f"{len(self.paths)} are averaged")
        if self.newer_last is not None and last_flag:
            notes.append(f"{self.directory / LAST} (update {self.newer_last}) is newer than the newest checkpoint "
                         f"averaged, {describe(self.paths[-1], self.updates[-1])}, and was left out: {last_flag} "
                         "averages it as the newest")
        return notes


def _newer_last(directory: Path, newest: Optional[int]) -> Optional[int]:
    """The update of ``directory``'s checkpoint_last.pt when it was saved after update
    ``newest`` (None: it was not, there is none, or it cannot be read)."""
    last = Path(directory) / LAST
    if not last.is_file():
        return None
    updates = checkpoint_updates(last)
    return updates if updates is not None and updates > (-1 if newest is None else newest) else None


def select_checkpoints(directory: Path, n: int, by: str, upper_bound: Optional[int] = None,
                       include_last: bool = False) -> Selection:
    """The last ``n`` epoch (``by="epoch"``) or update (``by="update"``) checkpoints of
    ``directory``, oldest first, or all there are when fewer (``Selection.notes`` says so).
    checkpoint_last.pt counts as the newest when it was saved at a later update than the
    newest numbered one (a run stopped mid-epoch by --max-update saved its last update there
    only): with ``include_last`` (and no ``upper_bound``) it is taken, else the selection
    records that it was left out. AverageError when there is nothing to average."""
    if n <= 0:
        flag = "--num-epoch-checkpoints" if by == "epoch" else "--num-update-checkpoints"
        raise AverageError(f"{flag} must be a positive number of checkpoints, got {n}")
    if not directory.is_dir():
        raise AverageError(f"{directory} is not a directory (selecting by {by} needs one directory in --inputs)")
    found = [path for _, path in numbered_checkpoints(directory, by, upper_bound)]
    newest = checkpoint_updates(found[-1]) if found else None
    newer_last = None
    if upper_bound is None:
        try:
            newer_last = _newer_last(directory, newest)
        except AverageError:
            if include_last:  # asked for: its problem is the error
                raise
    with_last = include_last and newer_last is not None
    if with_last:
        found.append(directory / LAST)
    if not found:
        other = "update" if by == "epoch" else "epoch"
        hint = (f" (it holds {len(numbered_checkpoints(directory, other))} {NAMES[other]} file(s): "
                f"--num-{other}-checkpoints averages those)" if numbered_checkpoints(directory, other)
                else f" (only {LAST}: --include-last averages it)" if newer_last is not None else "")
        bound = f" with {by} <= {upper_bound}" if upper_bound is not None else ""
        raise AverageError(f"no {NAMES[by]} checkpoints{bound} in {directory}{hint}")
    paths = found[-n:]
    updates = [checkpoint_updates(p) for p in paths[:-1]] + [newer_last if with_last else newest]
    return Selection(directory, by, n, paths, updates, len(found), with_last,
                     None if with_last else newer_last)


def average_checkpoints(paths: Sequence[Path], log=None) -> dict:
    """The newest checkpoint (``paths[-1]``) with its ``model`` averaged over ``paths``.

    Raises AverageError if the checkpoints' model keys, shapes or kinds of dtype differ.
    """
    if not paths:
        raise AverageError("no checkpoints to average")
    ref_path, ref_sig = None, None
    sums: Dict[str, torch.Tensor] = {}
    newest, updates = None, []
    for i, path in enumerate(paths, 1):
        state = read_checkpoint(path)
        updates.append(updates_of(state))
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
            log(f"[{i}/{len(paths)}] loaded {path}: update {'unknown' if updates[-1] is None else updates[-1]}, "
                f"{len(model)} model entries")
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
    newest["resnmt_averaged_updates"] = updates
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
