"""What the curves study trains: each language pair's plan (its runs, most decisive first,
and each size's milestones), the runs one invocation trains, the GPU study's schedule
(chosen from a measured sweep), and how many runs a GPU lease trains side by side.
"""
import statistics
from dataclasses import dataclass
from pathlib import Path

from resnmt.experiment import steps
from resnmt.experiment.results import read_jsonl
from resnmt.study.milestones import PAIRS
from resnmt.study.records import settings_key

from campaign import tables
from campaign.rows import (CONTROL_ROWS, CURVES_ROWS, DEFAULT_MILESTONES, GEN2025_KINDS, GEN2025_VARIANTS, NEW_KINDS,
                           SAME_RUN, slug)

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
# size to the budget its EN-DE verdict is read at (tables.VERDICT_BUDGETS).
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
# side by side; `benchmarks/curves.py --choose-schedule` applies choose_schedule). The candidates:
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



def sweep_choice(settings: dict, lines, device: str = "cuda"):
    """:func:`choose_schedule` over the sweep's runs of ``settings`` (the study's, each
    candidate's schedule in its place; the sweep runs the stock path) in the curves ``lines``."""
    swept = {k: v for k, v in settings.items() if k != "fast_path"}
    keys = {c: settings_key({**swept, "lr": c[0], "warmup_updates": c[1]}) for c in SWEEP_SCHEDULES}
    return choose_schedule(lines, keys, device)

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


def workers_from_sweep(lines, device: str, updates: int, milestones: int):
    """(N, why): the runs side by side with the highest total updates per second in the
    concurrency sweep's ``lines`` (dicts; campaign.concurrency) on ``device``, among
    those where each run reaches ``updates`` within a lease (as :func:`workers_for`: its
    share of the total, plus ``milestones`` * MILESTONE_SECONDS); where none does, the N whose
    runs each go fastest. A step where a run ended early (a crash: out of memory) or logged no
    rate (it had not started training within the window) is not taken. None when the lines
    hold no such step on ``device``."""
    steps = {r["n_runs"]: r for r in lines if r.get("benchmark") == "concurrency_sweep" and r.get("device") == device
             and r["total_ups"] > 0 and r.get("runs_measured", r["n_runs"]) == r["n_runs"]
             and not any(e is not None for e in r.get("ended_early", ()))}  # a later step of N wins
    if not steps:
        return None, f"no concurrency sweep line on {device}"
    seconds = {n: updates * n / r["total_ups"] + milestones * MILESTONE_SECONDS for n, r in steps.items()}
    fits = [n for n in steps if seconds[n] <= LEASE_SECONDS]
    n = (max(fits, key=lambda n: steps[n]["total_ups"]) if fits
         else max(steps, key=lambda n: steps[n]["total_ups"] / n))
    why = "; ".join(f"{m} at once: {steps[m]['total_ups']:.2f} updates/s in all, a run to {updates} updates in "
                    f"{seconds[m]:.0f} s" for m in sorted(steps))
    rule = "the highest total within a lease" if fits else "no N fits a lease: the fastest run"
    return n, f"{why}; {rule} ({LEASE_SECONDS} s): {n}"


def plan_order(a, lines) -> list:
    """The runs of ``a.pair``'s plan in priority order; on another pair than the study's own,
    then the second seeds its verdicts ask for (tables.second_seeds, from the curves
    ``lines``)."""
    order = list(PLANS[a.pair].order)
    if a.pair != tables.MAIN_PAIR:
        runs = tables.runs_of(r for path in lines for r in read_jsonl(path))
        order += [r for r in tables.second_seeds(runs, other=a.pair) if r not in order]
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


