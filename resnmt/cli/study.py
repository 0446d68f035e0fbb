"""resnmt-study: a connection kind of your own under the study's protocol, beside the
shipped rows (trained to each milestone, scored, compared paired by seed).

    resnmt-study verdict layerscale --quick     # a first look: 2+2 to 600 updates
    resnmt-study verdict layerscale             # the protocol

Each command's own help: resnmt-study COMMAND --help.
"""
import argparse
import sys

from resnmt.cli import study_verdict
from resnmt.cli.common import OneLineErrorParser
from resnmt.options import Option, add_to_command

COMMANDS = {"verdict": study_verdict}
OPERANDS = (
    Option("command", kind="choice", choices=tuple(COMMANDS), positional=True,
           help="verdict: a kind beside the shipped rows"),
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
