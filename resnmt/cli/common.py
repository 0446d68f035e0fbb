"""Pieces shared by resnmt's command-line tools: fairseq's logging set-up, the single-step
tools' parser (one-line errors), and the parsers and messages of the pipeline's commands (``resnmt-experiment``, ``scripts/train.sh``,
``scripts/demo.sh``): ``[NAME] ...`` lines on stderr, a bad option one ``[NAME] error:``
line (the last) and exit status 2, a failed step one error line and exit status 1."""
import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Callable, List, NoReturn, Sequence, Tuple

from resnmt.experiment.errors import ExperimentError, UsageError
from resnmt.options import with_closest_names

# fairseq_cli.train's root logger set-up
FAIRSEQ_LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
FAIRSEQ_LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"


def fairseq_logging(stream=sys.stdout) -> None:
    """The root logger as ``fairseq-train`` sets it up (its format, level ``$LOGLEVEL`` or
    INFO, on ``stream``), replacing the one importing fairseq leaves: fairseq's
    ``models/wav2vec/wav2vec2_classification.py`` calls ``logging.basicConfig(level=DEBUG)``
    at import, so a command that imports fairseq before configuring logging (every resnmt
    command: ``import resnmt`` does) would print hydra's DEBUG lines and fairseq's log in
    another format."""
    logging.basicConfig(format=FAIRSEQ_LOG_FORMAT, datefmt=FAIRSEQ_LOG_DATEFMT,
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=stream, force=True)

# ------------------------------------------------- the single-step tools' parser and messages


def exit_usage_error(prog: str, message: str) -> NoReturn:
    """A single-step tool's usage error: one line, the last, exit status 2."""
    sys.stderr.write(f"{prog}: error: {message} (see --help)\n")
    sys.exit(2)


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit status 2), naming the
    bad value and the closest valid names, instead of the usage block followed by the message."""

    def error(self, message):
        exit_usage_error(self.prog, with_closest_names(message, self))

# ------------------------------------------------- the pipeline commands' parsers and messages


def logger(name: str) -> Callable[[str], None]:
    return lambda message: print(f"[{name}] {message}", file=sys.stderr, flush=True)


class PipelineParser(argparse.ArgumentParser):
    """The pipeline commands' parser: a usage error is one ``[NAME] error:`` line naming the
    option (exit status 2), beside their ``[NAME]`` progress lines; help is ``text``, the
    command's own (``-h``/``--help`` prints it and exits). (The single-step tools' is
    ``OneLineErrorParser``: ``PROG: error:``.)"""

    def __init__(self, prog: str, usage: str, text: str):
        super().__init__(prog=prog, usage=usage, allow_abbrev=False)
        self.text = text

    def format_help(self) -> str:
        return f"Usage: {self.usage}\n\n{self.text}"

    def error(self, message):
        usage_error(self.prog, with_closest_names(message, self))


def command_name(prog: str) -> str:
    """The [NAME] of a command's messages: resnmt-experiment, train (scripts/train.sh, or
    python -m resnmt.cli.experiment train), demo (scripts/demo.sh, python -m resnmt.cli.demo)."""
    return prog.split()[-1].split(".")[-1] if " " in prog else Path(prog).stem


def usage_error(prog: str, message: str):
    name = command_name(prog)
    print(f"[{name}] error: {message} (see {prog} --help)", file=sys.stderr)
    sys.exit(2)


def split_extra(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Options before the first ``--``, and the fairseq-train flags after it."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse(parser: PipelineParser, argv: Sequence[str]):
    own, extra = split_extra(argv)
    args = parser.parse_args(own)
    args.extra = extra
    return args


def report_warnings(records: Sequence[dict], log) -> None:
    """The warnings of finished experiments, after everything else: the last lines printed."""
    for r in records:
        for warning in r.get("warnings") or ():
            log(f"warning: {r['arch']}: {warning}" if len(records) > 1 else f"warning: {warning}")


def run_guarded(prog: str, body: Callable[[], int]) -> int:
    """``body()``, with a UsageError as a usage error and an ExperimentError as one error line."""
    try:
        return body()
    except UsageError as e:
        usage_error(prog, str(e))
    except ExperimentError as e:
        print(f"[{command_name(prog)}] error: {e}", file=sys.stderr)
        return 1
