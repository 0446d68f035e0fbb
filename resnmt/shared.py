"""What several layers of resnmt share, depending on nothing but the standard library:
durations as text, JSON-lines files, and command-line errors on one line naming the closest
valid names (an option's value is checked by its declaration: :mod:`resnmt.options`).

Data preparation (``resnmt.data``), the experiment (``resnmt.experiment``), the command
lines (``resnmt.cli``) and the benchmarks import these from here, so that no lower layer
reaches up into a higher one for them (and none loads torch or fairseq to get them).
"""
import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import List, NoReturn, Optional, Sequence

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


def closest(value: str, allowed: Sequence[str], n: int = 3) -> List[str]:
    """The names among ``allowed`` that look like a mistyped ``value``, closest first."""
    return difflib.get_close_matches(value, list(allowed), n=n, cutoff=0.6)


_INVALID_CHOICE_RE = re.compile(r"(argument \S+: invalid choice: '([^']*)') \(choose from (.*)\)$")


def with_closest_names(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's error ``message`` naming, where it can, the closest valid names: the
    closest choices of an invalid choice, the closest flags of an unrecognized one."""
    wrong = _INVALID_CHOICE_RE.match(message)
    if wrong:
        choices = [c.strip().strip("'\"") for c in wrong.group(3).split(",")]
        close = closest(wrong.group(2), choices)
        return f"{wrong.group(1)} (closest: {' '.join(close)}; choose from {wrong.group(3)})" if close else message
    if message.startswith("unrecognized arguments: "):
        names = [f[2:] for f in parser._option_string_actions if f.startswith("--")]  # compared without "--"
        unknown = [a.split("=")[0] for a in message.split(": ", 1)[1].split() if a.startswith("--")]
        hints = [f"{u}: closest {' '.join('--' + c for c in close)}" for u in unknown
                 if (close := closest(u[2:], names))]
        return f"{message} ({'; '.join(hints)})" if hints else message
    return message


ARCHS_LISTED = "resnmt's archs: python -m resnmt.cli.arch_table"
LONG_CHOICES = 30  # an invalid choice among more names than this is answered with the closest only


def short_choice_error(message: str) -> Optional[str]:
    """argparse's error for an invalid choice among more than LONG_CHOICES names (fairseq's
    ``--arch`` lists about 180, some 4,700 characters) as one short line naming the closest
    ones; None for another error or a short list."""
    wrong = _INVALID_CHOICE_RE.match(message)
    choices = [c.strip().strip("'\"") for c in wrong.group(3).split(",")] if wrong else []
    if len(choices) <= LONG_CHOICES:
        return None
    close = closest(wrong.group(2), choices)
    arch = re.match(r"argument --arch\b", message)
    where = f"{ARCHS_LISTED}; all: fairseq-train --help" if arch else f"all {len(choices)}: see --help"
    return f"{wrong.group(1)} ({f'closest: {chr(32).join(close)}; ' if close else ''}{where})"


def shorten_choice_errors() -> None:
    """fairseq's parsers (those with ``--user-dir``: ``fairseq-train --user-dir resnmt --arch
    transformer_sas_bas``) stop on an invalid choice with one line naming the closest choices
    (among many, ``short_choice_error``: those alone), without the usage block; every other
    error, and other parsers, as before."""
    error = argparse.ArgumentParser.error
    if getattr(error, "shortens_choice_errors", False):
        return

    def short_error(self, message):
        if "--user-dir" not in self._option_string_actions or not _INVALID_CHOICE_RE.match(message):
            return error(self, message)
        self.exit(2, f"{self.prog}: error: {short_choice_error(message) or with_closest_names(message, self)}\n")

    short_error.shortens_choice_errors = True
    argparse.ArgumentParser.error = short_error


def exit_usage_error(prog: str, message: str) -> NoReturn:
    """A single-step tool's usage error: one line, the last, exit status 2."""
    sys.stderr.write(f"{prog}: error: {message} (see --help)\n")
    sys.exit(2)


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit status 2), naming the
    bad value and the closest valid names, instead of the usage block followed by the message."""

    def error(self, message):
        exit_usage_error(self.prog, with_closest_names(message, self))
