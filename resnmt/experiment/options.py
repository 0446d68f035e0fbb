"""Command-line options declared once.

An option is a dataclass field made with ``option(...)``: its default, metavar, help and
check sit together there. The command lines build their parsers (``add_options``) and
their help (``options_help``) from those fields, and a request converts command-line
text into typed values on construction (``convert_options``), so a bad value is a
UsageError naming the flag, found before any work.
"""
import dataclasses
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from resnmt.experiment.errors import UsageError
from resnmt.shared import choice, integer, number

HELP_WIDTH = 88
HELP_INDENT = 24


@dataclass(frozen=True)
class OptionSpec:
    metavar: str
    help: str
    kind: str = "str"  # str, int (>= minimum), number (>= minimum), path, choice (one of choices), flag (no value)
    minimum: float = 0
    choices: Sequence[str] = ()


def option(default: Any, metavar: str, help: str, *, kind: str = "str", minimum: float = 0,
           choices: Sequence[str] = ()):
    """A dataclass field that is also a command-line option (``--field-name``)."""
    return field(default=default, metadata={"option": OptionSpec(metavar, help, kind, minimum, tuple(choices))})


def flag_name(field_name: str) -> str:
    """The command-line flag of a request field: max_update -> --max-update."""
    return "--" + field_name.replace("_", "-")


def checked(flag: str, check, value, *args):
    """``check(value, *args)``, its ValueError as a UsageError naming ``flag``."""
    try:
        return check(value, *args)
    except ValueError as e:
        raise UsageError(f"{flag} {e}") from None


def check_choice(flag: str, value: str, allowed: Sequence[str]) -> str:
    return checked(flag, choice, value, allowed)


def _spec(f: dataclasses.Field) -> Optional[OptionSpec]:
    return f.metadata.get("option")


def declared(cls, names: Optional[Iterable[str]] = None) -> List[dataclasses.Field]:
    """The option fields of ``cls``, in ``names``' order (all, in declaration order, without)."""
    options = {f.name: f for f in dataclasses.fields(cls) if _spec(f)}
    return [options[name] for name in names] if names is not None else list(options.values())


def convert(f: dataclasses.Field, value):
    """``value`` (command-line text or a typed value) checked and converted as ``f`` declares."""
    spec, flag = _spec(f), flag_name(f.name)
    if spec.kind == "int":
        return checked(flag, integer, value, int(spec.minimum))
    if spec.kind == "number":
        return checked(flag, number, value, spec.minimum)
    if spec.kind == "choice":
        return checked(flag, choice, value, spec.choices)
    if spec.kind == "path":
        return Path(value)
    if spec.kind == "flag":
        return bool(value)
    return value


def convert_options(request) -> None:
    """Replaces each option field of ``request`` by its checked, typed value; None stays None."""
    for f in declared(type(request)):
        value = getattr(request, f.name)
        if value is not None:
            setattr(request, f.name, convert(f, value))


def add_options(parser, cls, names: Iterable[str]) -> None:
    """``--flag VALUE`` (a ``flag``: ``--flag``) for each named option of ``cls``; not given, it
    is None (the field's default)."""
    for f in declared(cls, names):
        if _spec(f).kind == "flag":
            parser.add_argument(flag_name(f.name), dest=f.name, action="store_const", const=True, default=None)
        else:
            parser.add_argument(flag_name(f.name), dest=f.name, metavar=_spec(f).metavar, default=None)


def given(args, cls, names: Iterable[str]) -> Dict[str, Any]:
    """The named options that the command line gave (as text), by field name."""
    return {f.name: getattr(args, f.name) for f in declared(cls, names) if getattr(args, f.name) is not None}


def options_help(cls, names: Iterable[str]) -> str:
    """The help lines of the named options of ``cls``, each with its default."""
    lines = []
    for f in declared(cls, names):
        spec = _spec(f)
        text = spec.help
        if spec.kind == "choice" and not all(choice in text for choice in spec.choices):
            text += f" (one of: {' '.join(spec.choices)})"
        if f.default is not None and f.default != "" and spec.kind != "flag" and "default" not in text:
            text += f" (default {f.default})"
        head = f"  {flag_name(f.name)} {spec.metavar}".rstrip()
        first_width = HELP_WIDTH - max(len(head) + 1, HELP_INDENT)
        if len(head) + 1 > HELP_INDENT:  # a long flag: its help starts on the next line
            lines += [head, *(" " * HELP_INDENT + w for w in textwrap.wrap(text, HELP_WIDTH - HELP_INDENT))]
            continue
        first, *rest = textwrap.wrap(text, first_width) or [""]
        rest = textwrap.wrap(" ".join(rest), HELP_WIDTH - HELP_INDENT) if rest else []
        lines += [head.ljust(HELP_INDENT) + first, *(" " * HELP_INDENT + w for w in rest)]
    return "\n".join(lines)
