"""``resnmt-train``: ``fairseq-train --user-dir <resnmt>`` whose ``--help`` lists the model's flags.

Stock ``fairseq-train --help`` stops at the first parsing pass, before any model's
flags are added, so it never shows them (for fairseq's own ``transformer`` neither).
``resnmt-train --arch ARCH --help`` adds the flags of ARCH's model (all of fairseq's
Transformer flags plus resnmt's ``--residual``, ``--skip-lambda``, ``--sas-*``,
``--highway-bias-init``, ``--normalized-activation*`` ...) before printing help.
Otherwise it is exactly ``fairseq-train``, with ``--user-dir`` set to the installed
resnmt package (absolute, so checkpoints load from any directory) unless given, and
one difference: ``--bf16`` trains in bf16 on this machine's device (CUDA, or the CPU
with ``--cpu``) where fairseq 0.12 would send it to a TPU (see resnmt/training/bf16.py).
A bad flag is reported on one line (the last), naming the value and what is allowed,
instead of under fairseq's ~185 lines of usage (a wrong ``--arch``: the closest names),
as are a data directory that is missing or holds no binarized data (a prepared directory
given instead of its ``bin/``: the ``bin/`` named) and a missing batch size, before
anything runs;
hydra's and torch's deprecation notices are not printed, nor, unless ``--verbose``,
fairseq's dumps of the whole configuration and model (resnmt/training/quiet.py).
"""
import os
import sys

from fairseq.models import ARCH_MODEL_REGISTRY

import resnmt
from resnmt.cli.common import exit_usage_error, fairseq_logging
from resnmt.experiment.fairseq_flags import training_parser
from resnmt.experiment.schedule import flag_value
from resnmt.training.quiet import hide_fairseq_dumps, hide_user_dir_notice

PROG = "resnmt-train"

HELP_FLAGS = ("-h", "--help")
DEFAULT_ARCH = "resnmt_transformer"


def requested(argv, flag: str, default=None):
    """The value of ``flag`` on the command line ``argv`` (the last one given), or ``default``."""
    return flag_value(argv, flag, default)


def requested_arch(argv) -> str:
    return requested(argv, "--arch", DEFAULT_ARCH)


def add_model_flags_for_help(parser) -> None:
    """fairseq ``modify_parser`` hook: with --help, add the flags of the model, and of the
    --task and --optimizer given (``adam_fused``'s --adam-kernel, ``resnmt_translation``'s
    --compile-layers ...), before fairseq's first parse prints the help."""
    if not any(flag in sys.argv[1:] for flag in HELP_FLAGS):
        return
    from fairseq.dataclass.utils import gen_parser_from_dataclass
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    model = ARCH_MODEL_REGISTRY.get(requested_arch(sys.argv[1:]), ARCH_MODEL_REGISTRY[DEFAULT_ARCH])
    model.add_args(parser.add_argument_group("Model-specific configuration"))
    for flag, registry, title in (("--task", TASK_DATACLASS_REGISTRY, "Task-specific configuration"),
                                  ("--optimizer", OPTIMIZER_DATACLASS_REGISTRY, "Optimizer-specific configuration")):
        dataclass = registry.get(requested(sys.argv[1:], flag))
        if dataclass is not None:
            gen_parser_from_dataclass(parser.add_argument_group(title), dataclass())


def check_before_training(parser, args) -> None:
    """What fairseq-train would stop on only after setting up (a traceback, its save dir made),
    as one ``parser.error`` line before anything runs: a data directory that is not there
    or holds no binarized data (a directory prepared by resnmt-prepare: its bin/ named), and
    no batch size."""
    from resnmt.data.manifest import binarized_data_problem

    for data in str(getattr(args, "data", "")).split(os.pathsep):  # fairseq's shards: DIR1:DIR2
        problem = binarized_data_problem(data)  # dict.*.txt: the translation tasks' data; any task's directory
        if problem and ("translation" in args.task or not os.path.isdir(data)):
            parser.error(problem)
    if args.max_tokens is None and args.batch_size is None:
        parser.error("no batch size: pass --max-tokens N (tokens per batch, e.g. --max-tokens 4096) or "
                     "--batch-size N (sentences per batch)")


def check_kinds_first(argv) -> None:
    """A kind of the user's is imported, built tiny and run once before anything runs
    (resnmt.testing.preflight): what is wrong is one line, exit status 2."""
    if any(flag in argv for flag in HELP_FLAGS):
        return
    from resnmt.testing.preflight import problem

    found = problem(argv)
    if found:
        sys.stderr.write(f"{PROG}: error: {found}\n")
        sys.exit(2)


def with_user_dir(argv):
    if any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        return list(argv)
    return ["--user-dir", os.path.dirname(os.path.abspath(resnmt.__file__)), *argv]


def main():
    """``fairseq_cli.train.cli_main`` with bf16 untied from TPUs between parsing and training."""
    import torch
    from fairseq import options
    from fairseq.distributed import utils as distributed_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    from resnmt.training.attention import parse_sdpa_backends
    from resnmt.training.bf16 import untie_bf16_from_tpu
    from resnmt.training.compile import check_compile_options

    verbose = "--verbose" in sys.argv[1:]  # resnmt-train's own flag: fairseq's configuration and model dumps too
    argv = with_user_dir([a for a in sys.argv[1:] if a != "--verbose"])
    check_kinds_first(argv)
    sys.argv = [sys.argv[0], *argv]
    fairseq_logging()  # fairseq-train's log format and level (importing fairseq left DEBUG behind)
    if not verbose:
        hide_fairseq_dumps()
    hide_user_dir_notice()  # resnmt, imported above, is the --user-dir fairseq imports again
    # a bad flag: one line, not 185 of usage, naming the closest names (a wrong --arch: not 181 of them)
    parser = training_parser(lambda message: exit_usage_error(PROG, message))
    try:
        args = options.parse_args_and_arch(parser, modify_parser=add_model_flags_for_help)
    except RuntimeError as e:  # fairseq's bare RuntimeError() for a missing --arch
        if str(e) or any(a == "--arch" or a.startswith("--arch=") for a in argv):
            raise
        parser.error("the following arguments are required: --arch (e.g. --arch transformer_sas_base)")
    check_before_training(parser, args)
    untie_bf16_from_tpu(args, argv)
    if getattr(args, "compile_layers", False):  # the task checks it too; here it is one line, before any loading
        try:
            check_compile_options(args.compile_backend, args.compile_mode)
        except ValueError as e:
            parser.error(str(e))
    if getattr(args, "sdpa_backends", ""):  # likewise
        try:
            parse_sdpa_backends(args.sdpa_backends)
        except ValueError as e:
            parser.error(str(e))
    cfg = convert_namespace_to_omegaconf(args)
    if getattr(args, "fast_path", False):  # the trainer checks it too; here it is one line, before any loading
        from resnmt.training.fast.step import unsupported

        reason = unsupported(cfg)
        if reason:
            parser.error(reason)
    if cfg.common.use_plasma_view:
        from fairseq.data.plasma_utils import PlasmaStore

        server = PlasmaStore(path=cfg.common.plasma_path)
        train.logger.info(f"Started plasma server pid {server.server.pid} {cfg.common.plasma_path}")
    if args.profile:
        with torch.cuda.profiler.profile():
            with torch.autograd.profiler.emit_nvtx():
                distributed_utils.call_main(cfg, train.main)
    else:
        distributed_utils.call_main(cfg, train.main)


if __name__ == "__main__":
    main()
