"""``resnmt-train``: ``fairseq-train --user-dir <resnmt>`` whose ``--help`` lists the model's flags.

Stock ``fairseq-train --help`` stops at the first parsing pass, before any model's
flags are added, so it never shows them (for fairseq's own ``transformer`` neither).
``resnmt-train --arch ARCH --help`` adds the flags of ARCH's model (all of fairseq's
Transformer flags plus resnmt's ``--residual``, ``--skip-lambda``, ``--sas-*``,
``--highway-bias-init``, ``--normalized-activation*`` ...) before printing help.
Otherwise it is exactly ``fairseq-train``, with ``--user-dir`` set to the installed
resnmt package (absolute, so checkpoints load from any directory) unless given.
"""
import os
import sys

from fairseq.models import ARCH_MODEL_REGISTRY

import resnmt

HELP_FLAGS = ("-h", "--help")
DEFAULT_ARCH = "resnmt_transformer"


def requested_arch(argv) -> str:
    for i, arg in enumerate(argv):
        if arg == "--arch" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--arch="):
            return arg.split("=", 1)[1]
    return DEFAULT_ARCH


def add_model_flags_for_help(parser) -> None:
    """fairseq ``modify_parser`` hook: with --help, add the model flags before fairseq's first parse."""
    if not any(flag in sys.argv[1:] for flag in HELP_FLAGS):
        return
    model = ARCH_MODEL_REGISTRY.get(requested_arch(sys.argv[1:]), ARCH_MODEL_REGISTRY[DEFAULT_ARCH])
    model.add_args(parser.add_argument_group("Model-specific configuration"))


def with_user_dir(argv):
    if any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        return list(argv)
    return ["--user-dir", os.path.dirname(os.path.abspath(resnmt.__file__)), *argv]


def main():
    from fairseq_cli import train

    sys.argv = [sys.argv[0], *with_user_dir(sys.argv[1:])]
    train.cli_main(modify_parser=add_model_flags_for_help)


if __name__ == "__main__":
    main()
