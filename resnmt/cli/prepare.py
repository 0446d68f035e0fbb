"""``resnmt-prepare DATASET [options] OUTDIR``: a translation corpus as fairseq binarized data.

DATASET is a built-in corpus (downloaded, or read from ``--mirror DIR``) or ``custom``,
a corpus of one's own (``--train/--valid/--test PREFIX --source-lang S --target-lang T``).
In a checkout, ``data-prep/prepare-DATASET.sh`` runs the same. This module parses the
options and checks the input and the environment, so that a bad value, a missing file
or tool is one clear line before any work; the runner is resnmt.data.pipeline (the steps:
resnmt.data.fetch, resnmt.data.process), the corpora resnmt.data.corpora.
"""
import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from resnmt.data.corpora import CUSTOM, DATASETS, LANG_HELP, LANG_RE, Dataset, custom
from resnmt.options import Option, add_to_command

PROG = "resnmt-prepare"
COMMANDS = (*DATASETS, CUSTOM)
SPLITS = ("train", "valid", "test")

OVERVIEW = f"""\
Usage: {PROG} DATASET [options] OUTDIR

Prepares a parallel corpus as fairseq binarized data in OUTDIR: a joint subword model,
OUTDIR/bin (fairseq-preprocess --joined-dictionary), the raw references in OUTDIR/raw,
and OUTDIR/prepared.json (the languages and the subword model, which resnmt-experiment
and decoding read).

DATASET:
  multi30k        Multi30k task 1 EN-DE (29k pairs; CPU runs, the demo)
  multi30k-en-fr  Multi30k task 1 EN-FR (the same 29k captions in French)
  iwslt15-en-vi   IWSLT'15 EN-VI, the Stanford release (133k pairs)
  wmt14-en-de     WMT'14 EN-DE (4.5M pairs)
  wmt14-en-fr     WMT'14 EN-FR (36M pairs)
  custom          your own corpus: --train/--valid/--test PREFIX (files PREFIX.S,
                  PREFIX.T) --source-lang S --target-lang T

{PROG} DATASET --help lists the options of each, e.g.
  {PROG} multi30k data/multi30k
  {PROG} custom --train corpus/train --valid corpus/dev --test corpus/test \\
      --source-lang en --target-lang de data/my-corpus
"""

COMMON_EPILOG = """\
Re-running the same command skips finished steps (stamps in OUTDIR/.stamps) and
resumes an interrupted run; changing an option that affects the output of a step
that has finished is refused (use a new OUTDIR, or delete it to start over). Progress
goes to stderr."""


class UsageError(Exception):
    """A bad command line: one error line, exit status 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


def ratio(text: str) -> str:
    """Kept as typed: it is recorded in the OUTDIR's option stamp."""
    try:
        ok = float(text) == 0 or float(text) >= 1
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"'{text}' is not allowed: expected a number >= 1, or 0 for no ratio test")
    return text


def directory(text: str) -> str:
    if not os.path.isdir(text):
        raise ValueError(f"{text}: no such directory")
    if not os.access(text, os.R_OK | os.X_OK):
        raise ValueError(f"{text}: directory not readable")
    return os.path.abspath(text)


def readable_file(text: str) -> str:
    if not (os.path.isfile(text) and os.access(text, os.R_OK)):
        raise ValueError(f"{text}: no such readable file")
    return text


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


KEEP_WORK = Option("keep_work", False, "keep OUTDIR/work (intermediate files) after success", kind="switch")


def outdir_option(ds: Dataset) -> Option:
    """OUTDIR, and what the run writes there."""
    model = "OUTDIR/spm/spm.model" if ds.subword_methods == ("sentencepiece",) else \
        "OUTDIR/bpe/bpe.codes (subword-nmt) or OUTDIR/spm/spm.model (sentencepiece)"
    return Option("outdir", nargs="?", metavar="OUTDIR", positional=True, help=(
        f"output directory: OUTDIR/bin/ fairseq data (train/valid/test, {ds.src}-{ds.tgt}, "
        f"dict.{{{ds.src},{ds.tgt}}}.txt); {model}, the subword model; OUTDIR/raw/test.{{{ds.src},{ds.tgt}}}: "
        f"{ds.test_help}; OUTDIR/text/: the segmented text given to fairseq-preprocess; "
        "OUTDIR/prepared.json: the manifest (languages, subword model)"))


def corpus_options() -> Tuple[Option, ...]:
    """resnmt-prepare custom's corpus: the files of each split and the two languages."""
    splits = (("train", "training"), ("valid", "validation (fairseq-train's valid)"),
              ("test", "test (decoded and scored)"))
    return (*(Option(split, metavar="PREFIX", help=f"the {what} text: PREFIX.S, PREFIX.T") for split, what in splits),
            Option("source_lang", metavar="S", help=f"source language: {LANG_HELP}"),
            Option("target_lang", metavar="T", help="target language, like S"))


def subword_options(ds: Dataset) -> Tuple[Option, ...]:
    """The subword model and the cleaning of the training pairs, as far as the dataset has them."""
    options = []
    if len(ds.subword_methods) > 1:
        options.append(Option("bpe", ds.subword_methods[0], f"subword method: {' or '.join(ds.subword_methods)} "
                              "(default: %(default)s)", kind="choice", choices=ds.subword_methods, metavar="METHOD"))
    options += [Option("bpe_size", ds.subword_size, f"{ds.subword_size_help} (default: %(default)s)", kind="int",
                       minimum=ds.subword_min_size, metavar="N"),
                Option("spm_type", "unigram", "sentencepiece model type: unigram or bpe (default: %(default)s)",
                       kind="choice", choices=("unigram", "bpe"), metavar="T")]
    if ds.max_len is not None:
        options.append(Option("max_len", ds.max_len, "drop training pairs longer than N subwords "
                              "(default: %(default)s)", kind="int", minimum=1, metavar="N"))
    if ds.ratio is not None:
        options.append(Option("ratio", ds.ratio, "drop training pairs whose length ratio exceeds R "
                              "(default: %(default)s; 0: no ratio test)", parse=ratio, metavar="R"))
    if ds.max_train_lines:
        options.append(Option("max_train_lines", 0, "use only the first N lines of each training corpus "
                              "(0: all; smoke tests)", kind="int", minimum=0, metavar="N"))
    return tuple(options)


def resource_options(ds: Dataset) -> Tuple[Option, ...]:
    """Where the published files come from (a built-in corpus), the workers, the work files."""
    if ds.name == CUSTOM:  # your files are read where they are
        return (Option("workers", default_workers(), "parallel processes for sentencepiece and fairseq-preprocess "
                       "(default: all cores, here %(default)s)", kind="int", minimum=1, metavar="N"), KEEP_WORK)
    return (
        Option("mirror", None, "read the published files (same names as published) from DIR instead of "
               "downloading them (clusters without internet, tests)", parse=directory, metavar="DIR"),
        Option("mirror_url", None, "download each file from URL/NAME instead of its published URL", metavar="URL"),
        Option("checksums", None, 'sha256 of published files, sha256sum format ("HASH  NAME"); overrides the '
               "hashes pinned in resnmt.data.corpora. After a run, OUTDIR/orig/SHA256SUMS lists the hashes of the "
               "files it used", parse=readable_file, metavar="FILE"),
        Option("workers", default_workers(), "parallel processes for tokenization, subword segmentation and "
               "fairseq-preprocess (default: all cores, here %(default)s)", kind="int", minimum=1, metavar="N"),
        KEEP_WORK)


def option_groups(ds: Dataset) -> List[Tuple[Optional[str], Tuple[Option, ...]]]:
    """Every option of ``resnmt-prepare DATASET``, by --help's group (None: the operand)."""
    groups = [(None, (outdir_option(ds),))]
    if ds.name == CUSTOM:
        groups.append(("your corpus (each PREFIX names the files PREFIX.S and PREFIX.T)", corpus_options()))
    return groups + [("subwords and cleaning", subword_options(ds)),
                     ("files, resources and resuming", resource_options(ds))]


def build_parser(ds: Dataset) -> argparse.ArgumentParser:
    """The parser of ``resnmt-prepare DATASET``: each value kept as text, converted by
    :func:`parse_args` (the words of every option, resnmt.options)."""
    usage = ("%(prog)s --train PREFIX --valid PREFIX --test PREFIX --source-lang S --target-lang T [options] OUTDIR"
             if ds.name == CUSTOM else "%(prog)s [options] [--mirror DIR] OUTDIR")
    p = argparse.ArgumentParser(
        prog=f"{PROG} {ds.name}", usage=usage,
        description=ds.summary, epilog=f"{COMMON_EPILOG}\n\n{ds.files_help}", formatter_class=HelpFormatter,
        allow_abbrev=False, exit_on_error=False)
    for title, options in option_groups(ds):
        add_to_command(p if title is None else p.add_argument_group(title), options, checked=False)
    if ds.name == CUSTOM:
        p.set_defaults(mirror=None, mirror_url=None, checksums=None)
    return p


def converted(ds: Dataset, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with each option's text checked and converted as declared."""
    for _, options in option_groups(ds):
        for option in options:
            value = getattr(args, option.dest)
            try:
                setattr(args, option.dest, value if value is None else option.convert(value))
            except ValueError as e:
                raise UsageError(str(e)) from None
    return args


def parse_args(ds: Dataset, argv) -> argparse.Namespace:
    parser = build_parser(ds)
    try:
        args, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise UsageError(f"{e.argument_name} {e.message}" if e.argument_name else e.message) from None
    converted(ds, args)
    for item in extra:
        if item.startswith("-"):
            raise UsageError(f"unknown option '{item.split('=')[0]}'")
        raise UsageError(f"unexpected argument '{item}' (OUTDIR is already '{args.outdir}'; one OUTDIR only)")
    if len(ds.subword_methods) == 1:
        args.bpe = ds.subword_methods[0]
    if ds.name == CUSTOM:
        args.dataset = own_corpus(args)
    if not args.outdir:
        raise UsageError("missing OUTDIR (the output directory)")
    if ds.name != CUSTOM and args.mirror and args.mirror_url:
        raise UsageError("--mirror and --mirror-url exclude each other")
    return args


def own_corpus(args) -> Dataset:
    """resnmt-prepare custom's corpus, its files checked before any work: the languages'
    shape, every PREFIX.S and PREFIX.T there, UTF-8, non-empty and of equal line counts."""
    from resnmt.data.textproc import DataPrepError, checked_line_count

    for flag, lang in (("--source-lang", args.source_lang), ("--target-lang", args.target_lang)):
        if lang is None:
            raise UsageError(f"missing {flag} ({LANG_HELP})")
        if not LANG_RE.fullmatch(lang):
            raise UsageError(f"{flag} '{lang}' is not {LANG_HELP}")
    if args.source_lang == args.target_lang:
        raise UsageError(f"--source-lang and --target-lang are both '{args.source_lang}'; they must differ")
    prefixes = {}
    for split in SPLITS:
        prefix = getattr(args, split)
        if prefix is None:
            raise UsageError(f"missing --{split} PREFIX (the files PREFIX.{args.source_lang} and "
                             f"PREFIX.{args.target_lang})")
        counts = {}
        for lang in (args.source_lang, args.target_lang):
            path = Path(f"{prefix}.{lang}")
            if not (path.is_file() and os.access(path, os.R_OK)):
                raise UsageError(f"--{split} {prefix}: no such readable file {path}")
            try:
                counts[path] = checked_line_count(path)
            except DataPrepError as e:
                raise UsageError(f"--{split} {prefix}: {e}") from None
        (src, n_src), (tgt, n_tgt) = counts.items()
        if n_src != n_tgt:
            raise UsageError(f"--{split} {prefix}: {src} has {n_src} lines but {tgt} has {n_tgt}; "
                             "a parallel corpus needs the same number of lines on both sides")
        if n_src == 0:
            raise UsageError(f"--{split} {prefix}: {src} and {tgt} are empty")
        prefixes[split] = prefix
    return custom(args.source_lang, args.target_lang, prefixes)


def missing_requirements(ds: Dataset, args) -> str:
    """'' when the tools and python modules this run needs are there, else what is missing."""
    path = f"{os.environ.get('PATH', '')}{os.pathsep}{Path(sys.executable).parent}"  # as process.binarize
    for cmd in ("fairseq-preprocess",):
        if shutil.which(cmd, path=path) is None:
            return f"'{cmd}' not found on PATH nor beside {sys.executable} (install fairseq: pip install resnmt)"
    modules = ["tqdm", "subword_nmt" if args.bpe == "subword-nmt" else "sentencepiece"]
    modules += ["sacremoses", "regex"] if ds.moses else []
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        return f"python module(s) missing in {sys.executable}: {' '.join(missing)} (pip install resnmt installs them)"
    return ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(OVERVIEW, end="")
        return 0
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown DATASET '{argv[0]}'" if argv else "missing DATASET"
        print(OVERVIEW, file=sys.stderr)
        print(f"[{PROG}] error: {given}; choose one of: {' '.join(COMMANDS)}", file=sys.stderr)
        return 2
    ds = custom() if argv[0] == CUSTOM else DATASETS[argv[0]]
    tag = f"prepare-{ds.name}"
    try:
        args = parse_args(ds, argv[1:])
    except UsageError as e:
        print(f"[{tag}] error: {e} (see {PROG} {ds.name} --help)", file=sys.stderr)
        return 2
    ds = getattr(args, "dataset", ds)
    missing = missing_requirements(ds, args)
    if missing:
        print(f"[{tag}] error: {missing}", file=sys.stderr)
        return 1
    from resnmt.data.pipeline import run  # the text libraries, checked just above

    return run(ds, args, tag)


if __name__ == "__main__":
    sys.exit(main())
