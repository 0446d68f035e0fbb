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


from resnmt.experiment import steps
from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl, read_jsonl
from resnmt.experiment.runtime import tool_env
from resnmt.options import Option, add_to_command
from resnmt.study import flags, runs
from resnmt.study.records import portable_path, run_id, settings_key
from resnmt.study.rows import slug
from campaign import files
from campaign.files import REPO_ROOT
from campaign.rows import QUALITY_ROWS

DEFAULT_WORKDIR = REPO_ROOT / "runs" / "bench-quality"

PRIORITY = ["transformer", "post_ln", "rskip_ln (λ=2)", "sas"]


SEEDS = Option("seeds", kind="int", listed=True, minimum=1, metavar="N,N,...", help=(
    "comma-separated seeds for every row (default: 1..n per row: 3 for post_ln, rskip_ln (λ=2), sas; 2 for the "
    "others)"))
TRAINING = (
    Option("max_update", 600, "update budget per run (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("dropout", 0.1, "default: %(default)s", kind="number", minimum=0, metavar="P"),
)
RUNS = (
    Option("workdir", str(DEFAULT_WORKDIR), "checkpoints and logs (default: runs/bench-quality)", metavar="DIR"),
    Option("max_len_b", 200, "fairseq-generate --max-len-b (default: %(default)s, fairseq's; the tests use less)",
           kind="int", minimum=1, metavar="N"),
)
PLAN = (
    Option("max_runs", None, "stop after this many new runs", kind="int", minimum=1, metavar="N"),
    Option("list", False, "print the planned runs, done or missing, and exit", kind="switch"),
)


def planned_runs(rows, seeds_override):
    """(row, seed) in priority order: seed 1 of the priority rows, seed 1 of the rest,
    then the further seeds."""
    order = [r for r in PRIORITY if r in rows] + [r for r in rows if r not in PRIORITY]
    max_seeds = max((seeds_override and len(seeds_override)) or QUALITY_ROWS[r].seeds for r in order) if order else 0
    plan = []
    for k in range(max_seeds):
        for row in order:
            seeds = seeds_override or list(range(1, QUALITY_ROWS[row].seeds + 1))
            if k < len(seeds):
                plan.append((row, seeds[k]))
    return plan


def quality_settings(a) -> dict:
    """What every run of the quality table shares (its settings key names them)."""
    return {
        "size": {"name": a.size, **SIZES[a.size].as_dict()},
        "max_tokens": a.max_tokens, "max_update": a.max_update, "lr": a.lr,
        "warmup_updates": a.warmup, "dropout": a.dropout, "label_smoothing": 0.1,
        "save_every": a.save_every, "average": a.average, "beam": 4, "lenpen": 0.6,
        "lenpen_form": "gnmt", "max_len_b": a.max_len_b, "threads": a.threads,
    }


def train_and_score(a, row, seed, settings, bin_dir, ref, env):
    """Train, average, decode and score one (row, seed) with resnmt.experiment's steps; its record."""
    run_dir = Path(a.workdir) / settings_key(settings) / f"{slug(row)}.seed{seed}"
    ckpt_dir, log = run_dir / "checkpoints", run_dir / "log.txt"
    arch, row_flags = QUALITY_ROWS[row].arch, list(QUALITY_ROWS[row].flags)
    train_argv = runs.benchmark_train_argv(
        bin_dir, arch, row_flags, SIZES[a.size], seed=seed, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=a.dropout, save_every=a.save_every, keep=a.average, validate=False)
    train_s = runs.train_to(a.max_update, train_argv, ckpt_dir, log, env)  # resumes from checkpoint_last.pt
    score, gen_s = runs.average_and_score(
        runs.checkpoints_until(ckpt_dir, a.average, a.max_update), run_dir / "checkpoint.avg.pt",
        run_dir / "gen.test.out", bin_dir, ref, log, env, remove_bpe=a.remove_bpe, max_len_b=a.max_len_b)
    fairseq_log = steps.FairseqLog.read(log)
    losses = [loss for _, _, loss in fairseq_log.epochs] or [loss for _, loss in fairseq_log.train]
    if not a.keep_checkpoints:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return {
        "benchmark": "quality", "row": row, "seed": seed, "arch": arch, "flags": row_flags,
        "settings": settings, "settings_key": settings_key(settings),
        "data": portable_path(bin_dir, Path(a.data)), "ref": portable_path(ref, Path(a.data)),
        "bleu": score["bleu"], "signature": score["signature"], "tok_intl_bleu": score.get("tok_intl_bleu"),
        "n_sentences": score["n_sentences"], "final_train_loss": losses[-1] if losses else None,
        "train_seconds": round(train_s, 1), "generate_seconds": round(gen_s, 1),
        "finished": run_id(),
        "host": os.uname().nodename,
    }


def done_runs(out):
    return {(r["row"], r["seed"], r["settings_key"]) for r in read_jsonl(out)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    files.add_data(p, binarized=False)
    flags.add_reference(p)
    flags.add_rows(p, QUALITY_ROWS)
    add_to_command(p, [SEEDS])
    flags.add_size(p, "small", "small = 2+2 layers d=128 FFN 512 4 heads (default); tiny = tests")
    flags.add_schedule(p)
    add_to_command(p, TRAINING)
    flags.add_checkpoints(p)
    add_to_command(p, RUNS)
    flags.add_threads(p)
    files.add_out(p, "quality.jsonl")
    add_to_command(p, PLAN)
    a = p.parse_args(argv)

    rows = flags.chosen_rows(p, a.rows, QUALITY_ROWS)
    seeds = a.seeds
    settings = quality_settings(a)
    key = settings_key(settings)
    plan = planned_runs(rows, seeds)
    done = done_runs(a.out)
    if a.list:
        for row, seed in plan:
            print(f"{'done   ' if (row, seed, key) in done else 'missing'}  {row}  seed {seed}")
        return 0
    bin_dir, ref = flags.scored_corpus(p, a.data, a.ref)

    env = tool_env(threads=a.threads, cpu_only=True)
    new = 0
    for row, seed in plan:
        if (row, seed, key) in done:
            continue
        if a.max_runs is not None and new >= a.max_runs:
            break
        print(f"[quality] {row} seed {seed} ...", file=sys.stderr, flush=True)
        rec = train_and_score(a, row, seed, settings, bin_dir.resolve(), ref.resolve(), env)
        append_jsonl(a.out, rec)
        new += 1
        print(f"[quality] {row} seed {seed}: sacreBLEU {rec['bleu']:.2f} (train {rec['train_seconds']:.0f}s)",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
