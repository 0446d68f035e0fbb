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
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = REPO_ROOT / "resnmt"
DEFAULT_DATA = REPO_ROOT / "data" / "multi30k"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "quality.jsonl"
DEFAULT_WORKDIR = REPO_ROOT / "runs" / "bench-quality"

# row -> (arch, extra flags, seeds wanted)
ROWS = {
    "transformer": ("transformer", [], 2),
    "post_ln": ("transformer_postln_base", [], 3),
    "pre_ln": ("transformer_preln_base", [], 2),
    "xskip (λ=1)": ("transformer_postln_base", ["--residual", "xskip", "--skip-lambda", "1"], 2),
    "xskip_ln (λ=2)": ("transformer_xskip_base", ["--skip-lambda", "2"], 2),
    "rskip_ln (λ=2)": ("transformer_rskip_base", ["--skip-lambda", "2"], 3),
    "rskip_ln (λ=3)": ("transformer_rskip_base", ["--skip-lambda", "3"], 2),
    "sas": ("transformer_sas_base", [], 3),
    "highway": ("transformer_highway_base", [], 2),
    "rskip_ln (λ=2) + nswish": ("transformer_rskip_base", ["--skip-lambda", "2", "--normalized-activation", "nswish"], 2),
    "xskip_ln (learned λ from 2)": ("transformer_xskip_base", ["--skip-lambda", "2", "--skip-lambda-learned"], 2),
    "deepnorm": ("transformer_deepnorm_base", [], 2),
    "rezero": ("transformer_rezero_base", [], 2),
    "admin": ("transformer_admin_base", [], 2),
}
PRIORITY = ["transformer", "post_ln", "rskip_ln (λ=2)", "sas"]

SIZES = {
    # name: (layers, d, ffn, heads)
    "small": (2, 128, 512, 4),
    "tiny": (1, 16, 32, 2),
}


def slug(row):
    return re.sub(r"[^a-z0-9]+", "_", row.lower()).strip("_")


def planned_runs(rows, seeds_override):
    """(row, seed) in priority order: seed 1 of the priority rows, seed 1 of the rest,
    then the further seeds."""
    order = [r for r in PRIORITY if r in rows] + [r for r in rows if r not in PRIORITY]
    max_seeds = max((seeds_override and len(seeds_override)) or ROWS[r][2] for r in order) if order else 0
    runs = []
    for k in range(max_seeds):
        for row in order:
            seeds = seeds_override or list(range(1, ROWS[row][2] + 1))
            if k < len(seeds):
                runs.append((row, seeds[k]))
    return runs


def settings_of(a):
    layers, dim, ffn, heads = SIZES[a.size]
    return {
        "size": {"name": a.size, "layers": layers, "dim": dim, "ffn": ffn, "heads": heads},
        "max_tokens": a.max_tokens, "max_update": a.max_update, "lr": a.lr,
        "warmup_updates": a.warmup, "dropout": a.dropout, "label_smoothing": 0.1,
        "save_every": a.save_every, "average": a.average, "beam": 4, "lenpen": 0.6,
        "lenpen_form": "gnmt", "max_len_b": a.max_len_b, "threads": a.threads,
    }


def settings_key(settings):
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def train_argv(a, row, seed, ckpt_dir, bin_dir):
    arch, extra = ROWS[row][0], ROWS[row][1]
    layers, dim, ffn, heads = SIZES[a.size]
    return [
        "fairseq-train", str(bin_dir), "--user-dir", str(USER_DIR), "--arch", arch, *extra,
        "--encoder-layers", str(layers), "--decoder-layers", str(layers),
        "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
        "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
        "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
        "--share-all-embeddings", "--dropout", str(a.dropout),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(a.warmup),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(a.max_tokens), "--max-update", str(a.max_update), "--seed", str(seed),
        "--save-dir", str(ckpt_dir), "--save-interval-updates", str(a.save_every),
        "--keep-interval-updates", str(a.average), "--no-epoch-checkpoints", "--disable-validation",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "50", "--no-progress-bar",
    ]


def run(cmd, log_path, env, stdout_path=None):
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
        log.flush()
        out = open(stdout_path, "w", encoding="utf-8") if stdout_path else log
        try:
            proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=log, env=env, cwd=str(REPO_ROOT))
        finally:
            if stdout_path:
                out.close()
    if proc.returncode != 0:
        tail = Path(log_path).read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}); log {log_path}:\n{tail}")


def last_checkpoints(ckpt_dir, n, final_update):
    """The newest n checkpoints, oldest first: checkpoint_E_U.pt by U, then
    checkpoint_last.pt (the model after ``final_update`` updates) when no checkpoint_E_U.pt
    holds the final update (fairseq writes none when training stops at the end of an epoch)."""
    by_update = sorted(
        (int(m.group(1)), path) for path in Path(ckpt_dir).glob("checkpoint_*_*.pt")
        if (m := re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", path.name))
    )
    paths = [path for _, path in by_update]
    last = Path(ckpt_dir) / "checkpoint_last.pt"
    if last.exists() and (not by_update or by_update[-1][0] < final_update):
        paths.append(last)
    if len(paths) < n:
        raise RuntimeError(f"{ckpt_dir}: {len(paths)} checkpoints, {n} wanted for averaging")
    return paths[-n:]


def one_run(a, row, seed, settings, bin_dir, ref, env):
    run_dir = Path(a.workdir) / settings_key(settings) / f"{slug(row)}.seed{seed}"
    ckpt_dir = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "log.txt"
    t0 = time.time()
    run(train_argv(a, row, seed, ckpt_dir, bin_dir), log, env)  # resumes from checkpoint_last.pt
    train_s = time.time() - t0
    avg = run_dir / "checkpoint.avg.pt"
    run(["resnmt-average", "--inputs", *last_checkpoints(ckpt_dir, a.average, a.max_update), "--output", avg], log, env)
    gen = run_dir / "gen.test.out"
    t1 = time.time()
    run(["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--task", "resnmt_translation", "--path", avg,
         "--gen-subset", "test", "--beam", "4", "--lenpen-form", "gnmt", "--lenpen", "0.6",
         "--batch-size", "128", "--num-workers", "0", "--max-len-b", str(a.max_len_b)], log, env, stdout_path=gen)
    gen_s = time.time() - t1
    score_json = run_dir / "score.json"
    score_json.unlink(missing_ok=True)
    run(["resnmt-evaluate", "--hyp", gen, "--ref", ref, "--remove-bpe", a.remove_bpe, "--json-out", score_json,
         "--quiet"], log, env)
    score = json.loads(score_json.read_text(encoding="utf-8").strip().splitlines()[-1])
    text = log.read_text(encoding="utf-8", errors="replace")
    losses = re.findall(r"\| train \|.*?loss (\d+\.\d+)", text) or re.findall(r"loss=(\d+\.\d+)", text)
    shutil.rmtree(ckpt_dir, ignore_errors=True) if not a.keep_checkpoints else None
    return {
        "benchmark": "quality", "row": row, "seed": seed, "arch": ROWS[row][0], "flags": ROWS[row][1],
        "settings": settings, "settings_key": settings_key(settings),
        "data": str(bin_dir), "ref": str(ref),
        "bleu": score["bleu"], "signature": score["signature"], "tok_intl_bleu": score.get("tok_intl_bleu"),
        "n_sentences": score["n_sentences"], "final_train_loss": float(losses[-1]) if losses else None,
        "train_seconds": round(train_s, 1), "generate_seconds": round(gen_s, 1),
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": os.uname().nodename,
    }


def done_runs(out):
    done = set()
    if Path(out).exists():
        for line in Path(out).read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                done.add((r["row"], r["seed"], r["settings_key"]))
    return done


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA),
                   help="prepared corpus (OUTDIR of data-prep/prepare-multi30k.sh): OUTDIR/bin and "
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
    key = settings_key(settings)
    plan = planned_runs(rows, seeds)
    done = done_runs(a.out)
    if a.list:
        for row, seed in plan:
            print(f"{'done   ' if (row, seed, key) in done else 'missing'}  {row}  seed {seed}")
        return 0
    for path in (bin_dir / "dict.en.txt", ref):
        if not path.exists():
            p.error(f"{path} is missing; run bash data-prep/prepare-multi30k.sh --mirror ../shared/data/multi30k data/multi30k")

    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(a.threads)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    new = 0
    for row, seed in plan:
        if (row, seed, key) in done:
            continue
        if a.max_runs is not None and new >= a.max_runs:
            break
        print(f"[quality] {row} seed {seed} ...", file=sys.stderr, flush=True)
        rec = one_run(a, row, seed, settings, bin_dir.resolve(), ref.resolve(), env)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        new += 1
        print(f"[quality] {row} seed {seed}: sacreBLEU {rec['bleu']:.2f} (train {rec['train_seconds']:.0f}s)",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
