"""How many training runs share one GPU best: N runs of post-LN started side by side for a
fixed window, each one's updates per second read from fairseq's ``train_inner`` lines, and
their total per N, one JSON line per N (``n_runs``, ``total_ups``, ``per_run_ups``, whether
NVIDIA MPS ran, the device). The study then trains the N of the highest total that still
lets each run reach its length within a lease (:func:`campaign.plan.workers_from_sweep`).
"""
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Optional

from resnmt.experiment import steps

from campaign.cores import start_side_by_side

# the interval fairseq logs a train_inner line at in a sweep's runs (updates), and the
# intervals left out of each run's rate (start-up: the first batches, allocator warm-up)
SWEEP_LOG_INTERVAL, SWEEP_SKIP_INTERVALS = 10, 1
# where nvidia-cuda-mps-control -d opens its control pipe (unless CUDA_MPS_PIPE_DIRECTORY says otherwise)
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"


def mps_running() -> bool:
    """Whether an NVIDIA MPS control daemon is up for this user's processes (its pipe is there)."""
    return (Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DIRECTORY)) / "control").exists()


def run_rate(log: Path, skip: int = SWEEP_SKIP_INTERVALS) -> Optional[float]:
    """A run's updates per second: the median ``ups`` of its ``train_inner`` lines after the
    first ``skip`` (None when none is left)."""
    ups = [float(x["ups"]) for x in steps.FairseqLog.read(log).inner if "ups" in x][skip:]
    return statistics.median(ups) if ups else None


def run_window(argvs, logs, seconds: float, pin: bool, env) -> list:
    """``argvs`` started side by side (``pin``: each on its own cores), each writing its log,
    stopped after ``seconds`` (those still training). Each one's exit status where it ended
    by itself within the window (a crash, e.g. out of memory), else None."""
    files = [open(log, "w", encoding="utf-8") for log in logs]
    try:
        procs = start_side_by_side(argvs, pin, files, env=env)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.5)
        ended = [p.poll() for p in procs]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    finally:
        for f in files:
            f.close()
    return ended


def sweep_line(n: int, rates: list, **recorded) -> dict:
    """The JSON line of one step: ``n`` runs side by side and each one's ``rates`` (None: no
    rate logged within the window, counted as 0 in the total)."""
    per_run = [round(r, 3) if r is not None else None for r in rates]
    return {"benchmark": "concurrency_sweep", "n_runs": n, "total_ups": round(sum(r or 0.0 for r in rates), 3),
            "per_run_ups": per_run, "runs_measured": sum(r is not None for r in rates), **recorded}


def measure(counts, seconds: float, argv_of, workdir: Path, pin: bool, env, **recorded):
    """For each N of ``counts``: N runs (``argv_of(save_dir)``: a run's command line) side by
    side for ``seconds``, their logs in ``workdir/nN/``; yields each step's :func:`sweep_line`
    (with ``recorded``) as it ends."""
    for n in counts:
        step = Path(workdir) / f"n{n}"
        step.mkdir(parents=True, exist_ok=True)
        logs = [step / f"run{i}.log" for i in range(n)]
        ended = run_window([argv_of(step / f"run{i}") for i in range(n)], logs, seconds, pin, env)
        yield sweep_line(n, [run_rate(log) for log in logs], pinned=pin, mps=mps_running(), window_seconds=seconds,
                         ended_early=ended, **recorded)
