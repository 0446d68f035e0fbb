"""The steps of an experiment, one function each: ``prepare``, ``train`` (a planned
``fairseq-train`` run, resumed from checkpoint_last.pt), ``average``, ``decode``
(``fairseq-generate`` with the papers' search), ``score``, ``analyze``; and
``FairseqLog``, the one reader of what ``fairseq-train`` printed.

Each step writes its output atomically. External programs run as subprocesses
(``resnmt.experiment.runtime``); averaging and scoring run in-process
(``resnmt.checkpoints.averaging``, ``resnmt.decoding.scoring``).
"""
import codecs
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from resnmt.atomic import atomic_open
from resnmt.experiment.errors import ExperimentError, Log
from resnmt.experiment.presets import TrainPlan
from resnmt.experiment.runtime import USER_DIR, run_logged, tool_env
from resnmt.progress import format_seconds

# ------------------------------------------------------------------------------ prepare


def is_prepared(data_root: Path, tgt: str) -> bool:
    """The binarized data and the raw references are there, and the last resnmt-prepare run on
    ``data_root`` finished (``resnmt.data.pipeline.finished``)."""
    from resnmt.data.pipeline import finished

    return (Path(data_root) / "bin" / f"dict.{tgt}.txt").exists() and \
        (Path(data_root) / "raw" / f"test.{tgt}").exists() and finished(data_root)


def changed_inputs(data_root: Path, mirror: Optional[Path], log: Log) -> List[str]:
    """One line per input of the prepared ``data_root`` changed since it was prepared, read
    from ``mirror`` where given (``resnmt.data.pipeline.changed_inputs``)."""
    from resnmt.data.pipeline import changed_inputs
    from resnmt.data.textproc import DataPrepError

    try:
        return changed_inputs(data_root, mirror, log)
    except DataPrepError as e:
        raise ExperimentError(f"cannot tell whether {data_root} is up to date: {e}") from None


def prepare(name: str, data_root: Path, mirror: Optional[Path] = None, options: Sequence[str] = ()) -> None:
    """``resnmt-prepare NAME [--mirror DIR] OPTIONS DATA_ROOT``, its messages passed on to
    stderr as they come (progress bars too); when it fails, the ExperimentError repeats its
    error line, so that the last line printed names the cause."""
    cmd = [str(c) for c in ["resnmt-prepare", name, *(["--mirror", mirror] if mirror else []), *options, data_root]]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=tool_env())
    decoder, tail = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    for chunk in iter(lambda: os.read(proc.stderr.fileno(), 1 << 16), b""):
        text = decoder.decode(chunk)
        sys.stderr.write(text)
        sys.stderr.flush()
        tail = (tail + text)[-8192:]
    proc.stderr.close()
    if proc.wait() != 0:
        errors = re.findall(r"^\[prepare-[\w-]+\] error: (.*)$", tail, re.MULTILINE)
        raise ExperimentError(f"resnmt-prepare {name} failed: {errors[-1]}" if errors
                              else f"resnmt-prepare {name} failed (exit {proc.returncode})")

# ------------------------------------------------------------- outputs newer than inputs


def up_to_date(output: Path, inputs: Sequence[Path], log: Log) -> bool:
    """True when ``output`` exists and no input is newer; else False, with a line naming
    the newer input where the output exists (it is made again)."""
    if not output.exists():
        return False
    newer = [p for p in inputs if Path(p).stat().st_mtime_ns > output.stat().st_mtime_ns]
    if newer:
        log(f"{newer[0]} is newer than {output}: making it again")
    return not newer


def data_stamp(bin_dir: Path) -> Dict[str, list]:
    """The binarized data's files with their size, mtime and sha256 (what a training used)."""
    from resnmt.data.fetch import sha256_of

    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns, sha256_of(p)]
            for p in sorted(Path(bin_dir).iterdir()) if p.is_file()}


def data_changes(before: Dict[str, list], bin_dir: Path) -> tuple:
    """(the files of ``bin_dir`` whose bytes differ from those of the data stamp ``before``,
    its stamp now): a file's sha256 is computed only where its size or mtime differ, so
    nothing is read when nothing changed; a file with a new mtime and the same bytes keeps
    its place in the stamp now with its new mtime. A stamp without sha256 (written before
    they were recorded) counts any other mtime as a change."""
    from resnmt.data.fetch import compare_bytes

    files = {p.name: p for p in sorted(Path(bin_dir).iterdir()) if p.is_file()}
    now = {name: [p.stat().st_size, p.stat().st_mtime_ns] for name, p in files.items()}
    changed = []
    for name in sorted(set(before) | set(now)):
        was, stat = before.get(name), now.get(name)
        if was is None or stat is None:
            changed.append(name)
        elif compare_bytes(files[name], files[name].stat(), *was[:2], was[2] if len(was) > 2 else None) == "changed":
            changed.append(name)
        else:  # the same bytes: recorded with its mtime now
            stat.extend(was[2:])
    return changed, now


def flag_changes(before: Sequence[str], now: Sequence[str]) -> tuple:
    """The flags (with their values) of one command line that the other lacks, as two
    strings; those that do not change what is trained (RUN_ONLY_FLAGS) left out."""
    def flags(cmd):
        out, cmd = set(), list(cmd)
        for i, word in enumerate(cmd):
            if word.startswith("--") and word not in RUN_ONLY_FLAGS:
                value = cmd[i + 1] if i + 1 < len(cmd) and not cmd[i + 1].startswith("--") else ""
                out.add(f"{word} {value}".strip())
        return out

    old, new = flags(before), flags(now)
    return " ".join(sorted(old - new)), " ".join(sorted(new - old))


# flags of a training command that say where resnmt is installed, where the run is kept
# (the directory holding train.done) and how it logs, not what it trains
RUN_ONLY_FLAGS = ("--user-dir", "--save-dir", "--num-workers", "--no-progress-bar", "--log-format", "--log-interval",
                  "--log-file", "--tensorboard-logdir", "--wandb-project")

# -------------------------------------------------------------------------------- train


def repair_checkpoint_last(save_dir: Path, log: Log) -> None:
    """fairseq writes checkpointN.pt atomically but then *copies* it to checkpoint_last.pt;
    a run killed during the copy leaves a truncated checkpoint_last.pt that stops every
    restart. Replace it by the newest complete checkpoint and keep the broken file aside."""
    from resnmt.checkpoints.averaging import checkpoint_complete

    last = Path(save_dir) / "checkpoint_last.pt"
    if not last.exists() or checkpoint_complete(last):
        return
    numbered = sorted((p for p in Path(save_dir).glob("checkpoint[0-9]*.pt")), key=lambda p: p.stat().st_mtime)
    broken = last.with_name(last.name + ".broken")
    last.replace(broken)
    if numbered and checkpoint_complete(numbered[-1]):
        with atomic_open(last, "wb") as out, open(numbered[-1], "rb") as src:
            shutil.copyfileobj(src, out)
        log(f"warning: {last} was incomplete (a run killed while fairseq copied it); kept as {broken}, "
            f"replaced by {numbered[-1]}")
    else:
        log(f"warning: {last} was incomplete and no other complete checkpoint exists; kept as {broken}, "
            "training starts from scratch")


def train(plan: TrainPlan, log: Log, threads: Optional[int] = None, label: str = "", verbose: bool = True) -> None:
    """Run ``plan.cmd`` (resuming from checkpoint_last.pt), its output on stdout (each line
    after ``label``, which tells concurrent runs apart; without ``verbose``, only the
    numbers of its epochs, validations and logged updates, ``progress_of``) and appended to SAVE_DIR/train.log in full, the command
    to SAVE_DIR/train.cmd; ``threads``: its torch threads (None: torch's default)."""
    from resnmt.training.quiet import FairseqNoise

    save_dir = plan.save_dir
    save_dir.mkdir(parents=True, exist_ok=True)
    repair_checkpoint_last(save_dir, log)
    last = save_dir / "checkpoint_last.pt"
    if last.exists():
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.stat().st_mtime))
        log(f"resuming from {last} (written {written})")
    else:
        log(f"starting a new run in {save_dir}")
    cmd_text = shlex.join(plan.cmd)
    cmd_file = save_dir / "train.cmd"
    if cmd_file.exists() and cmd_file.read_text().splitlines()[-1:] != [cmd_text]:
        log(f"warning: this command differs from the last one used in {save_dir} (see {cmd_file})")
    with open(cmd_file, "a", encoding="utf-8") as f:
        f.write(cmd_text + "\n")
    log(f"running: {cmd_text}")
    start = time.time()
    # fairseq's own output, appended to SAVE_DIR/train.log as well (all restarts in one file)
    with open(save_dir / "train.log", "ab") as train_log:
        proc = subprocess.Popen(plan.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=tool_env(threads))
        prefix, noise = label.encode(), FairseqNoise()
        for line in iter(proc.stdout.readline, b""):
            shown = line if verbose else progress_of(line.decode(errors="replace"), noise)
            if shown:
                sys.stdout.buffer.write(prefix + shown)
                sys.stdout.flush()
            train_log.write(line)
            train_log.flush()
        returncode = proc.wait()
    if returncode != 0:
        raise ExperimentError(f"{Path(plan.cmd[0]).name} failed (exit {returncode}); its output: {save_dir}/train.log")
    log(f"done in {format_seconds(time.time() - start)}: {save_dir}")

def progress_of(line: str, noise) -> Optional[bytes]:
    """What the training step prints of a line of fairseq-train's without ``verbose``: an
    epoch's, a validation's or a logged update's numbers, or the checkpoint a resumed run
    loaded, on a short line of its own; every
    other INFO line, and ``noise``'s dumps (resnmt.training.quiet.FairseqNoise), nothing; any
    other line (a warning, an error) as it is."""
    from resnmt.training.quiet import is_info_line

    if not noise.keep(line):
        return None
    epoch, valid, inner = _EPOCH_RE.search(line), _VALID_RE.search(line), _TRAIN_RE.search(line)
    loaded = _LOADED_RE.search(line)
    if loaded:
        text = f"loaded {loaded.group(1)} ({loaded.group(2)}): training goes on from there"
    elif epoch:
        text = f"epoch {int(epoch.group(1))}: train loss {epoch.group(2)}, {epoch.group(3)} updates"
    elif valid:
        text = f"valid loss {valid.group(1)} (nll_loss {valid.group(2)}) after {valid.group(3)} updates"
    elif inner:
        text = f"update {inner.group(2)}: train loss {inner.group(1)}"
    else:
        return None if is_info_line(line) else line.encode()
    return f"[train] {text}\n".encode()

# ------------------------------------------------------------------------------ average


def average(paths: Sequence[Path], output: Path) -> None:
    """The average of the checkpoints ``paths`` into ``output`` (written atomically)."""
    from resnmt.checkpoints.averaging import average_checkpoints, save_atomic

    save_atomic(average_checkpoints([Path(p) for p in paths]), Path(output))

# ------------------------------------------------------------------------ decode, score


def decode(bin_dir: Path, checkpoint: Path, output: Path, log_path: Optional[Path], env: Optional[Dict[str, str]], *,
           subset: str = "test", beam: int = 4, lenpen: float = 0.6, batch_size: int = 128,
           max_len_a: float = 0, max_len_b: int = 200, extra: Sequence[str] = (), verbose: bool = True) -> None:
    """``fairseq-generate`` with the papers' search (beam ``beam``, GNMT length penalty
    ``lenpen``) into ``output`` (written only if decoding succeeded), fairseq's own BLEU line
    labelled as not the papers' score (resnmt.decoding.token_bleu); ``extra`` flags last;
    without ``verbose`` and ``log_path``, its messages without fairseq's configuration dump."""
    run_logged(
        ["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--task", "resnmt_translation", "--path", checkpoint,
         "--gen-subset", subset, "--beam", beam, "--lenpen-form", "gnmt", "--lenpen", lenpen,
         "--batch-size", batch_size, "--num-workers", "0", "--max-len-a", max_len_a, "--max-len-b", max_len_b,
         "--scoring", "token_bleu", *extra],
        log_path, env, stdout_path=output, quiet=not verbose)


def score(hyp: Path, ref: Path, *, remove_bpe: str = "none", detok: str = "none", lang: Optional[str] = None,
          compound_split: bool = False) -> dict:
    """resnmt-evaluate's result (``resnmt.decoding.scoring.score_files``) for a fairseq-generate
    output against ``ref``."""
    from resnmt.decoding.scoring import score_files

    return score_files(hyp, ref, remove_bpe=remove_bpe, detok=detok, lang=lang, compound_split=compound_split)


def analyze(checkpoint: Path, bin_dir: Path, out_dir: Path, log_path: Optional[Path], env: Optional[Dict[str, str]],
            *, split: str = "valid", num_sentences: Optional[int] = 500) -> dict:
    """``resnmt-analyze`` of ``checkpoint`` on the CPU (``num_sentences`` of ``split``; None:
    resnmt-analyze's default) into ``out_dir``; returns its ``analysis.json``."""
    cmd = ["resnmt-analyze", checkpoint, "--data", bin_dir, "--split", split, "--out", out_dir, "--no-progress-bar",
           "--cpu", *(["--num-sentences", num_sentences] if num_sentences is not None else [])]
    run_logged(cmd, log_path, env)
    return json.loads((Path(out_dir) / "analysis.json").read_text(encoding="utf-8"))

# --------------------------------------------------------------------------- fairseq log


_VALID_RE = re.compile(r"\| valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \|.*?\| num_updates (\d+)")
_TRAIN_RE = re.compile(r"\| train_inner \|.*?loss=([\d.]+).*?num_updates=(\d+)")
_EPOCH_RE = re.compile(r"\| train \| epoch (\d+) \| loss ([\d.]+) \|.*?\| num_updates (\d+)")
_PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
_DONE_RE = re.compile(r"done training in ([\d.]+) seconds")
_INNER_RE = re.compile(r"\| train_inner \| (.*)")
_LOADED_RE = re.compile(r"\| Loaded checkpoint (\S+) \((epoch \d+ @ \d+ updates)\)")
_FIELD_RE = re.compile(r"(\w+)=([^,\s]+)")
_OVERFLOW_RE = re.compile(r"gradient overflow detected, ignoring gradient, setting loss scale to: ([\d.e+-]+)")
_MIN_SCALE_RE = re.compile(r"Minimum loss scale reached")


@dataclass
class FairseqLog:
    """What ``fairseq-train --log-format simple`` printed: validation points
    ``(updates, loss, nll_loss)``, training-loss points ``(updates, loss)``, end-of-epoch
    points ``(epoch, updates, loss)``, the parameter count and the seconds of all finished
    runs. A restarted run repeats no point (later lines win). Also every ``train_inner``
    line's fields as logged (``inner``; ``--log-format json`` lines too), and for
    ``--fp16`` the loss scale after each update skipped for overflowing gradients and
    whether the scale reached its minimum (which stops the run)."""

    valid: List[tuple]
    train: List[tuple]
    epochs: List[tuple] = field(default_factory=list)
    params: Optional[int] = None
    train_seconds: float = 0.0
    inner: List[dict] = field(default_factory=list)
    overflow_scales: List[float] = field(default_factory=list)
    min_scale_reached: bool = False

    @classmethod
    def parse(cls, text: str) -> "FairseqLog":
        valid = {int(u): (int(u), float(loss), float(nll)) for loss, nll, u in _VALID_RE.findall(text)}
        train = {int(u): (int(u), float(loss)) for loss, u in _TRAIN_RE.findall(text)}
        epochs = {int(e): (int(e), int(u), float(loss)) for e, loss, u in _EPOCH_RE.findall(text)}
        params = _PARAMS_RE.findall(text)
        return cls(valid=[valid[k] for k in sorted(valid)], train=[train[k] for k in sorted(train)],
                   epochs=[epochs[k] for k in sorted(epochs)],
                   params=int(params[-1].replace(",", "")) if params else None,
                   train_seconds=round(sum(float(s) for s in _DONE_RE.findall(text)), 1),
                   inner=[json.loads(rest) if rest.startswith("{") else dict(_FIELD_RE.findall(rest))
                          for rest in _INNER_RE.findall(text)],
                   overflow_scales=[float(s) for s in _OVERFLOW_RE.findall(text)],
                   min_scale_reached=bool(_MIN_SCALE_RE.search(text)))

    @classmethod
    def read(cls, path: Path) -> "FairseqLog":
        return cls.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
