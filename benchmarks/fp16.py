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
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common
from common import ROWS, fp16_log_record, fp16_verdicts, slug
from fairseq_trainer import fairseq_training
from result_tables import fp16_table, headroom_table

from resnmt.experiment.presets import SIZES, fairseq_bf16_problem
from resnmt.experiment.runtime import tool_env
from resnmt.experiment.steps import FairseqLog
from resnmt.shared import append_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "fp16.jsonl"
BASELINE = "post_ln"

def one_run(a, row, work: Path, env) -> dict:
    arch, flags = ROWS[row].arch, list(ROWS[row].flags)
    run_dir = work / slug(row)
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = common.benchmark_train_argv(
        a.bin_dir, arch, flags, SIZES[a.size], seed=1, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=0.1, save_every=a.updates, keep=1, validate=False)
    argv += ["--bf16" if a.bf16 else "--fp16", "--max-update", str(a.updates), "--no-save",
             "--log-interval", str(a.log_interval), "--save-dir", str(run_dir)]
    log = run_dir / "train.log"
    t0 = time.time()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    seconds = time.time() - t0
    rec = fp16_log_record(FairseqLog.read(log))
    rec.update(row=row, arch=arch, flags=flags, exit_code=proc.returncode, seconds=round(seconds, 1))
    print(f"[fp16] {row}: exit {proc.returncode}, {rec['overflows']} overflows, scale {rec['loss_scale']}, "
          f"loss {rec['train_loss']} @ {rec['updates_logged']} ({seconds:.0f}s)", file=sys.stderr, flush=True)
    return rec


FP16_MAX = 65504.0  # the largest finite float16


def first_step(train_argv, checkpoint=None, data=None) -> dict:
    """One training step in float32 on the CPU, as ``fairseq-train train_argv`` takes its
    first one (``fairseq_trainer.fairseq_training``: the seed set before the model is built, the first
    batch of epoch 1, the trainer's seed before the forward pass), or with the weights of
    ``checkpoint`` (its own settings, ``data`` as the data directory). Returns the loss and
    gradient norm as fairseq logs them (base 2 per token; gradient norm of the loss divided
    by the sample size) and the largest values fp16 would have to hold."""
    import torch

    import resnmt  # noqa: F401  (registers the archs; checkpoints load with weights_only)
    from fairseq import checkpoint_utils, utils

    if checkpoint is None:
        cfg, task, model, criterion = fairseq_training(train_argv[1:])
        updates = 0
    else:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(data)} if data else None)
        model = models[0].float()
        updates = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["optimizer_history"][-1]["num_updates"]
        criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("train", epoch=1)
    (sample,) = common.training_batches(
        task, cfg.dataset.max_tokens, 1, seed=cfg.common.seed, max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(), cfg.dataset.max_tokens),
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple)

    outputs = {}
    def record(name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            outputs[name] = out.detach().abs().max().item()
        return hook
    hooks = [layer.register_forward_hook(record(f"{side}.layers.{i}"))
             for side in ("encoder", "decoder") for i, layer in enumerate(getattr(model, side).layers)]
    hooks.append(model.decoder.register_forward_hook(record("logits")))
    model.train()
    criterion.train()
    utils.set_torch_seed(cfg.common.seed)  # the trainer's seed for update 0 (dropout masks)
    loss, sample_size, _ = criterion(model, sample)
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    largest_grad, largest_param = max((g.abs().max().item(), n) for n, g in grads.items())
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])).item()
    logits = outputs.pop("logits")
    largest_output, largest_at = max((v, k) for k, v in outputs.items())
    return {
        "loss": loss.item() / sample_size / math.log(2), "grad_norm": grad_norm / sample_size,
        "largest_grad": largest_grad, "largest_grad_param": largest_param,
        "max_fp16_loss_scale": FP16_MAX / largest_grad,
        "largest_block_output": largest_output, "largest_block_output_at": largest_at, "largest_logit": logits,
        "sample_size": int(sample_size), "updates": int(updates),
    }


def measure_headroom(a, rows) -> int:
    import torch

    torch.set_num_threads(a.threads)
    if a.checkpoint:
        probes = [(common.repo_relative(Path(c)), None, Path(c)) for c in a.checkpoint]
    else:
        probes = [(row, row, None) for row in rows]
    run_id = common.run_id()
    # a checkpoint keeps its own size, batch size and dropout
    settings = ({"at": "checkpoint"} if a.checkpoint else
                {"at": "initialization", "size": a.size, "max_tokens": a.max_tokens, "dropout": 0.1})
    settings["dtype"] = "float32"  # the device is in the record (cpu_description)
    records = []
    for name, row, checkpoint in probes:
        if row is None:
            arch, flags, argv = None, None, None
        else:
            arch, flags = ROWS[row].arch, list(ROWS[row].flags)
            argv = common.benchmark_train_argv(
                a.bin_dir, arch, flags, SIZES[a.size], seed=1, max_tokens=a.max_tokens, lr=a.lr,
                warmup=a.warmup, dropout=0.1, save_every=1, keep=1, validate=False)
        t0 = time.time()
        rec = {"row": name, "arch": arch, "flags": flags,
               **first_step(argv, checkpoint, data=a.bin_dir.resolve() if checkpoint else None)}
        print(f"[fp16 headroom] {name}: loss {rec['loss']:.3f}, largest gradient {rec['largest_grad']:.1f} "
              f"({rec['largest_grad_param']}), fp16 holds a loss scale up to {rec['max_fp16_loss_scale']:.3g} "
              f"({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
        records.append(rec)
        append_jsonl(Path(a.out), {"benchmark": "fp16-headroom", "run_id": run_id, "settings": settings,
                                   **common.cpu_description(), **rec})
    print(headroom_table(records))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/multi30k", help="prepared Multi30k (default: data/multi30k)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated kinds (default: every row of benchmarks/common.py)")
    p.add_argument("--size", default="base", choices=sorted(SIZES), help="default: base (6+6, d=512)")
    p.add_argument("--updates", type=int, default=300, help="updates per kind (default: 300)")
    p.add_argument("--max-tokens", type=int, default=4096, help="default: 4096")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="peak learning rate (default: 1e-3, the study's: benchmarks/curves.py)")
    p.add_argument("--warmup", type=int, default=300, help="warm-up updates (default: 300, the study's)")
    p.add_argument("--log-interval", type=int, default=50, help="default: 50")
    p.add_argument("--bf16", action="store_true", help="--bf16 instead of --fp16 (fairseq 0.12: TPUs only; needs torch_xla)")
    p.add_argument("--workers", type=int, default=4, help="runs at a time on the GPU (default: 4)")
    p.add_argument("--workdir", default="runs/fp16", help="logs (default: runs/fp16)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON lines appended here (default: %(default)s)")
    p.add_argument("--headroom", action="store_true",
                   help="no training and no GPU: the first training step of each kind in float32 on the CPU "
                        "(or of each --checkpoint), and the largest values fp16 would have to hold")
    p.add_argument("--checkpoint", action="append", default=[],
                   help="with --headroom: a trained checkpoint to measure instead of the kinds at "
                        "initialization (repeatable)")
    p.add_argument("--threads", type=int, default=1, help="with --headroom: torch threads (default: 1)")
    a = p.parse_args(argv)

    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS and r not in {slug(x) for x in ROWS}]
    if unknown:
        p.error(f"--rows {','.join(unknown)}: unknown; choose from: {', '.join(ROWS)}")
    rows = [next(x for x in ROWS if r in (x, slug(x))) for r in rows]
    if BASELINE not in rows:
        rows.insert(0, BASELINE)
    a.bin_dir = Path(a.data) / "bin"
    if not (a.bin_dir / "dict.en.txt").exists():
        p.error(f"{a.bin_dir}/dict.en.txt is missing; run bash data-prep/prepare-multi30k.sh {a.data}")
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
        records = list(pool.map(lambda row: one_run(a, row, work, env), rows))
    run_id = common.run_id()
    settings = {"precision": "bf16" if a.bf16 else "fp16", "size": a.size, "updates": a.updates,
                "max_tokens": a.max_tokens, "lr": a.lr, "warmup_updates": a.warmup, "dropout": 0.1,
                "initial_loss_scale": 128}
    device = common.cuda_description()
    records = fp16_verdicts(records, BASELINE)
    for r in records:
        append_jsonl(Path(a.out), {"benchmark": "fp16", "run_id": run_id, "settings": settings, **device, **r})
    print(fp16_table(records))
    return 0 if all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
