"""resnmt-average: average the parameters of fairseq checkpoints.

The papers decode with the average of the last 10 checkpoints:

    resnmt-average --inputs checkpoints/ --num-epoch-checkpoints 10 \\
        --output checkpoints/checkpoint.avg10.pt

It prints the update of every checkpoint it averages. With fewer checkpoints than asked it
averages those there are, as ``resnmt-experiment`` does, and a note (the last line) says
how many; another note says when a newer ``checkpoint_last.pt`` was left out
(``--include-last`` takes it). A file that is not a checkpoint is refused before any is
loaded, on one line naming it and what is wrong with it.

Floating-point tensors of ``model`` (parameters and float buffers) are averaged in
float64 and cast back to their dtype; integer and bool buffers (counters, masks)
are copied from the newest checkpoint, as is everything outside ``model`` (cfg /
args, extra_state, optimizer_history, task_state) except the optimizer state
(``last_optimizer_state``), which is dropped: the output is for decoding
(``fairseq-generate --path``); to train from it use ``--reset-optimizer``.
"""
import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from resnmt.cli.common import OneLineErrorParser
from resnmt.options import Option, add_to_command
from resnmt.checkpoints.averaging import (AverageError, average_checkpoints, checkpoint_updates, describe, save_atomic,
                                       select_checkpoints)

PROG = "resnmt-average"

INPUTS = Option("inputs", nargs="+", required=True, metavar="PATH", help=(
    "checkpoint files, in order oldest to newest (the last one is the 'newest'), or, "
    "with --num-epoch-checkpoints/--num-update-checkpoints, one directory of fairseq checkpoints"))
OUTPUT = Option("output", required=True, metavar="FILE", help=(
    "where to write the averaged checkpoint (written atomically; parent directories are created)"))
SELECTIONS = (  # one or the other
    Option("num_epoch_checkpoints", kind="int", metavar="N", help=(
        "average the N highest-numbered checkpointE.pt files in the directory (all there are when fewer, "
        "as resnmt-experiment does, with a note naming how many)")),
    Option("num_update_checkpoints", kind="int", metavar="N", help=(
        "average the N highest-numbered checkpoint_E_U.pt files in the directory (ordered by the update "
        "number U; needs --save-interval-updates in training; all there are when fewer, with a note)")),
)
INCLUDE_LAST = Option("include_last", False, kind="switch", help=(
    "with --num-epoch-checkpoints/--num-update-checkpoints: count checkpoint_last.pt as the newest when it "
    "was saved after the newest numbered one (a run stopped by --max-update mid-epoch saves its last update "
    "there only); without it, a note says when it was left out"))
UPPER_BOUND = Option("checkpoint_upper_bound", kind="int", metavar="K", help=(
    "with --num-epoch-checkpoints: ignore epochs > K; with --num-update-checkpoints: ignore updates > K"))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog=PROG,
        description=(
            "Average the model parameters of fairseq checkpoints (the papers decode with the\n"
            "average of the last 10). Floating-point tensors are averaged in float64 and cast back\n"
            "to their dtype; integer/bool buffers and all non-model fields (cfg, extra_state, ...)\n"
            "come from the newest checkpoint; the optimizer state is dropped. The output loads in\n"
            "fairseq-generate --user-dir resnmt --path FILE."
        ),
        epilog=(
            "examples:\n"
            "  resnmt-average --inputs ckpt/ --num-epoch-checkpoints 10 --output ckpt/avg10.pt\n"
            "  resnmt-average --inputs ckpt/ --num-update-checkpoints 5 "
            "--checkpoint-upper-bound 40000 --output avg.pt\n"
            "  resnmt-average --inputs ckpt/checkpoint8.pt ckpt/checkpoint9.pt ckpt/checkpoint10.pt "
            "--output avg.pt"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_to_command(p, (INPUTS, OUTPUT))
    add_to_command(p.add_mutually_exclusive_group(), SELECTIONS)
    add_to_command(p, (INCLUDE_LAST, UPPER_BOUND))
    return p


def resolve_inputs(args) -> Tuple[List[Path], List[Optional[int]], List[str]]:
    """The checkpoints to average, oldest first, each one's update, and the notes on what
    the choice could not give (resnmt.checkpoints.averaging.Selection, resnmt-experiment's too).
    Every checkpoint is read (its tensors memory-mapped), so that a file that is not one is
    refused before any is loaded."""
    inputs = [Path(p) for p in args.inputs]
    n, by = args.num_epoch_checkpoints, "epoch"
    if args.num_update_checkpoints is not None:
        n, by = args.num_update_checkpoints, "update"
    if n is not None:
        if len(inputs) != 1:
            raise AverageError(
                f"--num-{by}-checkpoints takes exactly one directory in --inputs, got {len(inputs)} paths"
            )
        if not inputs[0].exists():
            raise AverageError(f"no such directory: {inputs[0]}")
        if args.include_last and args.checkpoint_upper_bound is not None:
            raise AverageError("--include-last and --checkpoint-upper-bound exclude each other")
        selection = select_checkpoints(inputs[0], n, by, args.checkpoint_upper_bound, args.include_last)
        return selection.paths, selection.updates, selection.notes(f"--num-{by}-checkpoints", "--include-last")
    if args.include_last:
        raise AverageError("--include-last needs --num-epoch-checkpoints or --num-update-checkpoints")
    if args.checkpoint_upper_bound is not None:
        raise AverageError("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    for path in inputs:
        if path.is_dir():
            raise AverageError(
                f"{path} is a directory: pass --num-epoch-checkpoints N or --num-update-checkpoints N "
                "to pick checkpoints from it, or list the checkpoint files"
            )
        if not path.is_file():
            raise AverageError(f"no such checkpoint file: {path}")
    seen = set()
    for path in inputs:
        key = path.resolve()
        if key in seen:
            raise AverageError(f"{path} is given twice in --inputs")
        seen.add(key)
    return inputs, [checkpoint_updates(p) for p in inputs], []


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)

    def log(msg):
        print(f"{PROG}: {msg}", file=sys.stderr, flush=True)

    try:
        output = Path(args.output)
        if output.is_dir():
            raise AverageError(f"--output {output} is a directory; expected a file name")
        paths, updates, notes = resolve_inputs(args)
        if any(output.resolve() == p.resolve() for p in paths):
            raise AverageError(f"--output {output} is one of the inputs; choose another file")
        log(f"averaging {len(paths)} checkpoint(s): {', '.join(map(describe, paths, updates))}")
        state = average_checkpoints(paths, log=log)
        save_atomic(state, output)
    except AverageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    n_avg = sum(1 for v in state["model"].values() if torch.is_tensor(v) and v.is_floating_point())
    n_kept = len(state["model"]) - n_avg
    log(f"wrote {output}: {n_avg} floating-point tensors averaged over {len(paths)} checkpoints, "
        f"{n_kept} other entries from {paths[-1].name}")
    for note in notes:  # after everything else: the last lines printed
        log(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
