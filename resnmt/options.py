"""How resnmt declares an option: one :class:`Option` for a model flag and a command's option alike.

An option is declared once, where the thing it configures is defined: a connection kind's
flags on its class (``flags``), the model-wide flags (``--residual``, ``--normalization``,
the FFN activation's) in :mod:`resnmt.models.flags`, a pipeline command's options as
the fields of its request (:mod:`resnmt.experiment.presets`, :mod:`resnmt.experiment.pipeline`,
made with :func:`resnmt.experiment.command_options.option`). The declaration holds the kind of
value (:data:`KINDS`: a switch, an integer or a real number with its bound, a choice, a
path, a string), the default, the metavar and the help; from it come

* the value check (:meth:`Option.check`), one for every option: the same words ("must be
  an integer >= 1", "is not one of: ...") wherever a value is refused;
* its argparse argument (:meth:`Option.add_to`), the one place an option meets a parser:
  a model flag's is added without a default (fairseq parses model flags with
  ``argparse.SUPPRESS``, so an unset flag is absent from ``args`` and whoever reads it
  takes :attr:`Option.default`: :meth:`Option.read`); a command's with its default, the
  value checked by argparse (its words, the flag named first) or kept as text and
  converted after parsing (:meth:`Option.convert`: "--flag 'VALUE': must be ...");
* the refusal of a value built in Python (:meth:`Option.problem`);
* a command's dataclass field (:meth:`Option.field`), whose value the request converts
  with :meth:`Option.convert`.

The other commands (resnmt-analyze, resnmt-average, resnmt-evaluate, resnmt-prepare, the
demo, the pipeline commands' own switches) declare theirs as Options beside their parser,
added by :func:`add_to_command`. Not declared here: the options of resnmt's fairseq task and
optimizer, which stay fairseq's own dataclass fields (``FairseqDataclass``, the form fairseq
turns into both its parser and its config).

A command line's error names the closest valid names (:func:`with_closest_names`).

Depends on nothing but the standard library.
"""
import argparse
import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

KINDS = ("switch", "int", "number", "choice", "path", "str")
NARGS = (None, "?", "*", "+", argparse.REMAINDER)
NO_DEFAULT = object()  # Option.add_to without a default: the parser's own (fairseq's SUPPRESS)
_INTEGER_RE = re.compile(r"[+-]?\d+")


class OptionError(ValueError):
    """A value resnmt refuses, from Python or on a command line alike: the message is the one
    line a command prints after ``PROG: error:`` (``one_line``: printed so, alone, where it
    ends a process uncaught: the ``one-line-errors`` patch of resnmt.fairseq_patches)."""

    one_line = True


def shown(value: Any) -> str:
    """A value as a model flag's error shows it: strings quoted, floats as %g."""
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def allowed(kind: str, minimum: Optional[float] = None, above: Optional[float] = None, listed: bool = False) -> str:
    """What an ``int`` or ``number`` option takes: "an integer >= 1", "a real number > 0", ...;
    ``listed``: "comma-separated integers >= 1", ..."""
    if listed:
        what = "comma-separated integers" if kind == "int" else "comma-separated real numbers"
    else:
        what = "an integer" if kind == "int" else "a real number"
    if minimum is not None:
        return f"{what} >= {_bound(minimum)}"
    return f"{what} > {_bound(above)}" if above is not None else what


def bounded(kind: str, value: Any, minimum: Optional[float] = None, above: Optional[float] = None):
    """``value`` (a number, or its text) as an int (``kind`` "int") or a finite float within the
    bound, else a ValueError "'VALUE': must be ALLOWED" (without the flag: the caller names it)."""
    result = None
    if not isinstance(value, bool):
        if kind == "int":
            if isinstance(value, int):
                result = value
            elif isinstance(value, str) and _INTEGER_RE.fullmatch(value.strip()):
                result = int(value)
        else:
            try:
                result = float(value)
            except (TypeError, ValueError):
                pass
            if result is not None and not math.isfinite(result):
                result = None
    if result is None or (minimum is not None and result < minimum) or (above is not None and not result > above):
        raise ValueError(f"'{value}': must be {allowed(kind, minimum, above)}")
    return result


def listed_values(kind: str, value: Any, minimum: Optional[float] = None, above: Optional[float] = None) -> list:
    """``value`` (comma-separated text, or a list) as a list of ``kind`` values within the
    bound, in the order given, each once; else a ValueError "'VALUE': must be comma-separated
    ...". Nothing but commas and spaces is no value, and refused alike."""
    items = [x.strip() for x in value.split(",")] if isinstance(value, str) else list(value)
    try:
        values = [bounded(kind, item, minimum, above) for item in items if item != ""]
    except ValueError:
        values = []
    if not values:
        raise ValueError(f"'{value}': must be {allowed(kind, minimum, above, listed=True)}")
    return list(dict.fromkeys(values))


def one_of(value: Any, choices: Sequence[str]):
    """``value`` if it is one of ``choices``, else a ValueError "'VALUE' is not one of: A B"."""
    if value not in choices:
        raise ValueError(f"'{value}' is not one of: {' '.join(choices)}")
    return value


@dataclass(frozen=True)
class Option:
    """One option: ``--sas-gate-dim`` for ``dest`` sas_gate_dim (a command's field name fills
    ``dest`` when its request is read: :func:`field_options`).

    ``kind`` is one of :data:`KINDS`; an ``int`` or ``number`` may be bounded below,
    ``minimum`` (>=) or ``above`` (>), and ``listed``: comma-separated values (``1,4,8``),
    a list in the order given; a ``choice`` takes one of ``choices``.
    ``owners_only`` (a connection kind's flag): setting it with a connection kind that does
    not declare it is an error (``hint`` says why).

    On a command line: ``positional``, an operand named ``dest`` (``CHECKPOINT``), not a
    ``--flag``; ``required``, a flag that must be given; ``nargs``, argparse's (``"?"``,
    ``"*"``, ``"+"``); ``const``, the value of the flag given alone (with ``nargs`` "?");
    ``parse``, a check of the option's own for a ``str`` no kind describes (the text in,
    the value out, a ValueError naming the value and what is allowed); ``repeat``, a flag
    that may be given again, each value appended to a list (the default: a list); ``env``,
    an environment variable whose value, set and not empty, replaces the default
    (:meth:`command_default`).
    """

    dest: str = ""
    default: Any = None
    help: str = ""
    kind: str = "str"
    minimum: Optional[float] = None
    above: Optional[float] = None
    choices: Tuple[str, ...] = ()
    metavar: Optional[str] = None
    owners_only: bool = False
    hint: str = ""
    positional: bool = False
    required: bool = False
    nargs: Optional[str] = None
    const: Any = None
    parse: Optional[Callable[[str], Any]] = None
    repeat: bool = False
    listed: bool = False
    env: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"option kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.nargs not in NARGS:
            raise ValueError(f"option nargs {self.nargs!r}: choose one of {', '.join(map(str, NARGS))}")
        if self.parse is not None and self.kind != "str":
            raise ValueError(f"option {self.dest!r}: a check of its own (parse) takes a str, not a {self.kind}")
        if self.listed and self.kind not in ("int", "number"):
            raise ValueError(f"option {self.dest!r}: a comma-separated list (listed) holds an int or a number, "
                             f"not a {self.kind}")
        object.__setattr__(self, "choices", tuple(self.choices))

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def allowed(self) -> str:
        return allowed(self.kind, self.minimum, self.above, self.listed)

    def check(self, value: Any) -> Any:
        """``value`` (command-line text or a typed value) checked and converted as declared,
        else a ValueError naming the value and what is allowed (not the flag)."""
        if self.listed:
            return listed_values(self.kind, value, self.minimum, self.above)
        if self.kind in ("int", "number"):
            return bounded(self.kind, value, self.minimum, self.above)
        if self.kind == "choice":
            return one_of(value, self.choices)
        if self.kind == "path":
            return Path(value)
        if self.kind == "switch":
            return bool(value)
        return self.parse(value) if self.parse is not None else value

    # ------------------------------------------------------------------ on a parser

    def add_to(self, parser, default: Any = NO_DEFAULT, checked: bool = True) -> None:
        """Add the option to ``parser`` (a parser or an argument group). Without ``default``
        the parser's own applies (a model flag: fairseq's SUPPRESS); a command passes its
        default (:attr:`default`, or None for "not given"). ``checked``: argparse checks the
        value as declared (``choices``: argparse's words, which name the closest choices;
        a number: "invalid value 'VALUE': must be ..."); otherwise the text is kept, for
        :meth:`convert` after parsing."""
        kwargs = dict(help=self.help, metavar=self.metavar, nargs=self.nargs, const=self.const)
        if self.kind == "switch":
            kwargs = dict(help=self.help, action="store_true")
        elif checked and self.kind == "choice":
            kwargs["choices"] = self.choices
        elif checked and (self.kind != "str" or self.parse is not None):
            kwargs["type"] = self._argparse_type
        if self.repeat:
            kwargs["action"] = "append"
        if default is not NO_DEFAULT:
            kwargs["default"] = list(default) if self.repeat and default is not None else default
        if self.required:
            kwargs["required"] = True
        names = (self.dest,) if self.positional else (self.flag,)
        parser.add_argument(*names, **{k: v for k, v in kwargs.items() if v is not None or k == "default"})

    def command_default(self) -> Any:
        """The default a command line takes: ``$env`` where set and not empty, else :attr:`default`."""
        return (os.environ.get(self.env) if self.env else None) or self.default

    def _argparse_type(self, text: str):
        try:
            return self.check(text)
        except ValueError as e:
            if self.kind in ("int", "number"):
                raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {self.allowed}") from None
            raise argparse.ArgumentTypeError(str(e)) from None

    def read(self, args) -> Any:
        """The flag's value in ``args`` (a namespace or config), or its default where unset."""
        value = getattr(args, self.dest, None)
        return self.default if value is None else value

    def problem(self, value: Any) -> Optional[str]:
        """What the command line would refuse in ``value`` (a value built in Python), or None.
        None passes only where it is the default (the option left unset)."""
        if value is None and self.default is None:
            return None
        try:
            self.check(value)
        except ValueError:
            if self.kind == "choice":
                return f"{self.flag} {value!r}: choose one of {', '.join(self.choices)}"
            return f"{self.flag} {shown(value)} is invalid: it must be {self.allowed}"
        return None

    # ------------------------------------------------------------------ as a command's option

    def field(self):
        """The dataclass field of a command's request: this option's default, and the option."""
        return dataclasses.field(default=self.default, metadata={"option": self})

    def convert(self, value: Any) -> Any:
        """:meth:`check`, its ValueError naming the flag: "--flag 'VALUE': must be ..."."""
        try:
            return self.check(value)
        except ValueError as e:
            raise ValueError(f"{self.flag} {e}") from None


def add_to_command(parser, options: Sequence[Option], checked: bool = True) -> None:
    """Each of ``options`` on a command's ``parser`` (or argument group), in order, with the
    command's default (:meth:`Option.command_default`); ``checked``: see :meth:`Option.add_to`."""
    for option in options:
        option.add_to(parser, default=option.command_default(), checked=checked)


def field_options(cls) -> Tuple[Option, ...]:
    """The options of the dataclass ``cls`` (fields made with :meth:`Option.field`), each with
    its field's name as ``dest``, in declaration order."""
    return tuple(dataclasses.replace(f.metadata["option"], dest=f.name)
                 for f in dataclasses.fields(cls) if "option" in f.metadata)

# ------------------------------------------------------------ a bad value's closest valid names


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
    error, and other parsers, as before. Applied once, by resnmt.fairseq_patches."""
    error = argparse.ArgumentParser.error

    def short_error(self, message):
        if "--user-dir" not in self._option_string_actions or not _INVALID_CHOICE_RE.match(message):
            return error(self, message)
        self.exit(2, f"{self.prog}: error: {short_choice_error(message) or with_closest_names(message, self)}\n")

    argparse.ArgumentParser.error = short_error
