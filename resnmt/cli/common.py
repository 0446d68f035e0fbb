"""Pieces shared by resnmt's command-line tools."""
import argparse
import logging
import os
import sys
import types

# fairseq_cli.train's root logger set-up
FAIRSEQ_LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
FAIRSEQ_LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"


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


def fairseq_logging(stream=sys.stdout) -> None:
    """The root logger as ``fairseq-train`` sets it up (its format, level ``$LOGLEVEL`` or
    INFO, on ``stream``), replacing the one importing fairseq leaves: fairseq's
    ``models/wav2vec/wav2vec2_classification.py`` calls ``logging.basicConfig(level=DEBUG)``
    at import, so a command that imports fairseq before configuring logging (every resnmt
    command: ``import resnmt`` does) would print hydra's DEBUG lines and fairseq's log in
    another format."""
    logging.basicConfig(format=FAIRSEQ_LOG_FORMAT, datefmt=FAIRSEQ_LOG_DATEFMT,
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=stream, force=True)
