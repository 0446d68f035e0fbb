#!/usr/bin/env python
"""``--fast-path`` against stock fairseq, as users run them: whole training processes.

Issue 55's measurement (its Must-have 4): whole ``fairseq-train`` / ``resnmt-train``
processes on the same data, interleaved, every run ``--rounds`` times, fairseq's own
``wps`` (target tokens per second) read from each process's json log, the first epoch
(where the fast path records its CUDA graphs and every path meets its batch shapes) and
the later epochs (steady state) apart, and the noise floor measured in the same job:
stock against stock, stated beside every ratio.

The runs (``--runs``, in this order within each round; the order reversed every other
round):

* ``stock``: ``python -m fairseq_cli.train --arch transformer --fp16`` (fairseq's adam);
* ``stock_again``: the same command once more, the noise floor (``stock_again / stock``);
* ``fast``: ``python -m resnmt.cli.train --arch transformer_postln_base --task
  resnmt_translation --fast-path --bf16 --optimizer adam_fused`` (resnmt's post-LN is stock
  fairseq's model; on CUDA its steps are captured as CUDA graphs where the model allows it,
  which the process's log says);
* ``fast_eager``: ``fast`` with ``--no-step-capture`` (the update without host syncs, no
  graphs: what the capture adds on top);
* ``recipe``: ``resnmt.cli.train ... --bf16 --optimizer adam_fused`` without the fast
  path (what the fast path adds to the bf16 recipe).

Every run trains ``--updates`` updates at ``--tokens`` tokens per batch (base size; ``--size
big``: ``transformer_wmt_en_de_big`` against ``transformer_postln_big``), logging every
``--interval`` updates; the first ``--skip`` updates are left out of the medians. A line per
finished process goes to ``--out`` (JSON lines; a job stopped from outside keeps the
finished ones): its wps per interval, the medians overall, over the first epoch and over
the later ones, its losses, fairseq's parameter count, and for the fast path the shape
buckets' padding, how many CUDA graphs it recorded, in how many seconds, and the last
update at which a graph was recorded (``graphs`` in its log: after the first epoch only a
batch shape met for the first time may add one). At the end one ``summary`` line: per run
the median (min-max) of the per-round later-epoch wps, each run's per-round ratio to
``stock`` of the same round (median, min-max; a ratio from one round is never called
resolved), the noise floor, and model FLOPs utilisation ``6 x parameters x wps`` over the
card's bf16 matrix rate measured here (``--matmul-size``; an approximation that leaves
attention's own products out).

    python benchmarks/fast_path_job.py --data .gpu/multi30k/bin --out $OUT/fast_path.jsonl  # on the GPU
    python benchmarks/fast_path_job.py --smoke --cpu --data DIR --out /tmp/x.jsonl --rounds 1   # rehearsal

``benchmarks/fast_path_job.sh`` runs it on the bare GPU machine after the CUDA checks of
tests/test_fast_path.py (docs/training.md, "The fast path").
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from resnmt.experiment.presets import ModelSize  # noqa: E402
from resnmt.experiment.runtime import USER_DIR  # noqa: E402
from resnmt.experiment.steps import FairseqLog  # noqa: E402
from resnmt.shared import append_jsonl  # noqa: E402

BENCHMARK = "fast_path"
SMOKE_SIZE = ModelSize(2, 64, 256, 4)
# size -> (stock fairseq's arch, resnmt's post-LN arch: stock fairseq's model)
ARCHS = {"base": ("transformer", "transformer_postln_base"),
         "big": ("transformer_wmt_en_de_big", "transformer_postln_big")}
RESNMT_TASK = ("--task", "resnmt_translation")
# run -> (program module, resnmt's model or stock's, its flags, precision)
RUNS = {
    "stock": ("fairseq_cli.train", "stock", (), "fp16"),
    "stock_again": ("fairseq_cli.train", "stock", (), "fp16"),
    "fast": ("resnmt.cli.train", "resnmt", RESNMT_TASK + ("--fast-path", "--optimizer", "adam_fused"), "bf16"),
    "fast_eager": ("resnmt.cli.train", "resnmt",
                   RESNMT_TASK + ("--fast-path", "--no-step-capture", "--optimizer", "adam_fused"), "bf16"),
    "recipe": ("resnmt.cli.train", "resnmt", ("--optimizer", "adam_fused"), "bf16"),
}
DEFAULT_RUNS = "stock,fast,stock_again,fast_eager"
REFERENCE, NOISE = "stock", "stock_again"
_BUCKETS_RE = re.compile(r"\[fast path\] shape buckets: (\d+) shapes .*?padding: ([\d.]+) % of the token slots "
                         r"\(fairseq's own \d+ batches: ([\d.]+) %\)")
_CAPTURE_RE = re.compile(r"\[fast path\] captured \S+ .*? in ([\d.]+) s \(graph (\d+)\)")
_STEPS_RE = re.compile(r"\[fast path\] the update on the \w+ \([^)]*\), (.*)")


def run_argv(a, name: str, scratch: str) -> List[str]:
    """The command line of run ``name`` (without the interpreter)."""
    module, model, flags, precision = RUNS[name]
    stock_arch, resnmt_arch = ARCHS[a.size]
    argv = ["-m", module, str(a.data)]
    argv += ["--arch", stock_arch] if model == "stock" else ["--user-dir", str(USER_DIR), "--arch", resnmt_arch]
    argv += ["--share-all-embeddings", "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy",
             "--label-smoothing", "0.1", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler",
             "inverse_sqrt", "--warmup-updates", "4000", "--max-tokens", str(a.tokens), "--seed", "1",
             "--max-update", str(a.updates), "--log-interval", str(a.interval), "--log-format", "json",
             "--no-progress-bar", "--disable-validation", "--no-save", "--num-workers", str(a.num_workers),
             "--save-dir", scratch, *flags]
    if "--optimizer" not in flags:
        argv += ["--optimizer", "adam"]
    if a.smoke:
        argv += SMOKE_SIZE.fairseq_flags()
    argv += ["--cpu"] if a.cpu else [f"--{precision}"]
    return argv


def medians(values: List[float]) -> Optional[dict]:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def read_run(a, text: str) -> dict:
    """What one process's log says: wps per interval and its medians (overall, first
    epoch, later epochs), losses, parameters, and the fast path's buckets and graphs."""
    log = FairseqLog.parse(text)
    inner = [r for r in log.inner if "num_updates" in r]
    intervals = [{"num_updates": int(r["num_updates"]),
                  **{k: float(r[k]) for k in ("epoch", "loss", "wps", "ups", "wpb", "train_wall", "wall", "graphs")
                     if k in r}} for r in inner]
    timed = [i for i in intervals if i["num_updates"] > a.skip]
    rec = {"intervals": intervals, "params": log.params,
           "wps": medians([i["wps"] for i in timed]),
           "wps_first_epoch": medians([i["wps"] for i in timed if i.get("epoch", 1) == 1]),
           "wps_later_epochs": medians([i["wps"] for i in timed if i.get("epoch", 1) > 1]),
           "updates": max((i["num_updates"] for i in intervals), default=0)}
    buckets = _BUCKETS_RE.search(text)
    if buckets:
        rec.update(shapes=int(buckets.group(1)), padding_fraction=float(buckets.group(2)) / 100,
                   fairseq_padding_fraction=float(buckets.group(3)) / 100)
    steps = _STEPS_RE.search(text)
    if steps:
        rec["steps"] = steps.group(1).strip()
    captures = [(float(s), int(n)) for s, n in _CAPTURE_RE.findall(text)]
    if steps or captures:
        rec.update(graphs=len(captures), capture_s=sum(s for s, _ in captures))
        grew = [i["num_updates"] for prev, i in zip(intervals, intervals[1:])
                if i.get("graphs", 0) > prev.get("graphs", 0)]
        rec["last_update_with_a_new_graph"] = max(grew) if grew else None
    return rec


def peak_bf16_tflops(a) -> Optional[float]:
    """The card's bf16 matrix rate, measured (``--matmul-size`` cubed products); none on the CPU."""
    if a.cpu:
        return None
    import torch

    n = a.matmul_size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    t0, reps = time.perf_counter(), 10
    for _ in range(reps):
        x @ y
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def summarize(records: List[dict], peak: Optional[float]) -> dict:
    """Per run, the per-round later-epoch wps (the first epoch's where a run has no later
    one) and ratios to ``stock`` of the same round; the noise floor beside them."""
    def steady(rec):
        part = rec.get("wps_later_epochs") or rec.get("wps_first_epoch") or rec.get("wps")
        return part["median"] if part else None

    by_round: Dict[int, Dict[str, dict]] = {}
    for rec in records:
        by_round.setdefault(rec["round"], {})[rec["run"]] = rec
    runs = {}
    for name in dict.fromkeys(r["run"] for r in records):
        own = [(rnd, steady(recs[name])) for rnd, recs in sorted(by_round.items()) if name in recs]
        own = [(rnd, w) for rnd, w in own if w]
        ratios = [w / steady(by_round[rnd][REFERENCE]) for rnd, w in own
                  if REFERENCE in by_round[rnd] and steady(by_round[rnd][REFERENCE])]
        entry = {"wps_steady": medians([w for _, w in own]),
                 "wps_first_epoch": medians([r["wps_first_epoch"]["median"] for recs in by_round.values()
                                             for n, r in recs.items() if n == name and r.get("wps_first_epoch")]),
                 "ratio_to_stock": medians(ratios) if name != REFERENCE else None, "ratio_rounds": ratios}
        params = next((r["params"] for r in records if r["run"] == name and r.get("params")), None)
        if peak and params and entry["wps_steady"]:
            entry["mfu_6nd"] = 6 * params * entry["wps_steady"]["median"] / (peak * 1e12)
        if entry["ratio_to_stock"]:
            entry["resolved"] = entry["ratio_to_stock"]["n"] >= 2  # one round never resolves
        runs[name] = entry
    noise = runs.get(NOISE, {}).get("ratio_to_stock")
    return {"kind": "summary", "runs": runs, "noise_floor": noise, "peak_bf16_tflops": peak}


def table(summary: dict) -> str:
    """The summary as a markdown table, the noise floor under it."""
    def span(m, fmt):
        return f"{fmt(m['median'])} ({fmt(m['min'])}-{fmt(m['max'])})" if m else "-"

    wps, ratio = (lambda x: f"{x:,.0f}"), (lambda x: f"{x:.2f}")
    lines = ["| run | steady wps median (min-max) | first-epoch wps median | / stock, per round: median (min-max) "
             "| rounds | MFU (6ND) |", "|---|---|---|---|---:|---:|"]
    for name, e in summary["runs"].items():
        rounds = e["wps_steady"]["n"] if e["wps_steady"] else 0
        mfu = f"{100 * e['mfu_6nd']:.1f} %" if "mfu_6nd" in e else ""
        first = wps(e["wps_first_epoch"]["median"]) if e["wps_first_epoch"] else "-"
        to_stock = span(e["ratio_to_stock"], ratio) if e["ratio_to_stock"] else ""
        lines.append(f"| {name} | {span(e['wps_steady'], wps)} | {first} | {to_stock} | {rounds} | {mfu} |")
    noise = summary["noise_floor"]
    floor = (f"noise floor (stock_again / stock, per round): {span(noise, ratio)} over {noise['n']} rounds"
             if noise else "noise floor: not measured (no stock_again run)")
    return "\n".join(lines + ["", floor])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="fairseq-binarized data (train split) with a joined dictionary")
    p.add_argument("--out", required=True, help="JSON lines, one per finished process, then the summary")
    p.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma-separated runs of {', '.join(RUNS)} "
                   f"(default: {DEFAULT_RUNS})")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--size", choices=tuple(ARCHS), default="base", help="model size (default: base)")
    p.add_argument("--tokens", type=int, default=4096, help="--max-tokens (default: 4096)")
    p.add_argument("--updates", type=int, default=300, help="updates per process (default: 300, about two epochs of "
                   "Multi30k at 4096 tokens)")
    p.add_argument("--interval", type=int, default=10, help="--log-interval (default: 10)")
    p.add_argument("--skip", type=int, default=20, help="updates left out of the medians (default: 20)")
    p.add_argument("--num-workers", type=int, default=1, help="--num-workers (default: 1, fairseq's)")
    p.add_argument("--timeout", type=float, default=240, help="seconds a process may take (default: 240)")
    p.add_argument("--deadline", type=float, default=None, help="seconds after which no process starts")
    p.add_argument("--matmul-size", type=int, default=8192, help="side of the bf16 products timed for the card's rate")
    p.add_argument("--smoke", action="store_true", help="tiny model (2+2, d=64): the CPU rehearsal")
    p.add_argument("--cpu", action="store_true", help="train on the CPU (with --smoke), in float32")
    return p


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    runs = [r for r in a.runs.split(",") if r]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        p.error(f"--runs {','.join(bad)}: unknown; choose from {', '.join(RUNS)}")
    if REFERENCE not in runs:
        p.error(f"--runs {a.runs}: the ratios are to '{REFERENCE}', which must run")
    if not (Path(a.data) / "dict.en.txt").exists() and not list(Path(a.data).glob("dict.*.txt")):
        p.error(f"--data {a.data}: no fairseq dictionary there (a folder binarized by fairseq-preprocess)")
    if not a.cpu:
        import torch

        if not torch.cuda.is_available():
            p.error("no CUDA device here (torch.cuda.is_available() is False): run on a GPU, or --smoke --cpu")
    out = Path(a.out)
    deadline = time.monotonic() + a.deadline if a.deadline else float("inf")
    env = {"kind": "environment", "benchmark": BENCHMARK, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "host": platform.node(), "device": "cpu" if a.cpu else _device_name(), "argv": sys.argv[1:]}
    peak = peak_bf16_tflops(a)
    env["peak_bf16_tflops"] = peak
    append_jsonl(out, env)
    records = []
    with tempfile.TemporaryDirectory(prefix="fast_path_job-") as scratch:
        for rnd in range(1, a.rounds + 1):
            order = runs if rnd % 2 else runs[::-1]
            for name in order:
                if time.monotonic() > deadline:
                    print(f"[fast_path_job] deadline: round {rnd} run {name} not started", file=sys.stderr, flush=True)
                    break
                records.append(run_once(a, name, rnd, scratch, out, env))
            else:
                continue
            break
    done = [r for r in records if "error" not in r]
    summary = {"benchmark": BENCHMARK, "job": env["time"], "device": env["device"], "size": a.size,
               "tokens": a.tokens, **summarize(done, peak)} if any(r["run"] == REFERENCE for r in done) else None
    if summary:
        append_jsonl(out, summary)
        print(table(summary))
    errors = [r for r in records if "error" in r]
    if errors:
        print(f"[fast_path_job] {len(errors)} run(s) failed: " + ", ".join(f"{r['run']} round {r['round']}"
                                                                          for r in errors), file=sys.stderr)
        return 1
    return 0


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def run_once(a, name: str, rnd: int, scratch: str, out: Path, env: dict) -> dict:
    """One process of run ``name`` in round ``rnd``; its line appended to ``out``."""
    argv = run_argv(a, name, scratch)
    t0 = time.perf_counter()
    base = {"benchmark": BENCHMARK, "kind": "process", "job": env["time"], "device": env["device"], "run": name,
            "round": rnd, "size": a.size, "tokens": a.tokens, "precision": "fp32" if a.cpu else RUNS[name][3],
            "argv": argv}
    try:
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=str(REPO_ROOT),
                              timeout=a.timeout, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])))
    except subprocess.TimeoutExpired:
        rec = {**base, "error": f"timed out after {a.timeout} s"}
    else:
        text = proc.stdout + proc.stderr
        rec = {**base, "wall_s": time.perf_counter() - t0, **read_run(a, text)}
        if proc.returncode != 0 or not rec["intervals"]:
            rec = {**base, "error": text[-3000:], "returncode": proc.returncode}
    append_jsonl(out, rec)
    brief = {k: rec.get(k) for k in ("run", "round", "wall_s", "wps_first_epoch", "wps_later_epochs", "graphs",
                                     "capture_s", "last_update_with_a_new_graph", "padding_fraction", "steps")}
    print(json.dumps(brief if "error" not in rec else {**brief, "error": rec["error"][-500:]}), flush=True)
    return rec


if __name__ == "__main__":
    sys.exit(main())
