"""The steps that turn a corpus of resnmt.data.corpora into fairseq data, and the runner
that skips finished steps, resumes interrupted runs and refuses changed options.

OUTDIR layout: orig/ (published files), raw/ (valid/test text as published), work/
(intermediate, removed after success unless --keep-work), bpe/ or spm/ (subword model),
text/ (segmented text), bin/ (fairseq data), prepared.json (the manifest,
resnmt.data.manifest), .stamps/ (config + NN-STEP.done), .lock.
"""
import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from resnmt.atomic import atomic_write_text
from resnmt.data.manifest import write_manifest
from resnmt.data.textproc import (DataPrepError, apply_subword, clean_pairs, copy_bytes, count_lines, learn_subword,
                                  moses_tokenize, normalize_space, read_lines, same_line_count, sgm_segments,
                                  subword_model_size, write_lines)
from resnmt.shared import format_seconds

SPLITS = ("train", "valid", "test")


class Interrupted(BaseException):
    """SIGTERM: unwinds like KeyboardInterrupt, so temporary outputs are removed."""


@dataclass(frozen=True)
class Step:
    id: str
    description: str
    run: Callable[[], None]
    outputs: tuple = ()  # paths relative to OUTDIR that must still exist for the step to count as done
    reads_work: bool = False  # needs OUTDIR/work, removed after a complete run


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise DataPrepError(f"cannot read {path}: {e.strerror}") from None
    return digest.hexdigest()


class Preparation:
    """One run of a dataset's steps on OUTDIR, holding its lock."""

    def __init__(self, ds, args, tag: str):
        self.ds, self.args, self.tag = ds, args, tag
        self.out = Path(args.outdir).absolute()
        self.orig, self.work, self.stamps = self.out / "orig", self.out / "work", self.out / ".stamps"
        self.model = self.out / ("spm/spm.model" if args.bpe == "sentencepiece" else "bpe/bpe.codes")
        self.sha256 = {f.name: (f.sha256, f"pinned in resnmt's table of {ds.name}, resnmt.data.corpora")
                       for f in ds.files if f.sha256}
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

    def log(self, msg: str) -> None:
        print(f"[{self.tag}] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ setup

    @contextlib.contextmanager
    def locked(self):
        """Create OUTDIR, hold its lock, check the option stamp, remove a killed run's
        temporaries; a temporary directory for this run, removed at the end."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            lock = open(self.out / ".lock", "w")
        except OSError as e:
            raise DataPrepError(f"cannot create OUTDIR {self.out}: {e.strerror}") from None
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DataPrepError(f"another prepare run is using {self.out} (lock {self.out / '.lock'})") from None
            for d in (self.orig, self.work, self.stamps):
                d.mkdir(exist_ok=True)
            for leftover in self.out.glob(".tmp.*"):
                shutil.rmtree(leftover, ignore_errors=True)
            for leftover in [*self.out.glob("*/*.tmp"), *self.out.glob("*/*/*.tmp")]:
                leftover.unlink()
            self.check_config()
            self.read_checksums()
            self.tmp = Path(tempfile.mkdtemp(prefix=".tmp.", dir=self.out))
            try:
                yield
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)

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
        atomic_write_text(stamp, config)

    def read_checksums(self) -> None:
        if not self.args.checksums:
            return
        n = 0
        for line in Path(self.args.checksums).read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            digest, _, name = line.strip().partition(" ")
            if not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
                raise DataPrepError(f"--checksums {self.args.checksums}: '{digest}' is not a sha256 "
                                    "(expected lines 'HASH  NAME')")
            self.sha256[name.strip().lstrip("*")] = (digest.lower(), f"--checksums {self.args.checksums}")
            n += 1
        if n == 0:
            raise DataPrepError(f"--checksums {self.args.checksums}: no 'HASH  NAME' line")

    # ----------------------------------------------------------------- runner

    def steps(self) -> list:
        ds, langs = self.ds, self.ds.langs

        def pairs(directory, splits):
            return tuple(f"{directory}/{s}.{l}" for s in splits for l in langs)

        method, size = self.args.bpe, self.args.bpe_size
        fetch = (f"link the {len(ds.files)} files of your corpus" if all(f.local for f in ds.files)
                 else f"fetch and verify the {len(ds.files)} published files")
        steps = [Step("fetch", fetch, self.fetch,
                      tuple(f"orig/{f.name}" for f in ds.files))]
        if ds.archives:
            steps += [Step("extract", "extract the corpora, check line counts", self.extract),
                      Step("raw", "raw valid/test text (the test set from SGM, as sacreBLEU)",
                           self.raw_from_archives, pairs("raw", ("valid", "test")), reads_work=True)]
        else:
            steps.append(Step("unpack", "unpack, check line counts, keep raw valid/test text", self.unpack,
                              pairs("raw", ("valid", "test"))))
        if ds.moses:
            steps.append(Step("tokenize", f"normalize punctuation and tokenize (sacremoses, {self.args.workers} workers)",
                              self.tokenize, reads_work=True))
        cleaned = ds.max_len is not None
        steps += [
            Step("learn", f"learn joint {method} subwords (size {size}) on train.{ds.src} + train.{ds.tgt}",
                 self.learn, (str(self.model.relative_to(self.out)),), reads_work=True),
            Step("apply", "segment train/valid/test", self.apply,
                 pairs("text", ("valid", "test") if cleaned else SPLITS), reads_work=True)]
        if cleaned:
            ratio = f", ratio {self.args.ratio}" if ds.ratio is not None else ""
            steps.append(Step("clean", f"clean training pairs (1..{self.args.max_len} subwords{ratio})", self.clean,
                              pairs("text", ("train",)), reads_work=True))
        binarized = [f"bin/dict.{l}.txt" for l in langs] + [
            f"bin/{s}.{ds.src}-{ds.tgt}.{l}.{ext}" for s in SPLITS for l in langs for ext in ("bin", "idx")]
        steps.append(Step("binarize", "fairseq-preprocess --joined-dictionary", self.binarize, tuple(binarized)))
        return steps

    def stamp(self, i: int):
        return next(iter(sorted(self.stamps.glob(f"{i:02d}-*.done"))), None)

    def run_steps(self) -> None:
        steps, start = self.steps(), time.time()
        n, redo = len(steps), None
        for i, step in enumerate(steps, 1):
            missing = [p for p in step.outputs if not (self.out / p).exists()]
            if self.stamp(i) is None:
                redo = i
            elif missing:
                self.log(f"step {i}/{n}: done earlier, but its output is missing: "
                         f"{' '.join(missing[:2])}{' ...' if len(missing) > 2 else ''}")
                redo = i
            if redo:
                break
        if redo and redo > 2 and steps[redo - 1].reads_work and not any(self.work.iterdir()):
            self.log(f"step {redo}/{n} reads OUTDIR/work, removed after the last complete run "
                     f"(see --keep-work): redoing steps 2-{n}")
            redo = 2
        for i, step in enumerate(steps[:(redo or n + 1) - 1], 1):
            self.log(f"step {i}/{n}: {step.description}: done, skipping")
        if redo is None:
            with contextlib.suppress(OSError):
                self.work.rmdir()
            if not (self.out / "prepared.json").exists():  # prepared before the manifest existed
                self.write_manifest()
            self.log(f"nothing to do: {self.out} is complete (binarized data in {self.out / 'bin'})")
            return
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

    # ------------------------------------------------------------------ fetch

    def verify(self, path: Path, name: str) -> str:
        """The sha256 of path; an error when it differs from the known hash of NAME."""
        actual = sha256_of(path)
        if name in self.sha256:
            expected, source = self.sha256[name]
            if actual != expected:
                raise DataPrepError(f"checksum mismatch for {name} ({path}): sha256 is {actual}, "
                                    f"expected {expected} ({source})")
            self.log(f"  {name}: sha256 OK")
        else:
            self.log(f"  {name}: sha256 {actual} (not pinned: no published hash is known; pass --checksums to pin it)")
        return actual

    def fetch(self) -> None:
        """orig/NAME for every published file: a symlink into --mirror, or a download that
        is renamed into place only once verified; orig/SHA256SUMS records what was used."""
        sums = []
        for f in self.ds.files:
            dest = self.orig / f.name
            if f.local:  # resnmt-prepare custom: the user's file, checked before any work
                sums.append((sha256_of(Path(f.local)), f.name))
                dest.unlink(missing_ok=True)
                dest.symlink_to(f.local)
                self.log(f"  {f.name}: {f.local}")
            elif self.args.mirror:
                src = Path(self.args.mirror) / f.name
                if not src.exists():
                    raise DataPrepError(f"{f.name} not found in mirror {self.args.mirror} (a mirror holds the "
                                        f"published files under their published names; expected {src})")
                sums.append((self.verify(src, f.name), f.name))
                dest.unlink(missing_ok=True)
                dest.symlink_to(src)
            elif dest.is_file() and not dest.is_symlink():
                self.log(f"  {f.name}: already downloaded")
                try:
                    sums.append((self.verify(dest, f.name), f.name))
                except DataPrepError as e:
                    raise DataPrepError(f"{e} (delete it to download it again)") from None
            else:
                dest.unlink(missing_ok=True)
                url = f"{self.args.mirror_url.rstrip('/')}/{f.name}" if self.args.mirror_url else f.url
                part = dest.with_name(dest.name + ".part")
                self.download(url, part)
                try:
                    sums.append((self.verify(part, f.name), f.name))
                except DataPrepError as e:
                    part.replace(part.with_name(part.name + ".bad"))
                    raise DataPrepError(f"{e}; the download is kept as {part}.bad") from None
                part.replace(dest)
        atomic_write_text(self.orig / "SHA256SUMS", "".join(f"{h}  {n}\n" for h, n in sums))

    def download(self, url: str, part: Path, tries: int = 3) -> None:
        """Download url to part, resuming a partial download when the server allows it."""
        self.log(f"  {part.name[:-5]}: downloading {url}")
        for attempt in range(1, tries + 1):
            have = part.stat().st_size if part.exists() else 0
            request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    resumed = have and r.status == 206
                    total = int(r.headers.get("Content-Length", 0)) + (have if resumed else 0)
                    with open(part, "ab" if resumed else "wb") as f, \
                            tqdm(total=total or None, initial=have if resumed else 0, unit="B", unit_scale=True,
                                 desc=part.name[:-5], mininterval=10) as bar:
                        for block in iter(lambda: r.read(1 << 20), b""):
                            f.write(block)
                            bar.update(len(block))
                return
            except urllib.error.HTTPError as e:
                if e.code == 416 and have:  # nothing left to fetch: the partial file is complete
                    return
                raise DataPrepError(f"download of {url} failed ({e}); "
                                    "re-run to retry, or fetch the files yourself and pass --mirror DIR") from None
            except (urllib.error.URLError, OSError) as e:
                if attempt == tries:
                    raise DataPrepError(f"download of {url} failed ({e}); partial data kept in {part}, "
                                        "re-run to resume") from None
                self.log(f"  download of {url} failed ({e}), retrying in 5 s")
                time.sleep(5)

    # --------------------------------------------------- raw text and line checks

    def published(self, text, lang: str) -> Path:
        """The file holding a Text's side: the published file or the extracted member."""
        if text.archive:
            return self.work / "extracted" / text.path(lang)
        return self.orig / text.path(lang)

    def corpora(self, split: str) -> tuple:
        return {"train": self.ds.train, "valid": self.ds.valid, "test": self.ds.test}[split]

    def check_pairs(self, split: str, texts, files: dict) -> None:
        n = same_line_count(*files.values())
        expected = self.ds.expected_pairs.get(split)
        first = texts[0].path(self.ds.src)
        if expected is not None and n != expected:
            raise DataPrepError(f"{first} has {n} lines, the published {self.ds.name} {split} split has {expected}")
        if n == 0:
            raise DataPrepError(f"{first} is empty")
        self.log(f"  {split} ({'+'.join(t.name for t in texts)}): {n} pairs")

    def unpack(self) -> None:
        """Datasets published as text files: raw/{valid,test}.* byte for byte as
        published (decompressed), work/{split}.* with normalized whitespace."""
        for split in SPLITS:
            texts = self.corpora(split)
            for lang in self.ds.langs:
                files = [self.published(t, lang) for t in texts]
                if split != "train":
                    copy_bytes(files, self.out / "raw" / f"{split}.{lang}")
                max_lines = self.args.max_train_lines if split == "train" and self.ds.max_train_lines else 0
                write_lines(self.work / f"{split}.{lang}", map(normalize_space, read_lines(files, max_lines)))
            self.check_pairs(split, texts, {l: self.work / f"{split}.{l}" for l in self.ds.langs})

    def extract(self) -> None:
        """Archives: extract the members the pipeline reads into work/extracted."""
        dest = self.work / "extracted"
        shutil.rmtree(dest, ignore_errors=True)
        members = {}
        for text in self.ds.train + self.ds.valid + self.ds.test:
            members.setdefault(text.archive, set()).update(p for _, p in text.paths)
        for archive, wanted in members.items():
            self.log(f"  {archive}: {' '.join(sorted(wanted))}")
            path = self.orig / archive
            try:
                with tarfile.open(path) as tar:
                    for member in tar:
                        if member.name in wanted:
                            tar.extract(member, dest, filter="data")
                            wanted.discard(member.name)
                if wanted:
                    raise tarfile.TarError(f"not in the archive: {' '.join(sorted(wanted))}")
            except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
                raise DataPrepError(f"cannot extract from {path} ({archive}): {e}\n  (a corrupt or truncated "
                                    "download? delete it and re-run)") from None
        for text in self.ds.train:
            n = same_line_count(*(self.published(text, l) for l in self.ds.langs))
            if n == 0:
                raise DataPrepError(f"{text.path(self.ds.src)} in {text.archive} is empty")
            self.log(f"  {text.name}: {n} pairs")

    def raw_from_archives(self) -> None:
        """raw/test.* from the SGM test set, raw/valid.* the dev sets concatenated."""
        for split in ("valid", "test"):
            texts = self.corpora(split)
            for lang in self.ds.langs:
                files = [self.published(t, lang) for t in texts]
                if texts[0].sgm:
                    write_lines(self.out / "raw" / f"{split}.{lang}", sgm_segments(files[0]))
                else:
                    copy_bytes(files, self.out / "raw" / f"{split}.{lang}")
            self.check_pairs(split, texts, {l: self.out / "raw" / f"{split}.{l}" for l in self.ds.langs})

    # -------------------------------------------------------- text processing

    def tokenized(self, split: str, lang: str) -> Path:
        """The whitespace-normalized text the subword steps read."""
        return self.work / (f"{split}.tok.{lang}" if self.ds.moses else f"{split}.{lang}")

    def tokenize(self) -> None:
        for lang in self.ds.langs:
            train = [self.published(t, lang) for t in self.ds.train]
            moses_tokenize(train, self.tokenized("train", lang), lang, self.args.workers, self.args.max_train_lines)
            for split in ("valid", "test"):
                moses_tokenize([self.out / "raw" / f"{split}.{lang}"], self.tokenized(split, lang), lang, 1)
        same_line_count(*(self.tokenized("train", l) for l in self.ds.langs))

    def learn(self) -> None:
        inputs = [self.tokenized("train", l) for l in self.ds.langs]
        summary = learn_subword(self.args.bpe, inputs, self.model, self.args.bpe_size, self.args.spm_type,
                                self.args.workers)
        self.log(f"  {summary}")

    def segmented(self, split: str, lang: str) -> Path:
        cleaned_later = split == "train" and self.ds.max_len is not None
        return (self.work / f"train.seg.{lang}") if cleaned_later else self.out / "text" / f"{split}.{lang}"

    def apply(self) -> None:
        pairs = [(self.tokenized(s, l), self.segmented(s, l)) for s in SPLITS for l in self.ds.langs]
        apply_subword(self.args.bpe, self.model, pairs, self.args.workers)

    def clean(self) -> None:
        src, tgt = self.ds.langs
        ratio = float(self.args.ratio) if self.ds.ratio is not None else 0.0
        summary = clean_pairs(self.segmented("train", src), self.segmented("train", tgt),
                              self.out / "text" / f"train.{src}", self.out / "text" / f"train.{tgt}",
                              self.args.max_len, ratio)
        self.log(f"  clean train.{src}/train.{tgt}: {summary}")

    # --------------------------------------------------------------- binarize

    def binarize(self) -> None:
        """fairseq-preprocess into a temporary directory, renamed to bin/ when complete."""
        src, tgt = self.ds.langs
        text, tmpbin, log = self.out / "text", self.tmp / "bin", self.out / "logs" / "fairseq-preprocess.log"
        # this Python's scripts last on PATH: a fairseq-preprocess on PATH wins, and an
        # installed resnmt finds its own when its venv is not activated
        env = {**os.environ, "PATH": f"{os.environ.get('PATH', '')}{os.pathsep}{Path(sys.executable).parent}"}
        # fairseq-preprocess workers re-read the dictionary and pay a start-up cost:
        # measured here, 2 workers are slower than 1 on Multi30k's 29K pairs. One
        # worker per 250K training pairs.
        workers = min(self.args.workers, 1 + count_lines(text / f"train.{src}") // 250_000)
        log.parent.mkdir(exist_ok=True)
        with open(log, "w") as f:
            rc = subprocess.run(["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
                                 "--trainpref", text / "train", "--validpref", text / "valid",
                                 "--testpref", text / "test", "--destdir", tmpbin, "--joined-dictionary",
                                 "--workers", str(workers)], stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        lines = log.read_text(errors="replace").splitlines()
        if rc != 0:
            print("\n".join(lines[-20:]), file=sys.stderr)
            raise DataPrepError(f"fairseq-preprocess failed (full log: {log})")
        summary = re.compile(r"^.*?(\[[a-z]+\] (?:Dictionary: .*|.*: [0-9]+ sents.*))$")
        for line in dict.fromkeys(m.group(1) for m in map(summary.match, lines) if m):
            self.log(f"  {line}")
        shutil.rmtree(self.out / "bin", ignore_errors=True)
        tmpbin.rename(self.out / "bin")
        self.write_info()
        self.write_manifest()

    def write_manifest(self) -> None:
        write_manifest(self.out, self.ds, "sentencepiece" if self.args.bpe == "sentencepiece" else "subword_nmt",
                       str(self.model.relative_to(self.out)), subword_model_size(self.args.bpe, self.model))

    def write_info(self) -> None:
        versions = []
        for package in ("sacremoses", "subword-nmt", "sentencepiece", "ve-fairseq"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                versions.append(f"{package}=={importlib.metadata.version(package)}")
        source = self.args.mirror or self.args.mirror_url or "(published URLs)"
        atomic_write_text(self.out / "prepare-info.txt", "".join([
            f"# written by resnmt-prepare {self.ds.name} on {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n",
            "options:\n", *(f"  {k}={v}\n" for k, v, _ in self.config), f"  mirror={source}\n",
            f"tools: {' '.join(versions)}\n", "lines (segmented text given to fairseq-preprocess):\n",
            *(f"  {p.name} {count_lines(p)}\n" for p in sorted((self.out / "text").iterdir()))]))


_sigterm_received = False


def _interrupted(signum, frame):
    global _sigterm_received
    _sigterm_received = True
    raise Interrupted()


def run(ds, args, tag: str) -> int:
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
