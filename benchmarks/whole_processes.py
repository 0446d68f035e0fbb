"""gpu_train.py's whole processes: complete fairseq-train (and resnmt-train) runs, stock against
resnmt, one after the other; fairseq's own wps per logged interval read from its json log
(the median, and apart over the first epoch, where every batch shape is new, and the later
ones), and each run's per-update losses against stock's.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from records import REPO_ROOT, portable_argv
from rows import WHOLE_PROCESSES
from stats import median_min_max
from trainer_rounds import SMOKE_SIZE, record

from resnmt.experiment.steps import FairseqLog


STOCK_RUN = "stock_fairseq_train_fp16"


def time_whole_processes(a, out: Path, deadline: float, env: dict):
    """The whole processes ``--whole-runs`` names, in its order, each recorded as it ends (a
    run that fails or times out: its error) until ``deadline``. A run named again is
    recorded with its ``repeat`` (2, 3, ...): identical processes of one job, whose
    difference is the noise floor of the ratios between the others."""
    losses, repeats = {}, Counter()
    # fairseq-train makes its --save-dir even with --no-save: a scratch one, not ./checkpoints
    with tempfile.TemporaryDirectory(prefix="gpu_train-") as scratch:
        for name in a.whole_runs.split(","):  # in the order given
            repeats[name] += 1
            run = {"kind": "whole_process", "run": name, "repeat": repeats[name]}
            module, flags = WHOLE_PROCESSES[name]
            if "--compile-layers" in flags:
                flags += ("--compile-backend", a.compile_backend)
            cmd = [sys.executable, "-m", module, *flags]
            if time.monotonic() > deadline:
                print(f"[gpu_train] deadline: whole-process run {name} not started", file=sys.stderr)
                break
            argv = [*cmd, str(a.data), "--share-all-embeddings", "--dropout", "0.1", "--criterion",
                    "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
                    "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt",
                    "--warmup-updates", "4000", "--max-tokens", str(a.whole_tokens), "--seed", "1",
                    "--max-update", str(a.whole_updates), "--log-interval", str(a.whole_interval),
                    "--log-format", "json",
                    "--no-progress-bar", "--disable-validation", "--no-save", "--num-workers", "0",
                    "--save-dir", scratch]
            if "--optimizer" in flags:  # the recipe's adam_fused replaces adam
                i = argv.index("--optimizer", argv.index(str(a.data)))
                del argv[i:i + 2]
            argv += SMOKE_SIZE.fairseq_flags() if a.smoke else []
            precision = name.rsplit("_", 1)[1]
            argv += ["--cpu"] if a.cpu else [f"--{precision}"]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=a.whole_timeout,
                                      env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                          [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])))
            except subprocess.TimeoutExpired:
                record(out, {**run, "error": f"timed out after {a.whole_timeout} s"})
                continue
            wall = time.perf_counter() - t0
            inner = [r for r in FairseqLog.parse(proc.stdout + proc.stderr).inner if "num_updates" in r]
            if proc.returncode != 0 or not inner:
                record(out, {**run, "error": (proc.stderr or proc.stdout)[-2000:]})
                continue
            # fairseq's own per-interval figures after the warm-up: train_wall (time inside
            # train_step) against wall says whether the time goes to the update or around it;
            # the epoch, because the first meets every batch shape for the first time
            intervals = [{"num_updates": int(r["num_updates"]),
                          **{k: float(r[k]) for k in ("epoch", "loss", "wps", "ups", "wpb", "train_wall", "wall")
                             if k in r}}
                         for r in inner if int(r["num_updates"]) > a.whole_skip]
            wps = [i["wps"] for i in intervals]
            by_epoch = {"first_epoch": [i["wps"] for i in intervals if i.get("epoch") == 1],
                        "later_epochs": [i["wps"] for i in intervals if i.get("epoch", 1) > 1]}
            mine = losses[(name, repeats[name])] = {int(r["num_updates"]): float(r["loss"]) for r in inner}
            rec = {**run, "device": env["device"], "job": env["time"],
                   "precision": "fp32" if a.cpu else precision,
                   "argv": portable_argv(argv[1:], Path(a.data).parent), "wall_s": wall,
                   "updates": max(mine),
                   **dict(zip(("wps_median", "wps_min", "wps_max"), median_min_max(wps) if wps else (None,) * 3)),
                   "wps_intervals": len(wps), "intervals": intervals,
                   **{f"wps_median_{part}": statistics.median(v) if v else None for part, v in by_epoch.items()},
                   **{f"wps_intervals_{part}": len(v) for part, v in by_epoch.items()}}
            stock = losses.get((STOCK_RUN, 1))
            if stock is not None and mine is not stock:
                shared = sorted(set(stock) & set(mine))
                rec["max_abs_loss_diff_vs_stock"] = max(abs(stock[u] - mine[u]) for u in shared)
                rec["loss_diff_updates"] = len(shared)
            record(out, rec)
            print(json.dumps(rec), flush=True)
