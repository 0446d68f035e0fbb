#!/usr/bin/env python
"""BLEU against the training budget: one run per (depth, row, seed), scored at several budgets.

Each run trains with ``fairseq-train`` (the rows of ``benchmarks/quality.py``, on Multi30k
EN-DE) and stops at every milestone (``--milestones``, in updates): the newest
``--average`` update checkpoints are averaged, test2016 is decoded with beam 4 and the
GNMT length penalty 0.6 (maximum length source + 50, tensor2tensor's), scored with
``resnmt-evaluate``, the milestone's checkpoint is run through ``resnmt-analyze`` on the
validation set, and one JSON line is appended to ``--out`` holding the BLEU, the
validation losses so far and the analysis. Training then resumes to the next milestone
(stopping and resuming fairseq is exact, see tests/test_resume.py).

Runs are taken in the study's priority order. Several copies of this script can run at
once (``--workers`` starts them): each run directory is locked by the copy working on it.
A killed run resumes from its last checkpoint; milestones already in ``--out`` are not
scored again, so the study can be continued over several sessions.

Checkpoints live in the (ignored) ``--workdir``, so a run continues across sessions only on
a machine that keeps it (``--list`` names the update each unfinished run's checkpoints
reach); on a fresh checkout a run restarts at update 0 and skips the milestones already
recorded. On a 2-core CPU a 2+2 run to its final 14400 updates takes 2.7-5.4 h, more than a
3-hour working session leaves for training, and two 6+6 runs side by side reach 2400
updates in about 2.5 h (the measured rates are in docs/study.md). The thread count is how a
run was executed, not what it computes: it is recorded per line (``torch_threads``) and
left out of the settings key.

    python benchmarks/curves.py                        # the whole study, one run at a time
    python benchmarks/curves.py --list                 # what is done, what is missing, what can resume
    python benchmarks/curves.py --only small:post_ln:1 # one run
    python benchmarks/curves.py --workers 2 --threads 1 --only deep:pre_ln:1,deep:sas:1   # a pair side by side
    python benchmarks/curves.py --device cuda --workers 8 --threads 1   # on a GPU: the study, plus the base size

With ``--device cuda`` every run trains and decodes on the (first) GPU, several at once
with ``--workers`` (these models are far too small to fill one), and the study adds the
papers' base size (6+6 layers, d=512), which a CPU cannot train in a session. GPU lines
record their device, are kept apart from the CPU lines (a GPU run never skips a milestone
because the CPU run has it) and are plotted in panels of their own; the settings (and the
settings key) are the same, fp32 on both.
"""
import argparse
import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import common
from common import CONTROL_ROWS, DEFAULT_MILESTONES, GEN2025_KINDS, GEN2025_VARIANTS, NEW_KINDS, SAME_RUN, slug
from common import CURVES_ROWS as ROWS

from resnmt.decoding.averaging import numbered_checkpoints
from resnmt.experiment import steps
from resnmt.experiment.presets import SIZES
from resnmt.experiment.runtime import tool_env
from resnmt.shared import append_jsonl, read_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "curves.jsonl"

# The study, most decisive runs first: (size, row, seed). Pairs that compare directly are
# adjacent, so that `--workers 2 --threads 1` trains them side by side. What is done is in
# --out (`--list` tells); a run that is not in STUDY_ORDER is trained with --only.
STUDY_ORDER = (
    [("deep", r, 1) for r in ("post_ln", "rskip_ln (λ=2)", "pre_ln", "sas")]
    + [("deep", r, 1) for r in CONTROL_ROWS]
    + [("deep", r, 1) for r in ("deepnorm", "admin", "rezero")]
    + [("small", r, 1) for r in ("post_ln", "rskip_ln (λ=2)", "sas")]
    + [("small", r, 1) for r in ("pre_ln", "xskip_ln (λ=2)")]
    + [("small", r, 2) for r in ("post_ln", "rskip_ln (λ=2)", "sas", "pre_ln", "xskip_ln (λ=2)")]
    + [("small", r, 3) for r in ("post_ln", "rskip_ln (λ=2)", "sas")]
    + [("deep", r, 2) for r in ("post_ln", "rskip_ln (λ=2)", "sas", "pre_ln")]
    + [("deep", r, 3) for r in ("post_ln", "rskip_ln (λ=2)")]
    + [(size, r, 1) for r in NEW_KINDS for size in ("deep", "small")]
    + [("deep", r, 1) for r in ("b2t (warm-up 1000)", "resi_dual (warm-up 1000)")]
    # second seeds where a verdict rests on one (beside post-LN's and pre-LN's seed 2 above)
    + [(size, r, 2) for r in ("b2t", "pre_ln + dyt", "post_ln + dyt") for size in ("small", "deep")]
    + [("base", r, 1) for r in ("post_ln", "rskip_ln (λ=2)", "pre_ln", "sas")]
    + [("base", r, 1) for r in CONTROL_ROWS]
    + [(size, r, 1) for r in GEN2025_KINDS for size in ("deep", "small") if (size, r) not in SAME_RUN]
    # a second seed where one seed puts a 2025 kind ahead of post-LN at 2+2 (by less than, or
    # about, a row's seed spread)
    + [("small", "hyper", 2), ("small", "hybrid_norm", 2)]
    + [("deep", r, 1) for r in GEN2025_VARIANTS]
    # a second seed at 6+6 where one seed puts a 2025 kind ahead of or behind pre-LN by about
    # pre-LN's own seed spread (0.67) or a little more
    + [("deep", r, 2) for r in ("ln_scaling", "mix_ln", "mhc", "denseformer")]
)


# Sizes planned only with --device cuda: a CPU trains the papers' base size ~20x slower
# than the 6+6 d=128 model.
GPU_ONLY_SIZES = ("base",)


def settings_of(a) -> dict:
    """What every run of the study shares (the milestones and the size are per line).
    The torch thread count is not a setting: it is recorded per line (``torch_threads``)."""
    return {
        "corpus": "multi30k", "max_tokens": a.max_tokens, "lr": a.lr, "warmup_updates": a.warmup,
        "dropout": a.dropout, "label_smoothing": 0.1, "save_every": a.save_every, "average": a.average,
        "beam": 4, "lenpen": 0.6, "lenpen_form": "gnmt", "max_len_a": 1, "max_len_b": 50,
        **({"every_size": "tiny"} if a.tiny else {}),
    }


def planned(a):
    runs = []
    for size, row, seed in STUDY_ORDER:
        if row not in ROWS:  # a connection kind that has not landed yet
            continue
        if a.device == "cpu" and size in GPU_ONLY_SIZES:
            continue
        if a.only and f"{size}:{row}:{seed}" not in a.only and f"{size}:{slug(row)}:{seed}" not in a.only:
            continue
        runs.append((size, row, seed))
    return runs


def done_milestones(out: Path, key: str, device: str):
    """{(size, row, seed): milestones recorded} for these settings on ``device`` (cpu or cuda)."""
    done = {}
    for r in read_jsonl(out):
        if r.get("benchmark") == "curves" and r["settings_key"] == key and r.get("device", "cpu") == device:
            done.setdefault((r["size"]["name"], r["row"], r["seed"]), set()).add(r["updates"])
    return done


class RunLock:
    """An exclusive, non-blocking lock on a run directory (released when the process dies)."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.f = open(run_dir / "lock", "w")

    def acquire(self) -> bool:
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            self.f.close()
            return False

    def release(self) -> None:
        self.f.close()


def run_dir_of(a, key, size, row, seed) -> Path:
    return a.workdir / key / size / f"{slug(row)}.seed{seed}"


def resume_point(ckpt_dir: Path) -> int:
    """The update a run would resume from: its newest update checkpoint (0 if none). This is
    how ``--list`` tells which partial runs still have their checkpoints on this machine."""
    found = numbered_checkpoints(ckpt_dir, "update")
    return max(found[-1][0] if found else 0, common.trained_updates(ckpt_dir))


def one_run(a, settings, key, size, row, seed, milestones_done, env, device):
    run_dir = run_dir_of(a, key, size, row, seed)
    ckpt_dir, log = run_dir / "checkpoints", run_dir / "log.txt"
    arch, flags = ROWS[row].arch, list(ROWS[row].flags)
    model_size = SIZES["tiny" if a.tiny else size]
    train_argv = common.benchmark_train_argv(
        a.bin_dir, arch, flags, model_size, seed=seed, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=a.dropout, save_every=a.save_every, keep=a.average, validate=True)
    for updates in a.milestones[size]:
        if updates in milestones_done:
            continue
        print(f"[curves] {size} {row} seed {seed}: training to {updates} updates", file=sys.stderr, flush=True)
        total = common.train_to(updates, train_argv, ckpt_dir, log, env)  # seconds over the whole run

        ckpts = common.checkpoints_until(ckpt_dir, a.average, updates)
        avg = run_dir / f"checkpoint.avg{a.average}.upd{updates}.pt"
        result, decode_seconds = common.average_and_score(
            ckpts, avg, run_dir / f"gen.test.upd{updates}.out", a.bin_dir, a.ref, log, env, remove_bpe=a.remove_bpe,
            max_len_a=1, max_len_b=50)
        avg.unlink()
        analysis = steps.analyze(ckpts[-1], a.bin_dir, run_dir / "analysis" / f"upd{updates}", log, env,
                                 num_sentences=a.analyze_sentences)
        fairseq_log = steps.FairseqLog.read(log)
        train_loss = [p for p in fairseq_log.train if p[0] <= updates]
        record = {
            "benchmark": "curves", "size": {"name": size, **model_size.as_dict()}, "row": row, "seed": seed,
            "arch": arch, "flags": flags, "updates": updates,
            "settings": settings, "settings_key": key,
            "bleu": result["bleu"], "signature": result["signature"], "tok_intl_bleu": result["tok_intl_bleu"],
            "n_sentences": result["n_sentences"],
            "valid": [list(p) for p in fairseq_log.valid if p[0] <= updates],
            "train_loss": train_loss[-1][1] if train_loss else None,
            "params": fairseq_log.params,
            "analysis": {"checkpoint_updates": updates, "split": analysis["split"],
                         "num_sentences": analysis["num_sentences"], "loss": analysis["loss"],
                         "connections": analysis["connections"], "statistics": analysis["statistics"],
                         "streams": analysis["streams"], "norms": analysis["norms"]},
            "averaged": [p.name for p in ckpts],
            "data": common.repo_relative(a.bin_dir, Path.cwd()), "ref": common.repo_relative(a.ref, Path.cwd()),
            "train_seconds": round(total, 1), "decode_seconds": round(decode_seconds, 1),
            **device, "torch_threads": a.threads,
            "finished": common.run_id(),
        }
        append_jsonl(a.out, record)
        print(f"[curves] {size} {row} seed {seed} @ {updates}: sacreBLEU {record['bleu']:.2f}, "
              f"valid loss {record['valid'][-1][1] if record['valid'] else float('nan'):.3f}",
              file=sys.stderr, flush=True)
    if not a.keep_checkpoints and all(m in milestones_done or m <= common.trained_updates(ckpt_dir) for m in a.milestones[size]):
        shutil.rmtree(ckpt_dir, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    """curves.py's command line; its defaults are the study's settings."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/multi30k",
                   help="prepared Multi30k (OUTDIR of resnmt-prepare multi30k; default: data/multi30k)")
    p.add_argument("--ref", help="reference file (default: DATA/raw/test.de)")
    p.add_argument("--remove-bpe", default="sentencepiece", choices=["none", "subword_nmt", "sentencepiece"],
                   help="passed to resnmt-evaluate (default: sentencepiece)")
    p.add_argument("--milestones",
                   help="comma-separated budgets in updates at which each run of every size is scored; the "
                   "last is the run's length (default, per size: " + "; ".join(
                       f"{size} {','.join(map(str, ms))}" for size, ms in DEFAULT_MILESTONES.items()) + ")")
    p.add_argument("--only", help="comma-separated runs SIZE:ROW:SEED (e.g. small:post_ln:1,deep:sas:1)")
    p.add_argument("--max-tokens", type=int, default=4096, help="default: 4096")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--warmup", type=int, default=300, help="inverse-sqrt warm-up updates (default: 300)")
    p.add_argument("--dropout", type=float, default=0.3,
                   help="default: 0.3, the usual choice for Multi30k's 29k pairs trained this long")
    p.add_argument("--save-every", type=int, default=40, help="checkpoint interval in updates (default: 40)")
    p.add_argument("--average", type=int, default=5, help="average the newest N checkpoints (default: 5)")
    p.add_argument("--analyze-sentences", type=int, default=500,
                   help="validation sentences resnmt-analyze runs at each milestone (default: 500)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads per run (default: 2; not part of the settings key, recorded per line)")
    p.add_argument("--workers", type=int, default=1,
                   help="runs at a time (copies of this script; default: 1, so that each run ends within a session)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where every run trains and decodes (default: cpu); cuda adds the base size (6+6, d=512)")
    p.add_argument("--workdir", help="checkpoints and logs (default: runs/curves, runs/curves-cuda with --device cuda)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON lines appended here (default: %(default)s)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoints when it ends")
    p.add_argument("--tiny", action="store_true", help="train every run at the tiny size (smoke tests)")
    p.add_argument("--list", action="store_true",
                   help="print the planned runs, the milestones each has recorded and, for an unfinished run, "
                   "the update its checkpoints in --workdir reach; then exit")
    return p


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)

    if a.milestones is None:
        a.milestones = {size: list(ms) for size, ms in DEFAULT_MILESTONES.items()}
    else:
        try:
            ms = sorted({int(m) for m in a.milestones.split(",") if m.strip()})
        except ValueError:
            p.error(f"--milestones {a.milestones!r}: expected comma-separated numbers of updates")
        a.milestones = {size: ms for size in DEFAULT_MILESTONES}
    for ms in a.milestones.values():
        bad = [m for m in ms if m <= 0 or m % a.save_every]
        if not ms or bad:
            p.error(f"--milestones {bad or ms}: each must be a positive multiple of --save-every {a.save_every}")
        if ms[0] < a.average * a.save_every:
            p.error(f"--milestones {ms[0]}: the first milestone needs {a.average} checkpoints "
                    f"(--average) every {a.save_every} updates (--save-every), so at least {a.average * a.save_every}")
    a.only = set(x.strip() for x in a.only.split(",")) if a.only else None
    if a.only:
        known = {f"{s}:{r}:{n}" for s, r, n in STUDY_ORDER} | {f"{s}:{slug(r)}:{n}" for s, r, n in STUDY_ORDER}
        unknown = sorted(a.only - known)
        if unknown:
            p.error(f"--only {','.join(unknown)}: not in the study; choose SIZE:ROW:SEED from: "
                    + ", ".join(f"{s}:{slug(r)}:{n}" for s, r, n in STUDY_ORDER))
        gpu_only = sorted(x for x in a.only if x.split(":", 1)[0] in GPU_ONLY_SIZES)
        if gpu_only and a.device == "cpu":
            p.error(f"--only {','.join(gpu_only)}: the {'/'.join(GPU_ONLY_SIZES)} size runs only with --device cuda")
    a.workdir = Path(a.workdir or ("runs/curves" if a.device == "cpu" else f"runs/curves-{a.device}"))
    a.out = Path(a.out)
    a.bin_dir = Path(a.data) / "bin"
    a.ref = Path(a.ref) if a.ref else Path(a.data) / "raw" / "test.de"
    settings = settings_of(a)
    key = common.settings_key(settings)
    runs = planned(a)

    if a.list:
        done = done_milestones(a.out, key, a.device)
        width = max((len(row) for _, row, _ in runs), default=0)
        for size, row, seed in runs:
            have = sorted(done.get((size, row, seed), ()))
            finished = set(a.milestones[size]) <= set(have)
            state = "done   " if finished else ("partial" if have else "missing")
            resumes = 0 if finished else resume_point(run_dir_of(a, key, size, row, seed) / "checkpoints")
            where = f"  (checkpoints to update {resumes} in {a.workdir})" if resumes else ""
            print(f"{state}  {size:5s} {row:{width}s} seed {seed}  milestones {have}{where}")
        return 0
    for path in (a.bin_dir / "dict.en.txt", a.ref):
        if not path.exists():
            p.error(f"{path} is missing; run resnmt-prepare multi30k --mirror DIR {a.data} "
                    f"(or without --mirror to download)")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if a.workers > 1:
        child = [sys.executable, __file__, *[x for x in (argv if argv is not None else sys.argv[1:])]]
        child = [c for i, c in enumerate(child) if not (c == "--workers" or (i and child[i - 1] == "--workers")
                                                          or c.startswith("--workers="))]
        procs = [subprocess.Popen(child) for _ in range(a.workers)]
        return max(proc.wait() for proc in procs)

    env = tool_env(threads=a.threads, cpu_only=a.device == "cpu")
    device = common.cpu_description() if a.device == "cpu" else common.cuda_description()
    while True:
        done = done_milestones(a.out, key, a.device)
        todo = [r for r in runs if not set(a.milestones[r[0]]) <= done.get(r, set())]
        for size, row, seed in todo:
            lock = RunLock(run_dir_of(a, key, size, row, seed))
            if lock.acquire():
                try:
                    one_run(a, settings, key, size, row, seed, done.get((size, row, seed), set()), env, device)
                finally:
                    lock.release()
                break  # re-read what is done: other workers may have finished runs meanwhile
        else:
            return 0  # every remaining run is done or locked by another worker


if __name__ == "__main__":
    sys.exit(main())
