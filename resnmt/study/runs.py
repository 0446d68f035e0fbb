"""Training to a budget and scoring, as the study's protocol runs it: fairseq-train's command
line for a study run, training until an update count and resuming (with the seconds trained
over every call), the checkpoints at a budget, and their average decoded and scored
(resnmt's steps).
"""
import json
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from resnmt.atomic import atomic_write_text
from resnmt.checkpoints.averaging import numbered_checkpoints
from resnmt.experiment import steps
from resnmt.experiment.errors import ExperimentError
from resnmt.experiment.presets import ModelSize
from resnmt.experiment.runtime import USER_DIR, run_logged


def benchmark_train_argv(bin_dir: Path, arch: str, flags: Sequence[str], size: ModelSize, *, seed: int,
                         max_tokens: int, lr: float, warmup: int, dropout: float, save_every: int,
                         keep: int, validate: bool, program: Sequence[str] = ("fairseq-train",)) -> List[str]:
    """``fairseq-train`` for the CPU benchmarks: ``size``, the papers' optimizer (Adam
    0.9/0.98, inverse-sqrt warm-up, label smoothing 0.1, shared embeddings), a checkpoint
    every ``save_every`` updates of which the newest ``keep`` are kept, and validation at
    each epoch end when ``validate``. A row's ``flags`` come last, so a row may also
    override a shared setting (argparse keeps the last value). ``program``: the trainer's
    command (e.g. resnmt-train's module, for bf16 off TPUs)."""
    argv = [
        *program, bin_dir, "--user-dir", USER_DIR, "--arch", arch, *size.fairseq_flags(),
        "--share-all-embeddings", "--dropout", dropout,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", warmup,
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", max_tokens, "--seed", seed,
        "--save-interval-updates", save_every, "--keep-interval-updates", keep, "--no-epoch-checkpoints",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "50", "--no-progress-bar",
    ]
    argv += [] if validate else ["--disable-validation"]
    return [str(a) for a in [*argv, *flags]]


# What ``train_to`` has done in a save_dir: {"updates": U, "seconds": S}, plus "started"
# (a time stamp) while a call is training.
TRAINED_STAMP = "trained_updates.json"


def _trained_stamp(save_dir: Path) -> dict:
    stamp = Path(save_dir) / TRAINED_STAMP
    return json.loads(stamp.read_text()) if stamp.exists() else {}


def trained_updates(save_dir: Path) -> int:
    """Updates reached by the last finished ``train_to`` call in ``save_dir`` (0 if none)."""
    return _trained_stamp(save_dir).get("updates", 0)


def trained_seconds(save_dir: Path) -> float:
    """Seconds ``train_to`` has trained the model in ``save_dir``, over all its calls.

    A call stopped mid-way (a killed job) counts up to the newest
    ``checkpoint_last.pt``, the one the next call resumes from: the updates after it are
    trained again and counted then."""
    stamp = _trained_stamp(save_dir)
    seconds = stamp.get("seconds", 0.0)
    last = Path(save_dir) / "checkpoint_last.pt"
    if "started" in stamp and last.exists():
        seconds += max(0.0, last.stat().st_mtime - stamp["started"])
    return seconds


def train_to(updates: int, train_argv: Sequence, save_dir: Path, log_path: Path, env: Dict[str, str]) -> float:
    """Train until ``updates`` updates with ``fairseq-train`` (``train_argv`` without
    ``--max-update`` and ``--save-dir``), resuming from ``save_dir/checkpoint_last.pt``.

    fairseq resumed at its ``--max-update`` would still take one more step, so a run that
    already reached ``updates`` is not started again. Returns ``trained_seconds``: the
    seconds the model has trained in all, this call and every earlier one included."""
    save_dir = Path(save_dir)
    if trained_updates(save_dir) >= updates:
        return trained_seconds(save_dir)
    before = {"updates": trained_updates(save_dir), "seconds": trained_seconds(save_dir)}
    save_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    atomic_write_text(save_dir / TRAINED_STAMP, json.dumps({**before, "started": started}) + "\n")
    run_logged([*train_argv, "--save-dir", save_dir, "--max-update", updates], log_path, env)
    seconds = before["seconds"] + time.time() - started
    atomic_write_text(save_dir / TRAINED_STAMP, json.dumps({"updates": updates, "seconds": seconds}) + "\n")
    return seconds


def average_and_score(checkpoints: Sequence[Path], avg: Path, gen: Path, bin_dir: Path, ref: Path,
                      log_path: Path, env: Dict[str, str], *, remove_bpe: str, **decode) -> Tuple[dict, float]:
    """The model averaged from ``checkpoints`` (into ``avg``), the test set decoded into
    ``gen`` with the papers' search (``decode``: more of ``steps.decode``'s options) and
    scored against ``ref``: (resnmt-evaluate's result, the seconds decoding took)."""
    steps.average(checkpoints, avg)
    started = time.time()
    steps.decode(bin_dir, avg, gen, log_path, env, **decode)
    seconds = time.time() - started
    return steps.score(gen, ref, remove_bpe=remove_bpe), seconds


def checkpoints_until(save_dir: Path, n: int, updates: int) -> List[Path]:
    """The newest ``n`` update checkpoints (``checkpoint_E_U.pt``) with U <= ``updates``,
    oldest first (``resnmt-average --num-update-checkpoints``'s selection). fairseq writes
    no ``checkpoint_E_U.pt`` when U ends an epoch; the model after ``updates`` is then
    ``checkpoint_last.pt`` (if training stopped there)."""
    save_dir = Path(save_dir)
    found = numbered_checkpoints(save_dir, "update", updates)
    paths = [p for _, p in found]
    if (not found or found[-1][0] < updates) and trained_updates(save_dir) == updates:
        paths.append(save_dir / "checkpoint_last.pt")
    if len(paths) < n:
        raise ExperimentError(f"{save_dir}: {len(paths)} checkpoints up to update {updates}, {n} wanted for averaging")
    return paths[-n:]
