"""The curves study's runs (curves.py is its command): the plan, most decisive runs first; what
is done (the milestones recorded per run); a lock per run directory, so that several copies
of curves.py share the plan; and one run trained to each milestone in turn, its average
decoded, scored and analysed, one JSON line per milestone.
"""
import fcntl
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import runs
import study_tables
from records import portable_path, run_id
from rows import CONTROL_ROWS, CURVES_ROWS, DEFAULT_MILESTONES, GEN2025_KINDS, GEN2025_VARIANTS, NEW_KINDS, SAME_RUN, slug

from resnmt.checkpoints.averaging import numbered_checkpoints
from resnmt.experiment import steps
from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl, read_jsonl

# The papers' sizes (GPU only), most decisive first: post-LN against pre-LN, rSkip+LN and
# SAS at base (6+6, d=512) under the GPU schedule; second seeds of the first three; the
# newer methods; then 12+12 at d=512, where post-LN is known to fail. Pairs that compare
# directly are adjacent, so that workers started together train them side by side.
PAPERS_SIZE_ORDER = (
    [("base", r, 1) for r in ("post_ln", "pre_ln", "rskip_ln (λ=2)", "sas")]
    + [("base", r, 2) for r in ("post_ln", "pre_ln", "rskip_ln (λ=2)")]
    + [("base", r, 1) for r in ("b2t", "hyper")]
    + [("base12", r, 1) for r in ("post_ln", "pre_ln", "rskip_ln (λ=2)")]
    + [("base12", r, 1) for r in ("b2t", "hyper")]
)

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
    + PAPERS_SIZE_ORDER
    + [(size, r, 1) for r in GEN2025_KINDS for size in ("deep", "small") if (size, r) not in SAME_RUN]
    # a second seed where one seed puts a 2025 kind ahead of post-LN at 2+2 (by less than, or
    # about, a row's seed spread)
    + [("small", "hyper", 2), ("small", "hybrid_norm", 2)]
    + [("deep", r, 1) for r in GEN2025_VARIANTS]
    # a second seed at 6+6 where one seed puts a 2025 kind ahead of or behind pre-LN by about
    # pre-LN's own seed spread (0.67) or a little more
    + [("deep", r, 2) for r in ("ln_scaling", "mix_ln", "mhc", "denseformer")]
)


# The study's positive claims again on a second language pair, Multi30k EN-FR: at 2+2 the
# kinds that led post-LN on EN-DE (hyper-connections, HybridNorm) and the two references; at
# 6+6 the kinds that led pre-LN or trained where post-LN failed, and the references. Each
# size to the budget its EN-DE verdict is read at (study_tables.VERDICT_BUDGETS).
CROSS_PAIR_ORDER = (
    [("small", r, 1) for r in ("post_ln", "hybrid_norm", "pre_ln", "hyper")]
    + [("deep", r, 1) for r in ("post_ln", "pre_ln", "rskip_ln (λ=2)", "b2t", "hyper", "denseformer", "mhc")]
)
CROSS_PAIR_MILESTONES = {"small": (600, 1200, 2400), "deep": (600, 1200)}


@dataclass(frozen=True)
class Plan:
    """What the study trains on one language pair of Multi30k: its runs in priority order and
    each size's milestones."""

    order: tuple
    milestones: dict


# language pair -> its plan; the pair names the prepared corpus (resnmt.data.corpora)
PLANS = {
    "en-de": Plan(STUDY_ORDER, DEFAULT_MILESTONES),
    "en-fr": Plan(CROSS_PAIR_ORDER, CROSS_PAIR_MILESTONES),
}


# Sizes planned only with --device cuda: a CPU trains the papers' base size ~20x slower
# than the 6+6 d=128 model.
GPU_ONLY_SIZES = ("base", "base12")


# The GPU study's schedule: inverse square root, as the CPU study's, with a lower
# peak and a longer warm-up, chosen on the GPU by a measured sweep of post-LN at base size
# (benchmarks/gpu_job.sh part 6 trains post-LN seed 1 under each candidate to 2000 updates,
# side by side; `curves.py --choose-schedule` applies choose_schedule). The candidates:
# Transformer-base's peak 7e-4 with 1000 and 2000 warm-up updates, and fairseq's IWSLT peak
# 5e-4 with 1000; each reaches its peak within the sweep, where post-LN at lr 1e-3 failed
# (diverged with 300 warm-up updates, stalled at 24 BLEU with 1000). FALLBACK_SCHEDULE, the
# lowest peak with the longest warm-up considered, is taken when no candidate trains.
SWEEP_SCHEDULES = ((7e-4, 2000), (7e-4, 1000), (5e-4, 1000))
FALLBACK_SCHEDULE = (5e-4, 4000)
# A candidate trains when, at the newest milestone every candidate reached, its BLEU is at
# least SWEEP_MIN_BLEU and above its previous milestone's, and its newest validation loss is
# within SWEEP_RISE of its lowest (a loss that climbs again after the peak is post-LN's
# failure). Of those, the lowest newest validation loss wins; a lower peak or a longer
# warm-up within SWEEP_TIE of it is preferred (the safer schedule for the updates to come).
SWEEP_MIN_BLEU, SWEEP_RISE, SWEEP_TIE = 10.0, 0.05, 0.05


def schedule_of(settings: dict) -> dict:
    """The learning-rate schedule a line was trained under (recorded in each line; its
    numbers are in the settings, so another schedule has another settings key)."""
    return {"lr_scheduler": "inverse_sqrt", "lr": settings["lr"], "warmup_updates": settings["warmup_updates"]}


def execution_flags(a) -> list:
    """fairseq-train flags of how a run executes (recorded per line): the attention kernels,
    which compute the same (out of the settings key); and the fast path, whose static batch
    shapes make other batches (in the key: ``"fast_path"``)."""
    flags = []
    if a.sdpa_backends or a.fast_path:
        flags += ["--task", "resnmt_translation"]
    if a.sdpa_backends:
        flags += ["--sdpa-backends", a.sdpa_backends]
    if a.fast_path:
        flags += ["--fast-path"]
    return flags


def choose_schedule(lines, keys: dict, device: str = "cuda"):
    """((lr, warm-up), why): the GPU study's schedule from the sweep's post-LN base runs
    (seed 1) in the curves ``lines`` (files), ``keys`` mapping each candidate (lr, warm-up)
    to its settings key; by the rule above. FALLBACK_SCHEDULE when no candidate trains or
    one was not run."""
    runs = {c: {} for c in keys}
    for path in lines:
        for r in read_jsonl(path):
            for c, key in keys.items():
                if (r.get("benchmark") == "curves" and r["settings_key"] == key and r.get("device", "cpu") == device
                        and r["size"]["name"] == "base" and r["row"] == "post_ln" and r["seed"] == 1):
                    runs[c][r["updates"]] = r
    missing = [c for c, recs in runs.items() if not recs]
    if missing:
        return FALLBACK_SCHEDULE, f"fallback {FALLBACK_SCHEDULE}: no sweep line for {missing}"
    budget = min(max(recs) for recs in runs.values())
    verdicts = {}
    for c, recs in runs.items():
        r = recs.get(budget)
        earlier = [u for u in recs if u < budget]
        valid = [loss for u, loss, *_ in (r["valid"] if r else []) if u <= budget]
        trains = (r is not None and valid and r["bleu"] >= SWEEP_MIN_BLEU
                  and (not earlier or r["bleu"] > recs[max(earlier)]["bleu"]) and valid[-1] <= min(valid) + SWEEP_RISE)
        verdicts[c] = (bool(trains), valid[-1] if valid else float("inf"), r["bleu"] if r else None)
    why = "; ".join(f"lr {c[0]:g} warm-up {c[1]}: {'trains' if t else 'fails'} (BLEU {b}, valid loss {v:.3f})"
                    for c, (t, v, b) in verdicts.items()) + f" at {budget} updates"
    training = [c for c, (t, _, _) in verdicts.items() if t]
    if not training:
        return FALLBACK_SCHEDULE, f"fallback {FALLBACK_SCHEDULE}: no candidate trains: {why}"
    best = min(verdicts[c][1] for c in training)
    near = [c for c in training if verdicts[c][1] <= best + SWEEP_TIE]
    chosen = min(near, key=lambda c: (c[0], -c[1]))
    return chosen, f"chose lr {chosen[0]:g} warm-up {chosen[1]}: {why}"


# How many runs a GPU lease trains side by side (benchmarks/gpu_job.sh). A run's checkpoints
# cannot outlive the lease, so each run must reach its last milestone within it: LEASE_SECONDS
# of a 15-minute lease are left for training and scoring (after the machine's start, about
# 150 s, and two parts' set-ups, about 40 s each), and each milestone costs about
# MILESTONE_SECONDS besides training (fairseq-train's restart, the average, beam-4 decoding
# of test2016, resnmt-analyze; 25-50 s each on the H100 in 2026-11-24/25's GPU lines).
LEASE_SECONDS, MILESTONE_SECONDS = 620, 55


def updates_per_second(workdir: Path) -> dict:
    """{run directory: fairseq's updates per second, the median of its newest 10 logged
    intervals} of every run with a log under ``workdir`` (runs side by side measure their
    shared rate)."""
    rates = {}
    for log in sorted(Path(workdir).glob("*/*/*/log.txt")):
        ups = [float(x["ups"]) for x in steps.FairseqLog.read(log).inner if "ups" in x][-10:]
        if ups:
            rates[log.parent] = statistics.median(ups)
    return rates


def workers_for(total_ups: float, updates: int, milestones: int) -> int:
    """The most runs side by side that each reach ``updates`` within a lease, when runs share
    ``total_ups`` updates per second: W with updates / (total_ups / W) + milestones *
    MILESTONE_SECONDS <= LEASE_SECONDS (at least 1)."""
    return max(1, int(total_ups * (LEASE_SECONDS - milestones * MILESTONE_SECONDS) / updates))


def plan_order(a, lines) -> list:
    """The runs of ``a.pair``'s plan in priority order; on another pair than the study's own,
    then the second seeds its verdicts ask for (study_tables.second_seeds, from the curves
    ``lines``)."""
    order = list(PLANS[a.pair].order)
    if a.pair != study_tables.MAIN_PAIR:
        runs = study_tables.runs_of(r for path in lines for r in read_jsonl(path))
        order += [r for r in study_tables.second_seeds(runs, other=a.pair) if r not in order]
    return order


def planned(a, lines=()):
    runs = []
    for size, row, seed in plan_order(a, lines):
        if row not in CURVES_ROWS:  # a connection kind that has not landed yet
            continue
        if a.device == "cpu" and size in GPU_ONLY_SIZES and not a.tiny:  # tiny: the GPU job's rehearsal
            continue
        if a.sizes and size not in a.sizes:
            continue
        if a.only and f"{size}:{row}:{seed}" not in a.only and f"{size}:{slug(row)}:{seed}" not in a.only:
            continue
        runs.append((size, row, seed))
    return runs


def done_milestones(lines, key: str, device: str):
    """{(size, row, seed): milestones recorded} for these settings on ``device`` (cpu or cuda)
    in the curves ``lines`` (a file, or several)."""
    done = {}
    for r in (r for path in ([lines] if isinstance(lines, (str, Path)) else lines) for r in read_jsonl(path)):
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
        dropout=a.dropout, save_every=a.save_every, keep=a.average, validate=True) + execution_flags(a)
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
            "pair": a.pair, "data": portable_path(a.bin_dir, Path(a.data)), "ref": portable_path(a.ref, Path(a.data)),
            "train_seconds": round(total, 1), "decode_seconds": round(decode_seconds, 1),
            "schedule": schedule_of(settings), "execution_flags": execution_flags(a),
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
