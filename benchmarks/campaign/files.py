"""Where the lab's files are: this repository, its committed results, the prepared corpus
(benchmarks/run_all.sh prepares it), and the ``--data`` and ``--out`` flags that default to
them."""
import argparse
from pathlib import Path
from typing import Optional

from resnmt.options import Option, add_to_command

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "benchmarks" / "results"  # the committed results (benchmarks/make_tables.py reads them)
CORPUS = REPO_ROOT / "data" / "multi30k"  # resnmt-prepare multi30k's OUTDIR


def add_data(p: argparse.ArgumentParser, binarized: bool, required: bool = False, default: Optional[str] = "") -> None:
    """``--data``: the binarized corpus (``binarized``) or the prepared one; ``default`` None:
    the command picks it (and says so in its own help)."""
    if binarized:
        what, folder = "fairseq-binarized data (train and valid splits, a joined dictionary)", CORPUS / "bin"
    else:
        what, folder = "prepared corpus (OUTDIR of resnmt-prepare multi30k: OUTDIR/bin, OUTDIR/raw/test.de)", CORPUS
    if required:
        data = Option("data", help=what, required=True, metavar="DIR")
    elif default is None:
        data = Option("data", help=f"{what} (default: data/DATASET, the --pair's Multi30k)", metavar="DIR")
    else:
        data = Option("data", str(folder), f"{what} (default: {folder.relative_to(REPO_ROOT)})", metavar="DIR")
    add_to_command(p, [data])


def add_out(p: argparse.ArgumentParser, name: Optional[str] = None) -> None:
    """``--out``: the JSON lines a run appends to (``benchmarks/results/NAME`` by default;
    without ``name``, required)."""
    if name is None:
        out = Option("out", help="JSON lines, appended as each row finishes", required=True, metavar="JSONL")
    else:
        out = Option("out", str(RESULTS / name), f"JSON lines appended here (default: benchmarks/results/{name})",
                     metavar="JSONL")
    add_to_command(p, [out])
