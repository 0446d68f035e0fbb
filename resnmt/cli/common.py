"""Pieces shared by resnmt's command-line tools."""
import logging
import os
import sys

from resnmt.shared import OneLineErrorParser, one_line_errors  # noqa: F401  (the commands' parsers)

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
