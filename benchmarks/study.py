"""The curves study's runs (curves.py is its command): the plan, most decisive runs first; what
is done (the milestones recorded per run); a lock per run directory, so that several copies
of curves.py share the plan; and one run trained to each milestone in turn, its average
decoded, scored and analysed, one JSON line per milestone.
"""
import fcntl
import shutil
import sys
from pathlib import Path

import runs
from records import portable_path, run_id
from rows import CONTROL_ROWS, CURVES_ROWS, GEN2025_KINDS, GEN2025_VARIANTS, NEW_KINDS, SAME_RUN, slug

from resnmt.checkpoints.averaging import numbered_checkpoints
from resnmt.experiment import steps
from resnmt.experiment.presets import SIZES
from resnmt.shared import append_jsonl, read_jsonl

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


def planned(a):
    runs = []
    for size, row, seed in STUDY_ORDER:
        if row not in CURVES_ROWS:  # a connection kind that has not landed yet
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
    return max(found[-1][0] if found else 0, runs.trained_updates(ckpt_dir))


def score_milestones(a, settings, key, size, row, seed, milestones_done, env, device):
    """Train run (``size``, ``row``, ``seed``) to each of its milestones not yet done, scoring and
    recording each; its checkpoints go once every milestone is done (unless --keep-checkpoints)."""
    run_dir = run_dir_of(a, key, size, row, seed)
    ckpt_dir, log = run_dir / "checkpoints", run_dir / "log.txt"
    arch, row_flags = CURVES_ROWS[row].arch, list(CURVES_ROWS[row].flags)
    model_size = SIZES["tiny" if a.tiny else size]
    train_argv = runs.benchmark_train_argv(
        a.bin_dir, arch, row_flags, model_size, seed=seed, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=a.dropout, save_every=a.save_every, keep=a.average, validate=True)
    for updates in a.milestones[size]:
        if updates in milestones_done:
            continue
        print(f"[curves] {size} {row} seed {seed}: training to {updates} updates", file=sys.stderr, flush=True)
        total = runs.train_to(updates, train_argv, ckpt_dir, log, env)  # seconds over the whole run

        ckpts = runs.checkpoints_until(ckpt_dir, a.average, updates)
        avg = run_dir / f"checkpoint.avg{a.average}.upd{updates}.pt"
        result, decode_seconds = runs.average_and_score(
            ckpts, avg, run_dir / f"gen.test.upd{updates}.out", a.bin_dir, a.ref, log, env, remove_bpe=a.remove_bpe,
            max_len_a=1, max_len_b=50)
        avg.unlink()
        analysis = steps.analyze(ckpts[-1], a.bin_dir, run_dir / "analysis" / f"upd{updates}", log, env,
                                 num_sentences=a.analyze_sentences)
        fairseq_log = steps.FairseqLog.read(log)
        train_loss = [p for p in fairseq_log.train if p[0] <= updates]
        record = {
            "benchmark": "curves", "size": {"name": size, **model_size.as_dict()}, "row": row, "seed": seed,
            "arch": arch, "flags": row_flags, "updates": updates,
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
            "data": portable_path(a.bin_dir, Path(a.data)), "ref": portable_path(a.ref, Path(a.data)),
            "train_seconds": round(total, 1), "decode_seconds": round(decode_seconds, 1),
            **device, "torch_threads": a.threads,
            "finished": run_id(),
        }
        append_jsonl(a.out, record)
        print(f"[curves] {size} {row} seed {seed} @ {updates}: sacreBLEU {record['bleu']:.2f}, "
              f"valid loss {record['valid'][-1][1] if record['valid'] else float('nan'):.3f}",
              file=sys.stderr, flush=True)
    if not a.keep_checkpoints and all(m in milestones_done or m <= runs.trained_updates(ckpt_dir)
                                      for m in a.milestones[size]):
        shutil.rmtree(ckpt_dir, ignore_errors=True)
