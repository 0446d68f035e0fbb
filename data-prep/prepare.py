#!/usr/bin/env python3
"""Prepare a translation corpus as fairseq binarized data: data-prep/prepare-DATASET.sh
runs `python data-prep/prepare.py DATASET ...`. See docs/data-prep.md.

This file parses the options and checks the environment with the standard library only,
so that a missing tool or python module is one clear line before any work; the steps
are in pipeline.py, the corpora in corpora.py, the text processing in textproc.py.
"""
import argparse
import importlib.util
import os
import shutil
import sys

from corpora import DATASETS, Dataset

COMMON_EPILOG = """\
Re-running the same command skips finished steps (stamps in OUTDIR/.stamps) and
resumes an interrupted run; changing an option that affects the output for an
existing OUTDIR is refused (use a new OUTDIR). Progress goes to stderr."""


class UsageError(Exception):
    """A bad command line: exit status 2 and a pointer to --help."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


def int_at_least(minimum: int):
    def parse(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer (expected an integer >= {minimum})")
        if int(text) < minimum:
            raise argparse.ArgumentTypeError(f"{int(text)} is too small (expected an integer >= {minimum})")
        return int(text)
    return parse


def one_of(*allowed: str):
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"'{text}' is not allowed; choose one of: {' '.join(allowed)}")
        return text
    return parse


def ratio(text: str) -> str:
    """Kept as typed: it is recorded in the OUTDIR's option stamp."""
    try:
        ok = float(text) == 0 or float(text) >= 1
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"'{text}' is not allowed: expected a number >= 1, or 0 for no ratio test")
    return text


def directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    if not os.access(text, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: directory not readable")
    return os.path.abspath(text)


def readable_file(text: str) -> str:
    if not (os.path.isfile(text) and os.access(text, os.R_OK)):
        raise argparse.ArgumentTypeError(f"{text}: no such readable file")
    return text


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_parser(ds: Dataset) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"data-prep/prepare-{ds.name}.sh", usage="%(prog)s [options] [--mirror DIR] OUTDIR",
        description=ds.summary, epilog=f"{COMMON_EPILOG}\n\n{ds.files_help}", formatter_class=HelpFormatter,
        allow_abbrev=False, exit_on_error=False)
    model = "OUTDIR/spm/spm.model" if ds.subword_methods == ("sentencepiece",) else \
        "OUTDIR/bpe/bpe.codes (subword-nmt) or OUTDIR/spm/spm.model (sentencepiece)"
    p.add_argument("outdir", nargs="?", metavar="OUTDIR", help=(
        f"output directory: OUTDIR/bin/ fairseq data (train/valid/test, {ds.src}-{ds.tgt}, "
        f"dict.{{{ds.src},{ds.tgt}}}.txt); {model}, the subword model; OUTDIR/raw/test.{{{ds.src},{ds.tgt}}}: "
        f"{ds.test_help}; OUTDIR/text/: the segmented text given to fairseq-preprocess"))

    g = p.add_argument_group("subwords and cleaning")
    if len(ds.subword_methods) > 1:
        g.add_argument("--bpe", metavar="METHOD", type=one_of(*ds.subword_methods), default=ds.subword_methods[0],
                       help=f"subword method: {' or '.join(ds.subword_methods)} (default: %(default)s)")
    g.add_argument("--bpe-size", metavar="N", type=int_at_least(ds.subword_min_size), default=ds.subword_size,
                   help=f"{ds.subword_size_help} (default: %(default)s)")
    g.add_argument("--spm-type", metavar="T", type=one_of("unigram", "bpe"), default="unigram",
                   help="sentencepiece model type: unigram or bpe (default: %(default)s)")
    if ds.max_len is not None:
        g.add_argument("--max-len", metavar="N", type=int_at_least(1), default=ds.max_len,
                       help="drop training pairs longer than N subwords (default: %(default)s)")
    if ds.ratio is not None:
        g.add_argument("--ratio", metavar="R", type=ratio, default=ds.ratio,
                       help="drop training pairs whose length ratio exceeds R (default: %(default)s; 0: no ratio test)")
    if ds.max_train_lines:
        g.add_argument("--max-train-lines", metavar="N", type=int_at_least(0), default=0,
                       help="use only the first N lines of each training corpus (0: all; smoke tests)")

    g = p.add_argument_group("files, resources and resuming")
    g.add_argument("--mirror", metavar="DIR", type=directory,
                   help="read the published files (same names as published) from DIR instead of "
                        "downloading them (clusters without internet, tests)")
    g.add_argument("--mirror-url", metavar="URL", help="download each file from URL/NAME instead of its published URL")
    g.add_argument("--checksums", metavar="FILE", type=readable_file,
                   help='sha256 of published files, sha256sum format ("HASH  NAME"); overrides the hashes '
                        "pinned in data-prep/corpora.py. After a run, OUTDIR/orig/SHA256SUMS lists the hashes of the files it used")
    g.add_argument("--workers", metavar="N", type=int_at_least(1), default=default_workers(),
                   help="parallel processes for tokenization, subword segmentation and fairseq-preprocess "
                        "(default: all cores, here %(default)s)")
    g.add_argument("--keep-work", action="store_true", help="keep OUTDIR/work (intermediate files) after success")
    return p


def parse_args(ds: Dataset, argv) -> argparse.Namespace:
    parser = build_parser(ds)
    try:
        args, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise UsageError(f"{e.argument_name} {e.message}" if e.argument_name else e.message) from None
    for item in extra:
        if item.startswith("-"):
            raise UsageError(f"unknown option '{item.split('=')[0]}'")
        raise UsageError(f"unexpected argument '{item}' (OUTDIR is already '{args.outdir}'; one OUTDIR only)")
    if not args.outdir:
        raise UsageError("missing OUTDIR (the output directory)")
    if args.mirror and args.mirror_url:
        raise UsageError("--mirror and --mirror-url exclude each other")
    if len(ds.subword_methods) == 1:
        args.bpe = ds.subword_methods[0]
    return args


def missing_requirements(ds: Dataset, args) -> str:
    """'' when the tools and python modules this run needs are there, else what is missing."""
    for cmd in ("fairseq-preprocess",):
        if shutil.which(cmd) is None:
            return (f"'{cmd}' not found on PATH (install the environment with 'make venv' "
                    "and activate it: . .venv/bin/activate)")
    modules = ["resnmt", "tqdm", "subword_nmt" if args.bpe == "subword-nmt" else "sentencepiece"]
    modules += ["sacremoses", "regex"] if ds.moses else []
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        return (f"python module(s) missing in {sys.executable}: {' '.join(missing)} (install requirements.txt "
                "and resnmt, e.g. 'make venv', and activate .venv, or set PYTHON=/path/to/venv/bin/python)")
    return ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in DATASETS:
        print(f"usage: prepare.py DATASET [options] OUTDIR   (DATASET: {', '.join(DATASETS)}; "
              "run data-prep/prepare-DATASET.sh --help)", file=sys.stderr)
        return 2
    ds = DATASETS[argv[0]]
    tag = f"prepare-{ds.name}"
    try:
        args = parse_args(ds, argv[1:])
    except UsageError as e:
        print(f"[{tag}] error: {e}\nRun data-prep/{tag}.sh --help for the options.", file=sys.stderr)
        return 2
    missing = missing_requirements(ds, args)
    if missing:
        print(f"[{tag}] error: {missing}", file=sys.stderr)
        return 1
    from pipeline import run  # the text libraries and resnmt, checked just above

    return run(ds, args, tag)


if __name__ == "__main__":
    sys.exit(main())
