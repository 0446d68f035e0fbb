"""What several layers of resnmt share, depending on nothing but the standard library:
durations as text, JSON-lines files, and command-line values checked with a one-line error.

Data preparation (``resnmt.data``), the experiment (``resnmt.experiment``), the command
lines (``resnmt.cli``) and the benchmarks import these from here, so that no lower layer
reaches up into a higher one for them (and none loads torch or fairseq to get them).
"""
import argparse
import json
import types
from pathlib import Path
from typing import List, Sequence

# ------------------------------------------------------------------------------ durations


def format_seconds(seconds: float) -> str:
    """12s / 3m05s / 1h02m."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"

# ---------------------------------------------------------------------------- JSON lines


def append_jsonl(path: Path, record: dict, sort_keys: bool = False) -> None:
    """Append one JSON line with a single write (concurrent writers append whole lines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False, sort_keys=sort_keys) + "\n")


def read_jsonl(path: Path) -> List[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

# ------------------------------------------------------------ command-line values and errors


def integer(value, minimum: int) -> int:
    """``value`` (an int, or its digits as text) as an int >= ``minimum``, else a ValueError
    saying so (without the flag: the caller names it)."""
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or int(text) < minimum:
        raise ValueError(f"'{text}': must be an integer >= {minimum}")
    return int(text)


def number(value, minimum: float) -> float:
    """``value`` (a number, or its text) as a finite float >= ``minimum``, else a ValueError."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        result = None
    if isinstance(value, bool) or result is None or not minimum <= result < float("inf"):
        raise ValueError(f"'{value}': must be a number >= {minimum:g}")
    return result


def choice(value: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else a ValueError naming them."""
    if value not in allowed:
        raise ValueError(f"'{value}' is not one of: {' '.join(allowed)}")
    return value


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit status 2), naming the
    bad value, instead of the usage block followed by the message."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` (one built elsewhere, e.g. fairseq's training parser, ~185 lines of usage)
    reporting usage errors as OneLineErrorParser does: the error alone, as the last line."""
    parser.error = types.MethodType(OneLineErrorParser.error, parser)
    return parser
