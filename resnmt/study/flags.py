"""The command-line flags the study's commands share, each declared once (a
:class:`resnmt.options.Option`), and their checks: a bad value ends the command with one
error line naming it and what is allowed (exit status 2).

``--data`` means one of two folders: the binarized corpus (fairseq's ``dict.*.txt`` and
splits) or the prepared corpus (``resnmt-prepare multi30k``'s OUTDIR, its ``bin/`` and ``raw/``).
"""
import argparse
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from resnmt.data.corpora import MULTI30K
from resnmt.experiment.presets import SIZES
from resnmt.options import Option, add_to_command

def binarized_folder(p: argparse.ArgumentParser, data, prepared: bool = False, dataset=MULTI30K) -> Path:
    """The binarized folder of ``--data`` (``prepared``: its ``bin/``), checked: it must
    hold a fairseq dictionary."""
    data = Path(data)
    bin_dir = data / "bin" if prepared else data
    if not list(bin_dir.glob("dict.*.txt")):
        corpus = data if prepared else data.parent
        p.error(f"--data {data}: no fairseq dictionary (dict.*.txt) in {bin_dir}; prepare the corpus with "
                f"resnmt-prepare {dataset.name} {corpus} (--mirror DIR on a machine without network)")
    return bin_dir


REFERENCE = (
    Option("ref", help="reference file (default: DATA/raw/test.de)", metavar="FILE"),
    Option("remove_bpe", "sentencepiece", "passed to resnmt-evaluate (default: %(default)s)", kind="choice",
           choices=("none", "subword_nmt", "sentencepiece")),
)


def add_reference(p: argparse.ArgumentParser) -> None:
    """``--ref`` and ``--remove-bpe``: what the decoded test set is scored against."""
    add_to_command(p, REFERENCE)


def scored_corpus(p: argparse.ArgumentParser, data, ref, dataset=MULTI30K) -> Tuple[Path, Path]:
    """The binarized folder of the prepared corpus ``--data`` of ``dataset`` (a
    resnmt.data.corpora.Dataset) and the reference file (``--ref``, else the corpus's raw test
    set), both checked: the binarized data must be of the dataset's language pair."""
    bin_dir = binarized_folder(p, data, prepared=True, dataset=dataset)
    pair = f"{dataset.src}-{dataset.tgt}"
    if not list(bin_dir.glob(f"train.{pair}.*.idx")):
        found = sorted({x.name.split(".")[1] for x in bin_dir.glob("train.*.idx")})
        p.error(f"--data {data}: its binarized data is {', '.join(found) or 'of no pair'}, not {pair}; "
                f"prepare {pair} with resnmt-prepare {dataset.name} DIR")
    ref = Path(ref) if ref else Path(data) / "raw" / f"test.{dataset.tgt}"
    if not ref.is_file():
        p.error(f"--ref {ref}: no such file; the prepared corpus's references are in {Path(data) / 'raw'}")
    return bin_dir, ref


def add_threads(p: argparse.ArgumentParser, default: int = 1, per: str = "run", note: str = "") -> None:
    add_to_command(p, [Option("threads", default, f"torch threads per {per} (default: {default}{note})", kind="int",
                              minimum=1, metavar="N")])


def add_size(p: argparse.ArgumentParser, default: Optional[str], what: str) -> None:
    """``--size``: a model size of resnmt's presets; ``what`` says the default and the sizes."""
    add_to_command(p, [Option("size", default, f"model size: {what}", kind="choice", choices=sorted(SIZES))])


# The CPU study's schedule (the benchmarks' default): peak learning rate, warm-up updates.
STUDY_LR, STUDY_WARMUP = 1e-3, 300


def add_schedule(p: argparse.ArgumentParser, what: str = "") -> None:
    """``--max-tokens``, ``--lr``, ``--warmup``: the study's batches and learning-rate schedule."""
    add_to_command(p, [
        Option("max_tokens", 4096, "tokens per batch (default: %(default)s)", kind="int", minimum=1, metavar="N"),
        Option("lr", STUDY_LR, f"peak learning rate (default: {STUDY_LR:g}{what})", kind="number", above=0,
               metavar="LR"),
        Option("warmup", STUDY_WARMUP, f"inverse-sqrt warm-up updates (default: {STUDY_WARMUP}{what})", kind="int",
               minimum=0, metavar="N")])


CHECKPOINTS = (
    Option("save_every", 40, "checkpoint interval in updates (default: %(default)s)", kind="int", minimum=1,
           metavar="N"),
    Option("average", 5, "average the newest N checkpoints (default: %(default)s)", kind="int", minimum=1,
           metavar="N"),
    Option("keep_checkpoints", False, "keep each run's checkpoints when it ends", kind="switch"),
)


def add_checkpoints(p: argparse.ArgumentParser) -> None:
    """How often a run writes a checkpoint, how many it averages, and whether it keeps them."""
    add_to_command(p, CHECKPOINTS)


def add_rows(p: argparse.ArgumentParser, rows: Dict, default=None, what: str = "rows") -> None:
    """``--rows``: a comma-separated choice among ``rows`` (default: ``default``, else all),
    checked after parsing (:func:`chosen_rows`: a row may have a second name)."""
    default = list(rows) if default is None else list(default)
    add_to_command(p, [Option("rows", ",".join(default), metavar="ROW,ROW,...", help=(
        f"comma-separated {what} (default: {'all' if default == list(rows) else ', '.join(default)}): "
        + "; ".join(rows)))])


def chosen_rows(p: argparse.ArgumentParser, text: str, rows: Dict, slug=None) -> List[str]:
    """The rows ``--rows text`` names, in its order (``slug``: a function that gives each row
    a second accepted name), checked against ``rows``."""
    names = {row: row for row in rows}
    if slug is not None:
        names.update({slug(row): row for row in rows})
    wanted = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in wanted if r not in names]
    if bad:
        p.error(f"--rows {','.join(bad)}: unknown; choose from {', '.join(rows)}")
    return [names[r] for r in wanted]
