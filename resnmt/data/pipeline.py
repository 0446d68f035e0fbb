"""The runner of data preparation: a dataset's steps on OUTDIR, in order, each skipped when
it finished before, resumed after an interruption, and refused when an option that changes
its output changed since.

The steps are the fetch step (``resnmt.data.fetch``: the published files, verified) and
the processing steps (``resnmt.data.process``: unpack or extract, tokenize, learn and apply
subwords, clean, binarize); this module chooses which a dataset needs, holds OUTDIR's lock,
and stamps each finished step.

OUTDIR layout: orig/ (published files), raw/ (valid/test text as published), work/
(intermediate, removed after success unless --keep-work), bpe/ or spm/ (subword model),
text/ (segmented text), bin/ (fairseq data), prepared.json (the manifest,
resnmt.data.manifest), .stamps/ (config, inputs + NN-STEP.done), .lock.
An input whose bytes changed since the fetch step recorded them redoes every step;
``changed_inputs`` tells a user of OUTDIR (resnmt-experiment) whether one did, cheaply.
"""
import contextlib
import fcntl
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from resnmt.atomic import atomic_write_text
from resnmt.data.fetch import Fetch, input_changes, read_record
from resnmt.data.process import SPLITS, Processing
from resnmt.data.textproc import DataPrepError
from resnmt.progress import format_seconds


# every dataset's last step: its stamp says that OUTDIR's last run finished
LAST_STEP = "binarize"


class Interrupted(BaseException):
    """SIGTERM: unwinds like KeyboardInterrupt, so temporary outputs are removed."""


@dataclass(frozen=True)
class Step:
    id: str
    description: str
    run: Callable[[], None]
    outputs: tuple = ()  # paths relative to OUTDIR that must still exist for the step to count as done
    reads_work: bool = False  # needs OUTDIR/work, removed after a complete run


class Preparation:
    """One run of a dataset's steps on OUTDIR, holding its lock."""

    def __init__(self, ds, args, tag: str):
        self.ds, self.args, self.tag = ds, args, tag
        self.out = Path(args.outdir).absolute()
        self.orig, self.work, self.stamps = self.out / "orig", self.out / "work", self.out / ".stamps"
        # the options that change the output, in the order of their stamp, each with the
        # first step whose output it changes
        self.config = [("bpe", args.bpe, "learn")] if len(ds.subword_methods) > 1 else []
        self.config += [("bpe-size", args.bpe_size, "learn"), ("spm-type", args.spm_type, "learn")]
        self.config += [("max-len", args.max_len, "clean")] if ds.max_len is not None else []
        self.config += [("ratio", args.ratio, "clean")] if ds.ratio is not None else []
        self.config += ([("max-train-lines", args.max_train_lines, "tokenize" if ds.archives else "unpack")]
                        if ds.max_train_lines else [])
        # resnmt-prepare custom: the input files, as their --train/--valid/--test PREFIX
        self.config += [(f.name.split(".")[0], f.local[:-len(ds.src) - 1], "fetch") for f in ds.files
                        if f.local and f.name.endswith(f".{ds.src}")]
        self.fetch = Fetch(ds, args, self.orig, self.log)
        self.process = Processing(ds, args, self.out, self.config, self.log)

    def log(self, msg: str) -> None:
        print(f"[{self.tag}] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ setup

    @contextlib.contextmanager
    def locked(self):
        """Create OUTDIR, hold its lock, check the option stamp and --checksums, remove a
        killed run's temporaries."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            lock = open(self.out / ".lock", "a")  # not "w": a run with nothing to do writes nothing
        except OSError as e:
            raise DataPrepError(f"cannot create OUTDIR {self.out}: {e.strerror}") from None
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DataPrepError(f"another prepare run is using {self.out} (lock {self.out / '.lock'})") from None
            for d in (self.orig, self.stamps):
                d.mkdir(exist_ok=True)
            for leftover in self.out.glob(".tmp.*"):
                shutil.rmtree(leftover, ignore_errors=True)
            for leftover in [*self.out.glob("*/*.tmp"), *self.out.glob("*/*/*.tmp")]:
                leftover.unlink()
            self.check_config()
            self.fetch.read_checksums()
            yield

    def check_config(self) -> None:
        """The options' stamp: written on the first run; options changed since are taken
        when no step they change has finished yet (a run that failed there, re-run with
        the option its error named), else refused."""
        config = "".join(f"{name}={value}\n" for name, value, _ in self.config)
        stamp = self.stamps / "config"
        if stamp.exists():
            before = stamp.read_text().strip("\n").split("\n")
            now = config.strip("\n").split("\n")
            if before != now:
                changes = [f"  before: --{x}" for x in before if x not in now] + \
                          [f"  now:    --{x}" for x in now if x not in before]
                summary = ", ".join([f"--{x} before" for x in before if x not in now] +
                                    [f"--{x} now" for x in now if x not in before])
                steps = self.steps()
                first = {step.id: i for i, step in enumerate(steps, 1)}
                changed = {line.partition("=")[0] for line in set(before) ^ set(now)}
                # an option this resnmt does not know (an older stamp's) changes everything
                start = min(first.get(step, 1) for name, _, step in self.config if name in changed) \
                    if changed <= {name for name, _, _ in self.config} else 1
                if any(self.stamp(i) for i in range(start, len(steps) + 1)):
                    for line in changes:
                        self.log(line)
                    raise DataPrepError(f"{self.out} was prepared with other options (above): use a new OUTDIR, "
                                        f"or delete {self.out} to start over")
                self.log(f"options changed since the last run ({summary}); "
                         f"no step they change has finished: going on from step {start} with the new ones")
        if not stamp.exists() or stamp.read_text() != config:
            atomic_write_text(stamp, config)

    # ----------------------------------------------------------------- runner

    def steps(self) -> list:
        ds, langs = self.ds, self.ds.langs

        def pairs(directory, splits):
            return tuple(f"{directory}/{s}.{l}" for s in splits for l in langs)

        method, size, process = self.args.bpe, self.args.bpe_size, self.process
        steps = [Step("fetch", self.fetch.description(), self.fetch.run,
                      tuple(f"orig/{f.name}" for f in ds.files))]
        if ds.archives:
            steps += [Step("extract", "extract the corpora, check line counts", process.extract),
                      Step("raw", "raw valid/test text (the test set from SGM, as sacreBLEU)",
                           process.raw_from_archives, pairs("raw", ("valid", "test")), reads_work=True)]
        else:
            steps.append(Step("unpack", "unpack, check line counts, keep raw valid/test text", process.unpack,
                              pairs("raw", ("valid", "test"))))
        if ds.moses:
            steps.append(Step("tokenize", f"normalize punctuation and tokenize (sacremoses, {self.args.workers} workers)",
                              process.tokenize, reads_work=True))
        cleaned = ds.max_len is not None
        steps += [
            Step("learn", f"learn joint {method} subwords (size {size}) on train.{ds.src} + train.{ds.tgt}",
                 process.learn, (str(process.model.relative_to(self.out)),), reads_work=True),
            Step("apply", "segment train/valid/test", process.apply,
                 pairs("text", ("valid", "test") if cleaned else SPLITS), reads_work=True)]
        if cleaned:
            ratio = f", ratio {self.args.ratio}" if ds.ratio is not None else ""
            steps.append(Step("clean", f"clean training pairs (1..{self.args.max_len} subwords{ratio})", process.clean,
                              pairs("text", ("train",)), reads_work=True))
        binarized = [f"bin/dict.{l}.txt" for l in langs] + [
            f"bin/{s}.{ds.src}-{ds.tgt}.{l}.{ext}" for s in SPLITS for l in langs for ext in ("bin", "idx")]
        steps.append(Step(LAST_STEP, "fairseq-preprocess --joined-dictionary", process.binarize, tuple(binarized)))
        return steps

    def stamp(self, i: int):
        return next(iter(sorted(self.stamps.glob(f"{i:02d}-*.done"))), None)

    def run_steps(self) -> None:
        steps, start = self.steps(), time.time()
        n, redo = len(steps), None
        if self.stamp(1):  # every step reads what the fetch step verified: an input changed since redoes them all
            for line in self.fetch.changed():
                self.log(f"{line}: redoing steps 1-{n}")
                redo = 1
        for i, step in enumerate(steps if redo is None else [], 1):
            missing = [p for p in step.outputs if not (self.out / p).exists()]
            if self.stamp(i) is None:
                redo = i
            elif missing:
                self.log(f"step {i}/{n}: done earlier, but its output is missing: "
                         f"{' '.join(missing[:2])}{' ...' if len(missing) > 2 else ''}")
                redo = i
            if redo:
                break
        if redo and redo > 2 and steps[redo - 1].reads_work and not any(self.work.glob("*")):
            self.log(f"step {redo}/{n} reads OUTDIR/work, removed after the last complete run "
                     f"(see --keep-work): redoing steps 2-{n}")
            redo = 2
        for i, step in enumerate(steps[:(redo or n + 1) - 1], 1):
            self.log(f"step {i}/{n}: {step.description}: done, skipping")
        if redo is None:
            with contextlib.suppress(OSError):
                self.work.rmdir()  # left by an older resnmt, which made it on every run
            if not (self.out / "prepared.json").exists():  # prepared before the manifest existed
                self.process.write_manifest()
            self.log(f"nothing to do: {self.out} is complete (binarized data in {self.out / 'bin'})")
            return
        self.work.mkdir(exist_ok=True)
        for i in range(redo, n + 1):
            while self.stamp(i):
                self.stamp(i).unlink()
        for i, step in enumerate(steps[redo - 1:], redo):
            where = f"{i}/{n} ({step.description})"
            self.log(f"step {i}/{n}: {step.description}")
            t0 = time.time()
            try:
                step.run()
            except DataPrepError as e:
                self.log(f"failed in step {where}; outputs of finished steps are kept: re-run to resume "
                         "(with the options the error names changed, if it names any)")
                self.log(f"error: {e}")  # the last line
                raise SystemExit(1) from None
            except (KeyboardInterrupt, Interrupted) as e:
                self.log(f"interrupted in step {where}; outputs of finished steps are kept, "
                         "re-run the same command to resume")
                raise SystemExit(130 if isinstance(e, KeyboardInterrupt) else 143) from None
            if _sigterm_received:  # Python ignored the exception (raised inside a fork hook or a finalizer)
                self.log(f"interrupted in step {where}; re-run the same command to resume")
                raise SystemExit(143)
            (self.stamps / f"{i:02d}-{step.id}.done").touch()
            self.log(f"step {i}/{n}: done in {format_seconds(time.time() - t0)}")
        if not self.args.keep_work:
            shutil.rmtree(self.work)
        self.log(f"finished in {format_seconds(time.time() - start)}: binarized data in {self.out / 'bin'}")


def finished(outdir: Path) -> bool:
    """Whether OUTDIR's last resnmt-prepare run finished (its last step's stamp is there); True
    for an OUTDIR without stamps (data prepared otherwise). A run that stopped, even one that
    failed after the fetch step recorded new inputs, leaves OUTDIR unfinished, whatever bin/
    still holds."""
    stamps = Path(outdir) / ".stamps"
    return not stamps.is_dir() or any(stamps.glob(f"*-{LAST_STEP}.done"))


def changed_inputs(outdir: Path, mirror: Optional[Path] = None, log: Callable[[str], None] = print) -> List[str]:
    """For a user of a prepared OUTDIR (resnmt-experiment): one line per input whose bytes
    changed since OUTDIR's fetch step recorded it, the inputs that would make resnmt-prepare
    redo every step (``Fetch.changed``); each read from ``mirror`` where given (a built-in
    dataset's published files, as ``--mirror`` reads them), else from where the fetch step
    read it. A few stat calls when nothing changed (``input_changes``); [] for an OUTDIR that
    records no input. Waits for a resnmt-prepare run holding OUTDIR's lock, with a line
    saying so."""
    out = Path(outdir).absolute()
    recorded = read_record(out)
    if not recorded:
        return []
    sources = {name: Path(mirror) / name if mirror else Path(entry.get("source") or out / "orig" / name)
               for name, entry in recorded.items()}
    try:
        lock = open(out / ".lock", "a")
    except OSError:  # an OUTDIR this user cannot write, so cannot be preparing either: read, record nothing
        return input_changes(out, sources, log, record_anew=False)
    with lock:  # shared: checks of one OUTDIR run side by side (a touched input is recorded the same by each)
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for the resnmt-prepare run using {out} (lock {out / '.lock'}) to finish")
            fcntl.flock(lock, fcntl.LOCK_SH)
        return input_changes(out, sources, log)


_sigterm_received = False
_main_pid = None


def _interrupted(signum, frame):
    global _sigterm_received
    if os.getpid() != _main_pid:  # a worker forked a moment ago, before it set its own handler
        os._exit(143)
    _sigterm_received = True
    raise Interrupted()


def run(ds, args, tag: str) -> int:
    global _main_pid
    _main_pid = os.getpid()
    signal.signal(signal.SIGTERM, _interrupted)
    prep = Preparation(ds, args, tag)
    try:
        with prep.locked():
            prep.run_steps()
    except DataPrepError as e:
        prep.log(f"error: {e}")
        return 1
    except (KeyboardInterrupt, Interrupted) as e:
        prep.log("interrupted")
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    return 0
