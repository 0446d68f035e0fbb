#!/usr/bin/env python
"""Does every connection kind train with ``fairseq-train --fp16`` (or ``--bf16``)?

Each kind of the quality table (``benchmarks/quality.py``'s rows, fairseq's own
``transformer`` included) trains for ``--updates`` updates on Multi30k at the papers'
base size (6+6 layers, d=512) in half precision. fairseq's dynamic loss scaler skips an
update whose gradients overflow and halves its scale; this counts those skipped updates
(``NOTE: gradient overflow detected`` in fairseq's log), records the final loss scale and
training loss, and whether the run ended (``Minimum loss scale reached`` ends it). A kind
passes when it finishes with no more overflows than post-LN's baseline of the same run
(every run starts at fairseq's initial scale of 128 and raises it every 2**14 updates,
so a few early overflows are expected of all), and a finite loss.

fairseq 0.12's ``--bf16`` is TPU training (it sets ``--tpu``, which needs torch_xla):
on a GPU every kind stops at start-up, so ``--bf16`` stops with that message here first.

Several runs share the GPU at once (``--workers``); one JSON line per kind goes to
``--out``, and the markdown table to stdout.

``--headroom`` explains the verdicts without a GPU: on the CPU, in float32, it takes the
first training step of each kind as ``fairseq-train`` would (same initialization, batch
and dropout masks; or a trained ``--checkpoint``) and reports what fp16 would have to
hold: the largest gradient (fairseq multiplies the loss, hence every gradient, by the
loss scale, so ``65504 / largest gradient`` is the largest scale at which this step does
not overflow; fairseq starts at 128), the largest block output and the largest logit
(the forward pass is not scaled: these must stay below 65,504 themselves).

    python benchmarks/fp16.py --updates 300 --workers 7
    python benchmarks/fp16.py --bf16 --rows post_ln,sas       # where torch_xla is installed (TPUs)
    python benchmarks/fp16.py --headroom                      # every kind at initialization, CPU
    python benchmarks/fp16.py --headroom --checkpoint runs/curves/.../checkpoint_last.pt
"""
import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from headroom import measure_headroom
from result_tables import fp16_table
from verdicts import fp16_log_record, fp16_verdicts

from resnmt.experiment.presets import SIZES, fairseq_bf16_problem
from resnmt.experiment.results import append_jsonl
from resnmt.experiment.runtime import tool_env
from resnmt.experiment.steps import FairseqLog
from resnmt.options import Option, add_to_command
from resnmt.study import flags, runs
from resnmt.study.records import cuda_description, run_id
from resnmt.study.rows import slug
from campaign import files
from campaign.rows import QUALITY_ROWS

BASELINE = "post_ln"


def train_in_half_precision(a, row, work: Path, env) -> dict:
    """``fairseq-train --fp16`` (or ``--bf16``) of ``row`` for ``--updates`` updates; what its
    log says of overflows, the loss scale and the loss."""
    arch, row_flags = QUALITY_ROWS[row].arch, list(QUALITY_ROWS[row].flags)
    run_dir = work / slug(row)
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = runs.benchmark_train_argv(
        a.bin_dir, arch, row_flags, SIZES[a.size], seed=1, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=0.1, save_every=a.updates, keep=1, validate=False)
    argv += ["--bf16" if a.bf16 else "--fp16", "--max-update", str(a.updates), "--no-save",
             "--log-interval", str(a.log_interval), "--save-dir", str(run_dir)]
    log = run_dir / "train.log"
    t0 = time.time()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    seconds = time.time() - t0
    rec = fp16_log_record(FairseqLog.read(log))
    rec.update(row=row, arch=arch, flags=row_flags, exit_code=proc.returncode, seconds=round(seconds, 1))
    print(f"[fp16] {row}: exit {proc.returncode}, {rec['overflows']} overflows, scale {rec['loss_scale']}, "
          f"loss {rec['train_loss']} @ {rec['updates_logged']} ({seconds:.0f}s)", file=sys.stderr, flush=True)
    return rec


UPDATES = Option("updates", 300, "updates per kind (default: %(default)s)", kind="int", minimum=1, metavar="N")
TRAINING = (
    Option("log_interval", 50, "default: %(default)s", kind="int", minimum=1, metavar="N"),
    Option("bf16", False, "--bf16 instead of --fp16 (fairseq 0.12: TPUs only; needs torch_xla)", kind="switch"),
    Option("workers", 4, "runs at a time on the GPU (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("workdir", "runs/fp16", "logs (default: %(default)s)", metavar="DIR"),
)
HEADROOM = (
    Option("headroom", False, kind="switch", help=(
        "no training and no GPU: the first training step of each kind in float32 on the CPU (or of each "
        "--checkpoint), and the largest values fp16 would have to hold")),
    Option("checkpoint", [], repeat=True, metavar="PT", help=(
        "with --headroom: a trained checkpoint to measure instead of the kinds at initialization (repeatable)")),
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    files.add_data(p, binarized=False)
    flags.add_rows(p, QUALITY_ROWS, what="kinds")
    flags.add_size(p, "base", "default: base (6+6, d=512)")
    add_to_command(p, [UPDATES])
    flags.add_schedule(p, what=", the study's: benchmarks/curves.py")
    add_to_command(p, TRAINING)
    files.add_out(p, "fp16.jsonl")
    add_to_command(p, HEADROOM)
    flags.add_threads(p, note="; with --headroom")
    a = p.parse_args(argv)

    rows = flags.chosen_rows(p, a.rows, QUALITY_ROWS, slug=slug)
    if BASELINE not in rows:
        rows.insert(0, BASELINE)
    a.bin_dir = flags.binarized_folder(p, a.data, prepared=True)
    if a.checkpoint and not a.headroom:
        p.error("--checkpoint is read by --headroom only")
    missing = [c for c in a.checkpoint if not Path(c).is_file()]
    if missing:
        p.error(f"--checkpoint {', '.join(missing)}: no such file")
    if a.headroom:
        return measure_headroom(a, rows)
    bf16_problem = fairseq_bf16_problem(["--bf16"] if a.bf16 else [])
    if bf16_problem:
        p.error(bf16_problem)
    import torch

    if not torch.cuda.is_available():
        p.error("no CUDA device here (torch.cuda.is_available() is False): fairseq trains in fp16/bf16 on a GPU only")

    work = Path(a.workdir) / ("bf16" if a.bf16 else "fp16")
    env = tool_env(threads=1)
    with ThreadPoolExecutor(max_workers=a.workers) as pool:
        records = list(pool.map(lambda row: train_in_half_precision(a, row, work, env), rows))
    started = run_id()
    settings = {"precision": "bf16" if a.bf16 else "fp16", "size": a.size, "updates": a.updates,
                "max_tokens": a.max_tokens, "lr": a.lr, "warmup_updates": a.warmup, "dropout": 0.1,
                "initial_loss_scale": 128}
    device = cuda_description()
    records = fp16_verdicts(records, BASELINE)
    for r in records:
        append_jsonl(Path(a.out), {"benchmark": "fp16", "run_id": started, "settings": settings, **device, **r})
    print(fp16_table(records))
    return 0 if all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
