"""gpu_train.py's whole processes: complete fairseq-train (and resnmt-train) runs, stock against
resnmt, interleaved in rounds (the order reversed every other round; a round named A,B,B,A
repeats both runs in it, so that a drift of the machine over the round weighs on both alike,
and stock against stock is the noise floor); fairseq's own wps per
logged interval read from its json log (the median, and apart over the first epoch, where every
batch shape is new and the fast path records its CUDA graphs, and the later ones), the fast
path's shape buckets and graphs from its log, and each run's per-update losses against its
reference's. After each round a summary line per run: its steady-state wps round by round, its
ratio to stock of its size in the same round (``rows.WHOLE_TARGETS``; a run repeated in a round
counts with the mean of its repeats), the noise floor (a run repeated in a round against its
first), the verdict (``verdicts.trainer_verdict``: a speed target passes only where the lowest
of at least three rounds' ratios, shrunk by the noise floor, clears it; a same-math pair
resolves only over four rounds above the noise floor) and MFU against the measured peak of the
precision that ran. The steady window of a fast-path process starts after its last recorded
CUDA graph (and after ``--whole-skip``).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

from rows import WHOLE_PROCESSES, WHOLE_TARGETS
from stats import median_min_max, middle_half, noise_floor
from trainer_rounds import SMOKE_SIZE, record
from verdicts import trainer_verdict

from resnmt.experiment.steps import FairseqLog
from resnmt.study.records import portable_argv

from campaign.files import REPO_ROOT

# what the fast path logs (resnmt/training/fast/): its buckets' padding once, how its steps run
# once, and a line per CUDA graph recorded
_BUCKETS_RE = re.compile(r"\[fast path\] shape buckets: (\d+) shapes .*?padding: ([\d.]+) % of the token slots "
                         r"\(fairseq's own \d+ batches: ([\d.]+) %\)")
_STEPS_RE = re.compile(r"\[fast path\] the update on the \w+ \([^)]*\), (.*)")
_CAPTURE_RE = re.compile(r"\[fast path\] captured \S+ .*? in ([\d.]+) s \(graph (\d+)\)")
_PRIMED_RE = re.compile(r"\[fast path\] \d+ shapes and the update recorded before training in ([\d.]+) s")
_ADAM_RE = re.compile(r"\[fast path\] (?:Adam: (.*)|the fused Adam kernel failed \((.*)\); Adam runs as)")
_LOSS_RE = re.compile(r"\[fast path\] (?:loss: (.*)|the fused cross-entropy kernel failed \((.*)\); the loss runs as)")
_FAILED_RE = re.compile(r"\[fast path\] (.*: its (?:warm-up|capture) failed .*); this shape runs eagerly from now on")


def round_order(runs: List[str], rnd: int) -> List[str]:
    """The runs of round ``rnd`` (from 1): as given in odd rounds, reversed in even ones."""
    return list(runs) if rnd % 2 else list(reversed(runs))


def fast_path_log(text: str, intervals: List[dict]) -> dict:
    """What a --fast-path process's log says: the shape buckets' padding (and fairseq's own
    batches'), how its steps and Adam ran, the CUDA graphs recorded, their seconds, and the last
    logged update at which one was added (after the first epoch only a batch shape met for
    the first time may add one); empty for any other process."""
    rec = {}
    buckets = _BUCKETS_RE.search(text)
    if buckets:
        rec.update(shapes=int(buckets.group(1)), padding_fraction=float(buckets.group(2)) / 100,
                   fairseq_padding_fraction=float(buckets.group(3)) / 100)
    steps = _STEPS_RE.search(text)
    captures = [float(s) for s, _ in _CAPTURE_RE.findall(text)]
    if steps:
        rec["steps"] = steps.group(1).strip()
    if steps or captures:
        grew = [i["num_updates"] for prev, i in zip(intervals, intervals[1:])
                if i.get("graphs", 0) > prev.get("graphs", 0)]
        rec.update(graphs=len(captures), capture_s=sum(captures), last_update_with_a_new_graph=max(grew, default=None))
    primed = _PRIMED_RE.search(text)
    if primed:  # every shape recorded at start-up, before the first update
        rec["recorded_before_training_s"] = float(primed.group(1))
    adam = _ADAM_RE.findall(text)
    if adam:  # how Adam ran (the Triton kernel's failure, where it fell back)
        rec["adam"] = "; ".join(how or f"the Triton kernel failed ({why})" for how, why in adam)
    loss = _LOSS_RE.findall(text)
    if loss:  # how the loss ran (the Triton kernel's failure, where it fell back)
        rec["loss"] = "; ".join(how or f"the Triton kernel failed ({why})" for how, why in loss)
    failed = _FAILED_RE.findall(text)
    if failed:  # shapes that run eagerly: which and why
        rec["eager_shapes"] = failed
    return rec


def steady_wps(rec: dict) -> Optional[float]:
    """A process's steady-state wps: its later epochs' median (the whole run's where it
    never left its first epoch)."""
    return rec.get("wps_median_later_epochs") or rec.get("wps_median")


def whole_summaries(done: List[dict], env: dict) -> List[dict]:
    """A line per run of the rounds so far (``done``: the processes' records): its steady
    wps round by round, its ratio to its reference of the same round (median, min-max, each
    round's), the noise floor (the largest per-round ratio of a run repeated in a round to
    its first), the verdict, and MFU (6 x parameters x wps, an approximation leaving
    attention's own products out) against the measured peak of the precision that ran."""
    rounds: Dict[int, Dict[tuple, dict]] = {}
    for r in done:
        rounds.setdefault(r["round"], {})[(r["run"], r["repeat"])] = r
    again = {(r["run"], r["repeat"]) for r in done if r["repeat"] > 1}
    repeated = [[steady_wps(by[(n, k)]) / steady_wps(by[(n, 1)]) for by in rounds.values()
                 if (n, 1) in by and (n, k) in by] for n, k in again]
    floors = [noise_floor(ratios) for ratios in repeated if ratios]
    noise = max(floors) if floors else None
    lines = []

    def round_wps(by: Dict[tuple, dict], name: str) -> float:  # the mean of the run's repeats in a round
        return statistics.mean(steady_wps(r) for (n, _), r in by.items() if n == name)

    for name in dict.fromkeys(r["run"] for r in done):
        own = [(rnd, by[(name, 1)]) for rnd, by in sorted(rounds.items()) if (name, 1) in by]
        wps = [round_wps(rounds[rnd], name) for rnd, _ in own]
        med, lo, hi = median_min_max(wps)
        first = own[0][1]
        line = {"kind": "whole_summary", "run": name, "device": env["device"], "job": env["time"],
                "precision": first["precision"], "tokens": first["tokens"], "rounds": len(wps),
                "wps_steady": med, "wps_steady_min": lo, "wps_steady_max": hi, "spread": (hi - lo) / med,
                "wps_steady_rounds": wps, "noise_floor": noise}
        peak = env.get("peak_tflops", {}).get(first["precision"])
        if peak and first.get("params"):
            line.update(mfu_6nd=6 * first["params"] * med / (peak * 1e12), peak_dtype=first["precision"],
                        peak_tflops=peak)
        target = WHOLE_TARGETS.get(name)
        ratios = [round_wps(rounds[rnd], name) / round_wps(rounds[rnd], target.reference) for rnd, _ in own
                  if target and (target.reference, 1) in rounds[rnd]]
        if ratios:
            r_med, r_lo, r_hi = median_min_max(ratios)
            line.update(reference=target.reference, ratio=r_med, ratio_min=r_lo, ratio_max=r_hi, ratio_rounds=ratios)
            quartiles = middle_half(ratios)
            if quartiles:
                line.update(ratio_q1=quartiles[0], ratio_q3=quartiles[1])
            line.update(trainer_verdict(target, dict(line, rounds=len(ratios)), noise))
        lines.append(line)
    return lines


def time_whole_processes(a, out: Path, deadline: float, env: dict):
    """The whole processes ``--whole-runs`` names, ``--whole-rounds`` times (the order
    reversed every other round), each recorded as it ends (a run that fails or times out:
    its error) until ``deadline``; after each round the runs' summaries. A run named again
    in a round is recorded with its ``repeat`` (2, 3, ...): identical processes of one round,
    whose difference is the noise floor of the ratios between the others."""
    losses, done = {}, []
    runs = a.whole_runs.split(",")
    # fairseq-train makes its --save-dir even with --no-save: a scratch one, not ./checkpoints
    with tempfile.TemporaryDirectory(prefix="gpu_train-") as scratch:
        for rnd in range(1, a.whole_rounds + 1):
            repeats = Counter()
            for name in round_order(runs, rnd):
                if time.monotonic() > deadline:
                    print(f"[gpu_train] deadline: whole-process run {name} of round {rnd} not started", file=sys.stderr)
                    break
                repeats[name] += 1
                rec = whole_process(a, name, scratch, env, losses, rnd, repeats[name])
                record(out, rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "intervals"}), flush=True)
                if "error" not in rec:
                    done.append(rec)
            else:
                for line in whole_summaries(done, env) if done else []:
                    record(out, line)
                    print(json.dumps(line), flush=True)
                continue
            break


def whole_argv(a, name: str, scratch: str) -> List[str]:
    """The command line of run ``name`` (the interpreter first): its program and model flags
    (``rows.WHOLE_PROCESSES``), the papers' training settings, ``--whole-tokens`` per batch,
    its precision (the name's last word; ``--cpu``: the CPU's float32)."""
    module, flags = WHOLE_PROCESSES[name]
    if "--compile-layers" in flags:
        flags += ("--compile-backend", a.compile_backend)
        if a.compile_backend != "inductor" and "--compile-mode" in flags:  # the rehearsal's backend takes no mode
            i = flags.index("--compile-mode")
            flags = flags[:i] + flags[i + 2:]
    argv = [sys.executable, "-m", module, *flags, str(a.data), "--share-all-embeddings", "--dropout", "0.1",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
            "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "4000", "--max-tokens", str(a.whole_tokens), "--seed", "1",
            "--max-update", str(a.whole_updates), "--log-interval", str(a.whole_interval), "--log-format", "json",
            "--no-progress-bar", "--disable-validation", "--no-save", "--num-workers", "0", "--save-dir", scratch]
    if "--optimizer" in flags:  # the recipe's adam_fused replaces adam
        i = argv.index("--optimizer", argv.index(str(a.data)))
        del argv[i:i + 2]
    argv += SMOKE_SIZE.fairseq_flags() if a.smoke else []
    return argv + (["--cpu"] if a.cpu else [f"--{name.rsplit('_', 1)[1]}"])


def whole_process(a, name: str, scratch: str, env: dict, losses: dict, rnd: int, repeat: int) -> dict:
    """One process of run ``name``: its record (or its error)."""
    run = {"kind": "whole_process", "run": name, "round": rnd, "repeat": repeat, "tokens": a.whole_tokens}
    argv = whole_argv(a, name, scratch)
    precision = name.rsplit("_", 1)[1]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=a.whole_timeout,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])))
    except subprocess.TimeoutExpired:
        return {**run, "error": f"timed out after {a.whole_timeout} s"}
    wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    log = FairseqLog.parse(text)
    inner = [r for r in log.inner if "num_updates" in r]
    if proc.returncode != 0 or not inner:
        return {**run, "error": (proc.stderr or proc.stdout)[-2000:]}
    # fairseq's own per-interval figures after the warm-up: train_wall (time inside train_step)
    # against wall says whether the time goes to the update or around it; the epoch, because
    # the first meets every batch shape for the first time; the fast path's graphs so far
    every = [{"num_updates": int(r["num_updates"]),
              **{k: float(r[k]) for k in ("epoch", "loss", "wps", "ups", "wpb", "train_wall", "wall", "graphs")
                 if k in r}} for r in inner]
    graphs = fast_path_log(text, every)
    skip = max(a.whole_skip, graphs.get("last_update_with_a_new_graph") or 0)  # steady: after the last capture
    intervals = [i for i in every if i["num_updates"] > skip]
    wps = [i["wps"] for i in intervals]
    by_epoch = {"first_epoch": [i["wps"] for i in intervals if i.get("epoch") == 1],
                "later_epochs": [i["wps"] for i in intervals if i.get("epoch", 1) > 1]}
    mine = {int(r["num_updates"]): float(r["loss"]) for r in inner}
    losses.setdefault((name, repeat), mine)
    rec = {**run, "device": env["device"], "job": env["time"], "precision": "fp32" if a.cpu else precision,
           "argv": portable_argv(argv[1:], Path(a.data).parent), "wall_s": wall, "updates": max(mine),
           "params": log.params,
           **dict(zip(("wps_median", "wps_min", "wps_max"), median_min_max(wps) if wps else (None,) * 3)),
           "wps_intervals": len(wps), "intervals": intervals,
           **{f"wps_median_{part}": statistics.median(v) if v else None for part, v in by_epoch.items()},
           **{f"wps_intervals_{part}": len(v) for part, v in by_epoch.items()},
           "steady_after_update": skip, **graphs}
    # the per-update losses against the reference's (a repeated run: against its first)
    reference = losses.get((WHOLE_TARGETS[name].reference, 1) if name in WHOLE_TARGETS else (name, 1))
    if reference is not None and reference is not mine:
        shared = sorted(set(reference) & set(mine))
        rec["max_abs_loss_diff_vs_stock"] = max(abs(reference[u] - mine[u]) for u in shared)
        rec["loss_diff_updates"] = len(shared)
    return rec
