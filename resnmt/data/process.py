"""The processing steps of data preparation: from the fetched files (OUTDIR/orig) to
fairseq's binarized data (OUTDIR/bin), written once for all datasets.

* ``unpack`` (text files) or ``extract`` + ``raw_from_archives`` (archives): the raw
  valid/test text as published (OUTDIR/raw, scored against), the text to process in
  OUTDIR/work, line counts checked;
* ``tokenize``: Moses punctuation normalization and tokenization (the WMT corpora);
* ``learn`` / ``apply``: a joint subword model (OUTDIR/bpe or OUTDIR/spm), the text
  segmented with it (OUTDIR/text);
* ``clean``: training pairs by length and ratio;
* ``binarize``: ``fairseq-preprocess --joined-dictionary`` into OUTDIR/bin, then
  prepare-info.txt and the manifest (``resnmt.data.manifest``).

Each step reads what the steps before it wrote and writes through ``resnmt.atomic`` or a
temporary directory, so the runner (``resnmt.data.pipeline``) can skip, resume and redo
steps; the text work is ``resnmt.data.textproc``.
"""
import contextlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence, Tuple

from resnmt.atomic import atomic_write_text
from resnmt.data.manifest import write_manifest
from resnmt.data.textproc import (DataPrepError, apply_subword, clean_pairs, copy_bytes, count_lines, learn_subword,
                                  moses_tokenize, normalize_space, read_lines, same_line_count, sgm_segments,
                                  subword_model_size, write_lines)

SPLITS = ("train", "valid", "test")


class Processing:
    """The processing steps of ``ds`` on OUTDIR ``out`` with the options ``args``;
    ``config`` (the options that change the output, as the runner stamps them) is recorded
    in prepare-info.txt."""

    def __init__(self, ds, args, out: Path, config: Sequence[Tuple[str, object, str]], log: Callable[[str], None]):
        self.ds, self.args, self.out, self.config, self.log = ds, args, out, config, log
        self.orig, self.work = out / "orig", out / "work"
        self.model = out / ("spm/spm.model" if args.bpe == "sentencepiece" else "bpe/bpe.codes")

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
        tmp = Path(tempfile.mkdtemp(prefix=".tmp.", dir=self.out))
        try:
            self._binarize(tmp / "bin")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _binarize(self, tmpbin: Path) -> None:
        src, tgt = self.ds.langs
        text, log = self.out / "text", self.out / "logs" / "fairseq-preprocess.log"
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
