"""resnmt-study: the curves study of the connection kinds, and a kind's verdict against it.

    resnmt-study curves --list                  # the study's runs: done, partial, missing
    resnmt-study curves --workers 2 --threads 1 # train and score what is missing (resumable)
    resnmt-study verdict layerscale --quick     # a kind of your own beside the shipped rows

Each command's own help: resnmt-study COMMAND --help.
"""
import argparse
import sys

from resnmt.cli import study_curves, study_verdict
from resnmt.cli.common import OneLineErrorParser
from resnmt.options import Option, add_to_command

COMMANDS = {"curves": study_curves, "verdict": study_verdict}
OPERANDS = (
    Option("command", kind="choice", choices=tuple(COMMANDS), positional=True,
           help="curves: train and score the study's runs; verdict: a kind beside the shipped rows"),
    Option("args", nargs=argparse.REMAINDER, positional=True, help="the command's arguments (resnmt-study COMMAND --help)"),
)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = OneLineErrorParser(prog="resnmt-study", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(p, OPERANDS)
    a = p.parse_args(argv)
    return COMMANDS[a.command].main(a.args)


if __name__ == "__main__":
    sys.exit(main())
