"""Command-line options declared once.

An option is a dataclass field made with ``option(...)``: a :class:`resnmt.options.Option`
(the declaration the model flags use too) holding its default, metavar, help and the kind
of value it takes. The command lines build their parsers (``add_options``) and
their help (``options_help``, which lists a command's own switches too) from those fields, and a request converts command-line
text into typed values on construction (``convert_options``), so a bad value is a
UsageError naming the flag, found before any work.
"""
import textwrap
from typing import Any, Dict, Iterable, List, Optional, Sequence

from resnmt.experiment.errors import UsageError
from resnmt.options import Option, field_options

HELP_WIDTH = 88
HELP_INDENT = 24


def option(default: Any, metavar: str, help: str, *, kind: str = "str", minimum: Optional[float] = 0,
           choices: Sequence[str] = ()):
    """A request's dataclass field that is also a command-line option (``--field-name``); an
    ``int`` or ``number`` is >= ``minimum``."""
    bounded = kind in ("int", "number")
    return Option(default=default, help=help, kind=kind, minimum=minimum if bounded else None, choices=choices,
                  metavar=metavar).field()


def converted(option: Option, value):
    """:meth:`Option.convert`, its ValueError as a UsageError."""
    try:
        return option.convert(value)
    except ValueError as e:
        raise UsageError(str(e)) from None


def declared(cls, names: Optional[Iterable[str]] = None) -> List[Option]:
    """The options of the request ``cls``, in ``names``' order (all, in declaration order, without)."""
    options = {o.dest: o for o in field_options(cls)}
    return [options[name] for name in names] if names is not None else list(options.values())


def convert_options(request) -> None:
    """Replaces each option field of ``request`` by its checked, typed value; None stays None."""
    for o in declared(type(request)):
        value = getattr(request, o.dest)
        if value is not None:
            setattr(request, o.dest, converted(o, value))


def add_options(parser, cls, names: Iterable[str]) -> None:
    """``--flag VALUE`` (a ``switch``: ``--flag``) for each named option of ``cls``; not given, it
    is None (the field's default). The text is converted when the request is made."""
    for o in declared(cls, names):
        o.add_to(parser, default=None, checked=False)


def given(args, cls, names: Iterable[str]) -> Dict[str, Any]:
    """The named options that the command line gave (as text), by field name."""
    return {o.dest: getattr(args, o.dest) for o in declared(cls, names) if getattr(args, o.dest) is not None}


def options_help(options: Iterable[Option], indent: int = HELP_INDENT, width: int = HELP_WIDTH) -> str:
    """The help lines of ``options`` (a request's: :func:`declared`), each with its default
    and its environment variable, the text from column ``indent`` to ``width``."""
    lines = []
    for o in options:
        text = o.help
        if o.kind == "choice" and not all(choice in text for choice in o.choices):
            text += f" (one of: {' '.join(o.choices)})"
        if o.default is not None and o.default != "" and o.kind != "switch" and "default" not in text:
            text += f" (default {o.default})"
        text += f" [{o.env}]" if o.env else ""
        head = f"  {o.flag} {o.metavar or ''}".rstrip()
        first_width = width - max(len(head) + 1, indent)
        if len(head) + 1 > indent:  # a long flag: its help starts on the next line
            lines += [head, *(" " * indent + w for w in textwrap.wrap(text, width - indent))]
            continue
        first, *rest = textwrap.wrap(text, first_width) or [""]
        rest = textwrap.wrap(" ".join(rest), width - indent) if rest else []
        lines += [head.ljust(indent) + first, *(" " * indent + w for w in rest)]
    return "\n".join(lines)
