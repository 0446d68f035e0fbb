"""fairseq-train's own parser, answering a bad flag in one line, and the check of a training
command's flags with it, and of an arch's name.

``training_parser`` is fairseq's training parser (``fairseq.options.get_training_parser``)
whose errors are one line naming the bad value and the closest valid names
(``resnmt.options.with_closest_names``; a wrong ``--arch``: resnmt's closest archs, not
fairseq's ~180 names) instead of fairseq's ~185 lines of usage: ``resnmt-train`` parses
its command line with it. ``check_training_flags`` parses the arguments of a planned
``fairseq-train`` command with it, resnmt's user dir loaded (so ``--residual`` and every
model flag are known), as fairseq-train will at start-up: the training command and
``resnmt-experiment`` refuse a bad flag after ``--`` before anything starts.
"""
import contextlib
import io
from typing import Callable, Optional, Sequence

from resnmt.experiment.errors import UsageError
from resnmt.options import ARCHS_LISTED, closest, short_choice_error, with_closest_names


def training_parser(error: Callable[[str], None]):
    """fairseq's training parser whose usage errors call ``error(message)``, ``message`` one
    line naming the bad value and the closest valid names."""
    from fairseq import options

    parser = options.get_training_parser()

    def one_line(message):
        error(short_choice_error(message) or with_closest_names(message, parser))

    parser.error = one_line
    return parser


def closest_archs(arch: str, known: Sequence[str]) -> str:
    """"closest: A B C; " for the names among ``known`` that look like a mistyped ``arch``
    ('' when none does)."""
    close = closest(arch, known)
    return f"closest: {' '.join(close)}; " if close else ""


def check_arch(arch: str) -> None:
    """``arch`` must be an arch of resnmt_transformer or fairseq's ``transformer``."""
    import resnmt  # noqa: F401  registers the archs
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    allowed = sorted(a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m == "resnmt_transformer") + ["transformer"]
    if arch not in allowed:
        raise UsageError(f"ARCH '{arch}' is not a resnmt_transformer arch or 'transformer'; "
                         f"{closest_archs(arch, allowed)}{ARCHS_LISTED}")


class _Refused(Exception):
    pass


def _refuse(message: str) -> None:
    raise _Refused(message)


def check_training_flags(args: Sequence[str], prog: str = "fairseq-train") -> None:
    """Parse a ``fairseq-train`` command's arguments ``args`` (DATA and the flags, its
    ``--user-dir`` included) with fairseq's own parser, as ``fairseq-train`` does at start-up;
    a flag it would stop on is a UsageError whose one line names the bad value and the
    closest valid names. Nothing is read or written."""
    from fairseq import options

    from resnmt.training.quiet import hide_user_dir_notice

    hide_user_dir_notice()
    printed = io.StringIO()
    message: Optional[str] = None
    try:
        with contextlib.redirect_stderr(printed):
            options.parse_args_and_arch(training_parser(_refuse), input_args=list(args))
    except _Refused as e:
        message = str(e)
    except SystemExit:  # the arch functions' own checks (--skip-lambda ...) print one "PROG: error:" line
        lines = printed.getvalue().strip().splitlines()
        message = lines[-1].split(": error: ", 1)[-1] if lines else "it stops at start-up"
    if message is not None:
        raise UsageError(f"{prog}: {message}")
