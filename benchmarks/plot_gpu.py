#!/usr/bin/env python
"""Figures of benchmarks/results/gpu_train.jsonl: fairseq's own wps in each logged interval
of the newest whole fairseq-train processes on each GPU (where an update's time goes over
a run: the first epoch, where every batch shape is new, against the later ones).

    python benchmarks/plot_gpu.py            # docs/figures/gpu-whole-process-<device>.png
"""
import argparse
import re
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # resnmt, where it is not installed (the GPU machine)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resnmt.experiment.results import read_jsonl  # noqa: E402
from resnmt.options import Option, add_to_command  # noqa: E402
from campaign.files import REPO_ROOT, RESULTS  # noqa: E402


def newest_whole_processes(records):
    """{device: [run records of that device's newest job]} (runs without an error)."""
    runs = [r for r in records if r.get("benchmark") == "gpu_train" and r.get("kind") == "whole_process"
            and "error" not in r and r.get("intervals")]
    out = {}
    for device in sorted({r["device"] for r in runs}):
        mine = [r for r in runs if r["device"] == device]
        job = max(r["job"] for r in mine)
        out[device] = [r for r in mine if r["job"] == job]
    return out


def plot(device, runs, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in runs:
        xs = [i["num_updates"] for i in r["intervals"]]
        again = f", repeat {r['repeat']}" if r.get("repeat", 1) > 1 else ""
        ax.plot(xs, [i["wps"] / 1000 for i in r["intervals"]], marker="o", ms=3,
                label=f"{r['run']} ({r['precision']}{again})")
    ends = sorted({i["num_updates"] for r in runs for a, i in zip(r["intervals"], r["intervals"][1:])
                   if a.get("epoch") is not None and i.get("epoch", a["epoch"]) > a["epoch"]})
    for x in ends[:1]:
        ax.axvline(x, color="gray", ls="--", lw=1)
        ax.annotate("second epoch begins", (x, ax.get_ylim()[1] * 0.95), fontsize=8, ha="left")
    ax.set_xlabel(f"update ({runs[0]['argv'][runs[0]['argv'].index('--max-tokens') + 1]} tokens at most each)")
    ax.set_ylabel("fairseq's wps per logged interval (thousands)")
    ax.set_title(f"Whole fairseq-train runs, one {device}, base size", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


OPTIONS = (
    Option("results", str(RESULTS / "gpu_train.jsonl"), "gpu_train.py's JSON lines", metavar="JSONL"),
    Option("out_dir", str(REPO_ROOT / "docs" / "figures"), "where the figures go", metavar="DIR"),
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_to_command(p, OPTIONS)
    a = p.parse_args(argv)
    if not Path(a.results).exists():
        p.error(f"--results {a.results}: no such file (benchmarks/gpu_train.py writes it)")
    for device, runs in newest_whole_processes(read_jsonl(Path(a.results))).items():
        path = Path(a.out_dir) / f"gpu-whole-process-{re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-')}.png"
        plot(device, runs, path)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
