"""A row of the study: a connection kind as an arch and its fairseq-train flags, and
``slug``, a row's name as a file name and a command-line word."""
import re
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class Row:
    """A connection kind as the study trains it."""

    arch: str
    flags: Tuple[str, ...] = ()
    seeds: int = 2  # seeds the quality table wants


def slug(row: str) -> str:
    """A row's name as a file name and a command-line word: "rskip_ln (λ=2)" -> "rskip_ln_2"."""
    return re.sub(r"[^a-z0-9]+", "_", row.lower()).strip("_")
