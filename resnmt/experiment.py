"""The steps of one NMT experiment, each written once: train, average, decode, score, analyse.

Used by the benchmarks (``benchmarks/quality.py``: one budget per run;
``benchmarks/curves.py``: one run scored at several budgets along the way). Each step
writes its output atomically and can be re-run: training resumes from
``checkpoint_last.pt``; the other steps are skipped by their callers when the output
exists.

The external programs (``fairseq-train``, ``fairseq-generate``, ``resnmt-analyze``) run
as subprocesses whose output is appended to one log file per run; averaging and scoring
run in-process through ``resnmt.cli.average_checkpoints`` and ``resnmt.cli.evaluate``.
"""
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from resnmt.atomic import atomic_open, atomic_write_text

USER_DIR = Path(__file__).resolve().parent


class ExperimentError(RuntimeError):
    """A step failed; the message names the command and ends with the tail of its log."""


class _CommandFailed(Exception):
    """Discards a failed command's partial stdout file (raised inside ``atomic_open``)."""


@dataclass(frozen=True)
class ModelSize:
    """A Transformer size for the encoder and the decoder alike."""

    layers: int
    dim: int
    ffn: int
    heads: int

    def fairseq_flags(self) -> List[str]:
        flags = []
        for side in ("encoder", "decoder"):
            flags += [f"--{side}-layers", str(self.layers), f"--{side}-embed-dim", str(self.dim),
                      f"--{side}-ffn-embed-dim", str(self.ffn), f"--{side}-attention-heads", str(self.heads)]
        return flags

    def as_dict(self) -> Dict[str, int]:
        return {"layers": self.layers, "dim": self.dim, "ffn": self.ffn, "heads": self.heads}


# The sizes the CPU benchmarks train; the papers' sizes are the named archs (``*_base``).
SIZES = {
    "tiny": ModelSize(1, 16, 32, 2),      # tests
    "small": ModelSize(2, 128, 512, 4),   # the demo size
    "deep": ModelSize(6, 128, 512, 4),    # the demo's width at the papers' depth
    "base": ModelSize(6, 512, 2048, 8),   # transformer_wmt_en_de
}


def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON line with a single write (concurrent writers append whole lines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> List[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tool_env(threads: Optional[int] = None, cpu_only: bool = False) -> Dict[str, str]:
    """The environment for the subprocesses: this Python's scripts first on PATH, and
    ``threads`` OpenMP/MKL threads when given."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def cpu_description() -> Dict[str, str]:
    """The CPU the numbers were measured on, for the JSON records."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": "cpu", "device_name": f"{name} ({os.cpu_count()} CPUs)"}


def run_logged(cmd: Sequence, log_path: Path, env: Dict[str, str], stdout_path: Optional[Path] = None) -> None:
    """Run ``cmd``; its stderr (and stdout unless ``stdout_path``) is appended to ``log_path``.
    ``stdout_path`` is written atomically: it exists only if the command succeeded."""
    cmd = [str(c) for c in cmd]
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        if stdout_path is None:
            proc = subprocess.run(cmd, stdout=log, stderr=log, env=env)
        else:
            try:
                with atomic_open(stdout_path, "w") as out:
                    proc = subprocess.run(cmd, stdout=out, stderr=log, env=env)
                    if proc.returncode != 0:
                        raise _CommandFailed
            except _CommandFailed:
                pass
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise ExperimentError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}); log {log_path}:\n{tail}")


# ---------------------------------------------------------------------------------- train

TRAINED_STAMP = "trained_updates.json"


def trained_updates(save_dir: Path) -> int:
    """Updates reached by the last finished ``train_to`` call in ``save_dir`` (0 if none)."""
    stamp = Path(save_dir) / TRAINED_STAMP
    return json.loads(stamp.read_text())["updates"] if stamp.exists() else 0


def train_to(updates: int, train_argv: Sequence, save_dir: Path, log_path: Path, env: Dict[str, str]) -> float:
    """Train until ``updates`` updates with ``fairseq-train`` (``train_argv`` without
    ``--max-update`` and ``--save-dir``), resuming from ``save_dir/checkpoint_last.pt``.

    fairseq resumed at its ``--max-update`` would still take one more step, so a run that
    already reached ``updates`` is not started again. Returns the seconds spent."""
    if trained_updates(save_dir) >= updates:
        return 0.0
    t0 = time.time()
    run_logged([*train_argv, "--save-dir", save_dir, "--max-update", updates], log_path, env)
    seconds = time.time() - t0
    atomic_write_text(Path(save_dir) / TRAINED_STAMP, json.dumps({"updates": updates}) + "\n")
    return seconds


def benchmark_train_argv(bin_dir: Path, arch: str, flags: Sequence[str], size: ModelSize, *, seed: int,
                         max_tokens: int, lr: float, warmup: int, dropout: float, save_every: int,
                         keep: int, validate: bool) -> List[str]:
    """``fairseq-train`` for the CPU benchmarks: ``size``, the papers' optimizer (Adam
    0.9/0.98, inverse-sqrt warm-up, label smoothing 0.1, shared embeddings), a checkpoint
    every ``save_every`` updates of which the newest ``keep`` are kept, and validation at
    each epoch end when ``validate``."""
    argv = [
        "fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", arch, *flags, *size.fairseq_flags(),
        "--share-all-embeddings", "--dropout", dropout,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", warmup,
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", max_tokens, "--seed", seed,
        "--save-interval-updates", save_every, "--keep-interval-updates", keep, "--no-epoch-checkpoints",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "50", "--no-progress-bar",
    ]
    argv += [] if validate else ["--disable-validation"]
    return [str(a) for a in argv]


# ------------------------------------------------------------------------------- average

def checkpoints_until(save_dir: Path, n: int, updates: int) -> List[Path]:
    """The newest ``n`` update checkpoints (``checkpoint_E_U.pt``) with U <= ``updates``,
    oldest first. fairseq writes no ``checkpoint_E_U.pt`` when U ends an epoch; the model
    after ``updates`` is then ``checkpoint_last.pt`` (if training stopped there)."""
    from resnmt.cli.average_checkpoints import UPDATE_RE

    save_dir = Path(save_dir)
    found = sorted(
        (int(m.group(2)), p) for p in save_dir.glob("checkpoint_*_*.pt")
        if (m := UPDATE_RE.match(p.name)) and int(m.group(2)) <= updates
    )
    paths = [p for _, p in found]
    if (not found or found[-1][0] < updates) and trained_updates(save_dir) == updates:
        paths.append(save_dir / "checkpoint_last.pt")
    if len(paths) < n:
        raise ExperimentError(f"{save_dir}: {len(paths)} checkpoints up to update {updates}, {n} wanted for averaging")
    return paths[-n:]


def average(paths: Sequence[Path], output: Path) -> None:
    """``resnmt-average`` of ``paths`` into ``output`` (written atomically)."""
    from resnmt.cli.average_checkpoints import average_checkpoints, save_atomic

    save_atomic(average_checkpoints([Path(p) for p in paths]), Path(output))


# -------------------------------------------------------------------------- decode, score

def decode(bin_dir: Path, checkpoint: Path, output: Path, log_path: Path, env: Dict[str, str], *,
           subset: str = "test", beam: int = 4, lenpen: float = 0.6, batch_size: int = 128,
           max_len_a: float = 0, max_len_b: int = 200, extra: Sequence[str] = ()) -> None:
    """``fairseq-generate`` with the papers' search (beam ``beam``, GNMT length penalty
    ``lenpen``) into ``output`` (written only if decoding succeeded)."""
    run_logged(
        ["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--task", "resnmt_translation", "--path", checkpoint,
         "--gen-subset", subset, "--beam", beam, "--lenpen-form", "gnmt", "--lenpen", lenpen,
         "--batch-size", batch_size, "--num-workers", "0", "--max-len-a", max_len_a, "--max-len-b", max_len_b,
         *extra],
        log_path, env, stdout_path=output)


def score(hyp: Path, ref: Path, *, remove_bpe: str = "none", detok: str = "none", lang: Optional[str] = None,
          compound_split: bool = False) -> dict:
    """``resnmt-evaluate``'s result for a fairseq-generate output against ``ref``."""
    from resnmt.cli.evaluate import build_parser, evaluate

    argv = ["--hyp", str(hyp), "--ref", str(ref), "--remove-bpe", remove_bpe, "--detok", detok]
    argv += ["--lang", lang] if lang else []
    argv += ["--compound-split"] if compound_split else []
    return evaluate(build_parser().parse_args(argv))


def analyze(checkpoint: Path, bin_dir: Path, out_dir: Path, log_path: Path, env: Dict[str, str], *,
            split: str = "valid", num_sentences: int = 500) -> dict:
    """``resnmt-analyze`` of ``checkpoint``; returns its ``analysis.json``."""
    run_logged(["resnmt-analyze", checkpoint, "--data", bin_dir, "--split", split,
                "--num-sentences", num_sentences, "--out", out_dir, "--no-progress-bar", "--cpu"], log_path, env)
    return json.loads((Path(out_dir) / "analysis.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- fairseq log

_VALID_RE = re.compile(r"\| valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \|.*?\| num_updates (\d+)")
_TRAIN_RE = re.compile(r"\| train_inner \|.*?loss=([\d.]+).*?num_updates=(\d+)")
_PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")


@dataclass
class FairseqLog:
    """What ``fairseq-train --log-format simple`` printed: validation points
    ``(updates, loss, nll_loss)``, training-loss points ``(updates, loss)`` and the
    parameter count. A restarted run repeats no point (later lines win)."""

    valid: List[tuple]
    train: List[tuple]
    params: Optional[int]

    @classmethod
    def parse(cls, text: str) -> "FairseqLog":
        valid = {int(u): (int(u), float(loss), float(nll)) for loss, nll, u in _VALID_RE.findall(text)}
        train = {int(u): (int(u), float(loss)) for loss, u in _TRAIN_RE.findall(text)}
        params = _PARAMS_RE.findall(text)
        return cls(valid=[valid[k] for k in sorted(valid)], train=[train[k] for k in sorted(train)],
                   params=int(params[-1].replace(",", "")) if params else None)


def repo_relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when inside it (committed results hold no machine paths)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)
