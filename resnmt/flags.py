"""How resnmt declares a model flag: one :class:`Flag` per flag, for every kind, stream and activation.

A flag is declared once, where the thing it configures is defined: a connection kind's
flags on its class (``flags``), the model-wide flags (``--residual``, ``--normalization``,
the FFN activation's) in :mod:`resnmt.models.options`. From the declaration come the
argparse argument (:meth:`Flag.add_to`), the value a configuration that lacks the flag
reads (:attr:`Flag.default`) and the check a value built in Python gets
(:meth:`Flag.problem`), so the command line and a spec made in code refuse the same values
with the same words.

fairseq parses model flags with ``argparse.SUPPRESS`` as the default, so no flag is added
with a default: an unset flag is absent from ``args``, and whoever reads it takes
:attr:`Flag.default` (:meth:`Flag.read`).
"""
import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple


def positive(cast, allowed: str):
    """An argparse ``type``: ``cast(text)`` if that is > 0, else one error naming the value."""

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {allowed}")
        return value

    parse.allowed = allowed
    return parse


positive_float = positive(float, "a real number > 0")
positive_int = positive(int, "an integer > 0")


def shown(value: Any) -> str:
    """A value as an error message shows it: strings quoted, floats as %g."""
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Flag:
    """One command-line flag: ``--sas-gate-dim`` for ``dest`` sas_gate_dim.

    ``default`` is what a configuration without the flag reads; ``check`` is the argparse
    ``type`` for values (its ``allowed`` text, see :func:`positive`, is reused by
    :meth:`problem`); ``choices`` limits the values; a ``switch`` is a store_true flag.
    ``owners_only``: setting it with a connection kind that does not declare it is an
    error (``hint`` says why).
    """

    dest: str
    default: Any
    help: str
    check: Optional[Callable[[str], Any]] = None
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None
    switch: bool = False
    owners_only: bool = False
    hint: str = ""

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")

    def add_to(self, parser) -> None:
        """Add the flag to ``parser`` (without a default; fairseq's model flags are SUPPRESSed)."""
        if self.switch:
            parser.add_argument(self.option, action="store_true", help=self.help)
            return
        kwargs = dict(help=self.help)
        if self.check is not None:
            kwargs["type"] = self.check
        if self.choices is not None:
            kwargs["choices"] = self.choices
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        parser.add_argument(self.option, **kwargs)

    def read(self, args) -> Any:
        """The flag's value in ``args`` (a namespace or config), or its default where unset."""
        value = getattr(args, self.dest, None)
        return self.default if value is None else value

    def problem(self, value: Any) -> Optional[str]:
        """What argparse would refuse in ``value`` (for a value built in Python), or None."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"{self.option} {value!r}: choose one of {', '.join(self.choices)}"
        allowed = getattr(self.check, "allowed", None)
        if allowed is not None and not value > 0:
            return f"{self.option} {shown(value)} is invalid: it must be {allowed}"
        return None
