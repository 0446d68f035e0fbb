"""The command-line flags the benchmarks share, each declared once, and their checks: a bad
value ends the command with one error line naming it and what is allowed (exit status 2).

``--data`` means one of two folders: the binarized corpus (fairseq's ``dict.*.txt`` and
splits; speed.py, malloc.py, profile_ops.py, gpu_train.py) or the prepared corpus
(``resnmt-prepare multi30k``'s OUTDIR, its ``bin/`` and ``raw/``; quality.py, fp16.py, resnmt-study).
"""
import argparse
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from resnmt.data.corpora import MULTI30K
from resnmt.experiment.presets import SIZES
from resnmt.study.records import REPO_ROOT, RESULTS

CORPUS = REPO_ROOT / "data" / "multi30k"  # resnmt-prepare multi30k's OUTDIR (benchmarks/run_all.sh prepares it)


def add_data(p: argparse.ArgumentParser, binarized: bool, required: bool = False, default: Optional[str] = "") -> None:
    """``--data``: the binarized corpus (``binarized``) or the prepared one; ``default`` None:
    the command picks it (and says so in its own help)."""
    if binarized:
        what, folder = "fairseq-binarized data (train and valid splits, a joined dictionary)", CORPUS / "bin"
    else:
        what, folder = "prepared corpus (OUTDIR of resnmt-prepare multi30k: OUTDIR/bin, OUTDIR/raw/test.de)", CORPUS
    if required:
        p.add_argument("--data", required=True, help=what)
    elif default is None:
        p.add_argument("--data", help=f"{what} (default: data/DATASET, the --pair's Multi30k)")
    else:
        p.add_argument("--data", default=str(folder), help=f"{what} (default: {folder.relative_to(REPO_ROOT)})")


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


def add_out(p: argparse.ArgumentParser, name: Optional[str] = None) -> None:
    """``--out``: the JSON lines a run appends to (``benchmarks/results/NAME`` by default;
    without ``name``, required)."""
    if name is None:
        p.add_argument("--out", required=True, help="JSON lines, appended as each row finishes")
    else:
        p.add_argument("--out", default=str(RESULTS / name),
                       help=f"JSON lines appended here (default: benchmarks/results/{name})")


def add_reference(p: argparse.ArgumentParser) -> None:
    """``--ref`` and ``--remove-bpe``: what the decoded test set is scored against."""
    p.add_argument("--ref", help="reference file (default: DATA/raw/test.de)")
    p.add_argument("--remove-bpe", default="sentencepiece", choices=["none", "subword_nmt", "sentencepiece"],
                   help="passed to resnmt-evaluate (default: sentencepiece)")


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
    p.add_argument("--threads", type=int, default=default,
                   help=f"torch threads per {per} (default: {default}{note})")


def add_size(p: argparse.ArgumentParser, default: Optional[str], what: str) -> None:
    """``--size``: a model size of resnmt's presets; ``what`` says the default and the sizes."""
    p.add_argument("--size", default=default, choices=sorted(SIZES), help=f"model size: {what}")


# The CPU study's schedule (the benchmarks' default): peak learning rate, warm-up updates.
STUDY_LR, STUDY_WARMUP = 1e-3, 300


def add_schedule(p: argparse.ArgumentParser, what: str = "") -> None:
    """``--max-tokens``, ``--lr``, ``--warmup``: the study's batches and learning-rate schedule."""
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default: 4096)")
    p.add_argument("--lr", type=float, default=STUDY_LR, help=f"peak learning rate (default: {STUDY_LR:g}{what})")
    p.add_argument("--warmup", type=int, default=STUDY_WARMUP,
                   help=f"inverse-sqrt warm-up updates (default: {STUDY_WARMUP}{what})")


def add_checkpoints(p: argparse.ArgumentParser) -> None:
    """How often a run writes a checkpoint, how many it averages, and whether it keeps them."""
    p.add_argument("--save-every", type=int, default=40, help="checkpoint interval in updates (default: 40)")
    p.add_argument("--average", type=int, default=5, help="average the newest N checkpoints (default: 5)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoints when it ends")


def add_rows(p: argparse.ArgumentParser, rows: Dict, default=None, what: str = "rows") -> None:
    """``--rows``: a comma-separated choice among ``rows`` (default: ``default``, else all)."""
    default = list(rows) if default is None else list(default)
    p.add_argument("--rows", default=",".join(default),
                   help=f"comma-separated {what} (default: {'all' if default == list(rows) else ', '.join(default)}): "
                   + "; ".join(rows))


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
