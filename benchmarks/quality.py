#!/usr/bin/env python
"""BLEU of resnmt's connections on Multi30k EN-DE at CPU scale, one run per (row, seed).

Each run: ``fairseq-train`` for a fixed number of updates (checkpoints every
``--save-every`` updates), ``resnmt-average`` of the last ``--average`` checkpoints,
``fairseq-generate --task resnmt_translation`` with beam 4 and the GNMT length penalty
(alpha 0.6) on test2016, ``resnmt-evaluate --remove-bpe sentencepiece`` against the raw
references. One JSON line per finished run is appended to ``--out``; a run whose
(row, seed, settings) is already there is skipped, so the table can be filled over
several sessions (a run interrupted half-way restarts from its last checkpoint).

    python benchmarks/quality.py                       # every row, its seeds, in priority order
    python benchmarks/quality.py --rows post_ln,sas --seeds 1
    python benchmarks/quality.py --list                # what is done and what is missing
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

import common
from common import ROWS, slug

from resnmt.experiment import steps
from resnmt.experiment.presets import SIZES
from resnmt.experiment.runtime import tool_env
from resnmt.shared import append_jsonl, read_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT / "data" / "multi30k"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "quality.jsonl"
DEFAULT_WORKDIR = REPO_ROOT / "runs" / "bench-quality"

PRIORITY = ["transformer", "post_ln", "rskip_ln (λ=2)", "sas"]


def planned_runs(rows, seeds_override):
    """(row, seed) in priority order: seed 1 of the priority rows, seed 1 of the rest,
    then the further seeds."""
    order = [r for r in PRIORITY if r in rows] + [r for r in rows if r not in PRIORITY]
    max_seeds = max((seeds_override and len(seeds_override)) or ROWS[r].seeds for r in order) if order else 0
    runs = []
    for k in range(max_seeds):
        for row in order:
            seeds = seeds_override or list(range(1, ROWS[row].seeds + 1))
            if k < len(seeds):
                runs.append((row, seeds[k]))
    return runs


def settings_of(a):
    return {
        "size": {"name": a.size, **SIZES[a.size].as_dict()},
        "max_tokens": a.max_tokens, "max_update": a.max_update, "lr": a.lr,
        "warmup_updates": a.warmup, "dropout": a.dropout, "label_smoothing": 0.1,
        "save_every": a.save_every, "average": a.average, "beam": 4, "lenpen": 0.6,
        "lenpen_form": "gnmt", "max_len_b": a.max_len_b, "threads": a.threads,
    }


def one_run(a, row, seed, settings, bin_dir, ref, env):
    """Train, average, decode and score one (row, seed) with resnmt.experiment's steps; its record."""
    run_dir = Path(a.workdir) / common.settings_key(settings) / f"{slug(row)}.seed{seed}"
    ckpt_dir, log = run_dir / "checkpoints", run_dir / "log.txt"
    arch, flags = ROWS[row].arch, list(ROWS[row].flags)
    train_argv = common.benchmark_train_argv(
        bin_dir, arch, flags, SIZES[a.size], seed=seed, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=a.dropout, save_every=a.save_every, keep=a.average, validate=False)
    train_s = common.train_to(a.max_update, train_argv, ckpt_dir, log, env)  # resumes from checkpoint_last.pt
    score, gen_s = common.average_and_score(
        common.checkpoints_until(ckpt_dir, a.average, a.max_update), run_dir / "checkpoint.avg.pt",
        run_dir / "gen.test.out", bin_dir, ref, log, env, remove_bpe=a.remove_bpe, max_len_b=a.max_len_b)
    fairseq_log = steps.FairseqLog.read(log)
    losses = [loss for _, _, loss in fairseq_log.epochs] or [loss for _, loss in fairseq_log.train]
    if not a.keep_checkpoints:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return {
        "benchmark": "quality", "row": row, "seed": seed, "arch": arch, "flags": flags,
        "settings": settings, "settings_key": common.settings_key(settings),
        "data": common.repo_relative(bin_dir), "ref": common.repo_relative(ref),
        "bleu": score["bleu"], "signature": score["signature"], "tok_intl_bleu": score.get("tok_intl_bleu"),
        "n_sentences": score["n_sentences"], "final_train_loss": losses[-1] if losses else None,
        "train_seconds": round(train_s, 1), "generate_seconds": round(gen_s, 1),
        "finished": common.run_id(),
        "host": os.uname().nodename,
    }


def done_runs(out):
    return {(r["row"], r["seed"], r["settings_key"]) for r in read_jsonl(out)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA),
                   help="prepared corpus (OUTDIR of resnmt-prepare multi30k): OUTDIR/bin and "
                   "OUTDIR/raw/test.de are used (default: data/multi30k)")
    p.add_argument("--ref", help="reference file (default: DATA/raw/test.de)")
    p.add_argument("--remove-bpe", default="sentencepiece", choices=["none", "subword_nmt", "sentencepiece"],
                   help="passed to resnmt-evaluate (default: sentencepiece)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all): " + "; ".join(ROWS))
    p.add_argument("--seeds", help="comma-separated seeds for every row (default: 1..n per row: "
                   "3 for post_ln, rskip_ln (λ=2), sas; 2 for the others)")
    p.add_argument("--size", default="small", choices=sorted(SIZES),
                   help="small = 2+2 layers d=128 FFN 512 4 heads (default); tiny = tests")
    p.add_argument("--max-tokens", type=int, default=4096, help="default: 4096")
    p.add_argument("--max-update", type=int, default=600, help="update budget per run (default: 600)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--warmup", type=int, default=300, help="inverse-sqrt warm-up updates (default: 300)")
    p.add_argument("--dropout", type=float, default=0.1, help="default: 0.1")
    p.add_argument("--save-every", type=int, default=40, help="checkpoint interval in updates (default: 40)")
    p.add_argument("--average", type=int, default=5, help="average the last N checkpoints (default: 5)")
    p.add_argument("--max-len-b", type=int, default=200,
                   help="fairseq-generate --max-len-b (default: 200, fairseq's; the tests use less)")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per run (default: 1)")
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="checkpoints and logs (default: runs/bench-quality)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON lines appended here (default: %(default)s)")
    p.add_argument("--max-runs", type=int, help="stop after this many new runs")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoints")
    p.add_argument("--list", action="store_true", help="print the planned runs, done or missing, and exit")
    a = p.parse_args(argv)

    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from: {'; '.join(ROWS)}")
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else None
    bin_dir = Path(a.data) / "bin"
    ref = Path(a.ref) if a.ref else Path(a.data) / "raw" / "test.de"
    settings = settings_of(a)
    key = common.settings_key(settings)
    plan = planned_runs(rows, seeds)
    done = done_runs(a.out)
    if a.list:
        for row, seed in plan:
            print(f"{'done   ' if (row, seed, key) in done else 'missing'}  {row}  seed {seed}")
        return 0
    for path in (bin_dir / "dict.en.txt", ref):
        if not path.exists():
            p.error(f"{path} is missing; run resnmt-prepare multi30k {a.data} "
                    "(with --mirror DIR on a machine without network)")

    env = tool_env(threads=a.threads, cpu_only=True)
    new = 0
    for row, seed in plan:
        if (row, seed, key) in done:
            continue
        if a.max_runs is not None and new >= a.max_runs:
            break
        print(f"[quality] {row} seed {seed} ...", file=sys.stderr, flush=True)
        rec = one_run(a, row, seed, settings, bin_dir.resolve(), ref.resolve(), env)
        append_jsonl(a.out, rec)
        new += 1
        print(f"[quality] {row} seed {seed}: sacreBLEU {rec['bleu']:.2f} (train {rec['train_seconds']:.0f}s)",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
