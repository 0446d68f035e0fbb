"""The two ways an experiment stops: a step that failed and a bad option value."""
from typing import Callable


class ExperimentError(RuntimeError):
    """A step failed or cannot start; printed as one error line (exit status 1)."""


class UsageError(ExperimentError):
    """A bad option value, found before any work (exit status 2)."""


Log = Callable[[str], None]


def quiet(_message: str) -> None:
    """A ``Log`` that drops its messages."""
