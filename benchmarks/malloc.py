#!/usr/bin/env python
"""CPU training with glibc's malloc as it comes, and told to keep freed memory.

glibc returns each freed buffer above its mmap threshold (which adapts up to 32 MiB) to
the kernel, and the next training step faults it back in page by page. resnmt's
pipeline (``resnmt.experiment.runtime.tool_env``: scripts/train.sh, the demo, quality.py, curves.py)
sets ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` for its subprocesses so
that freed memory stays in the process (``KEEP_FREED_MEMORY_ENV``). This measures what
that changes: the same ``fairseq-train`` run (fairseq's own ``transformer`` by default,
the CPU benchmarks' settings, no checkpoints, no validation) with and without the two
variables, alternating which goes first, ``--rounds`` times; per process wall time,
user and kernel CPU time, peak resident memory, training updates/s (fairseq's own
``done training in`` seconds, start-up excluded), and the final training loss, which must
be the same in both (the allocator does not change the arithmetic).

    python benchmarks/malloc.py                                  # 2+2 d=128, 100 updates, 3 rounds
    python benchmarks/malloc.py --arch transformer_sas_base --threads 2

One JSON line per round and condition is appended to ``--out``, and a Markdown table of
the medians is printed.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl
from resnmt.experiment.runtime import KEEP_FREED_MEMORY_ENV, tool_env
from resnmt.experiment.steps import FairseqLog
from resnmt.options import Option, add_to_command
from resnmt.study import flags, runs
from resnmt.study.records import cpu_description, run_id

from campaign import files
CONDITIONS = ("glibc default", "keep freed memory")


def environment(condition: str, threads: int) -> dict:
    env = tool_env(threads=threads, cpu_only=True)
    if condition == "glibc default":
        for name in KEEP_FREED_MEMORY_ENV:
            env.pop(name, None)
    else:
        env.update(KEEP_FREED_MEMORY_ENV)
    return env


def time_process(train_argv, updates: int, condition: str, threads: int) -> dict:
    """One fresh ``fairseq-train`` process; its times, memory, speed and final loss."""
    with tempfile.TemporaryDirectory(prefix="resnmt-malloc-") as tmp:
        log_path = Path(tmp) / "log.txt"
        cmd = [str(c) for c in [*train_argv, "--save-dir", tmp, "--max-update", updates, "--no-save"]]
        with open(log_path, "w", encoding="utf-8") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment(condition, threads))
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"fairseq-train failed ({condition}):\n{text[-3000:]}")
    fairseq_log = FairseqLog.parse(text)
    return {"condition": condition, "wall_seconds": round(wall, 2), "user_seconds": round(usage.ru_utime, 2),
            "kernel_seconds": round(usage.ru_stime, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "train_seconds": fairseq_log.train_seconds,
            "updates_per_s": round(updates / fairseq_log.train_seconds, 3) if fairseq_log.train_seconds else None,
            "final_train_loss": fairseq_log.epochs[-1][2] if fairseq_log.epochs else None}


def malloc_table(records) -> str:
    """Medians per condition, and the ratio of the second to the first."""
    columns = [("wall s", "wall_seconds"), ("user CPU s", "user_seconds"), ("kernel CPU s", "kernel_seconds"),
               ("training updates/s", "updates_per_s"), ("peak RSS MiB", "peak_rss_mib")]
    def median_of(c, key):  # None where no process measured it (fairseq logs its seconds to 0.1 s)
        values = [r[key] for r in records if r["condition"] == c and r[key] is not None]
        return statistics.median(values) if values else None

    median = {c: {key: median_of(c, key) for _, key in columns} for c in CONDITIONS}
    lines = ["| malloc | " + " | ".join(name for name, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for c in CONDITIONS:
        lines.append(f"| {c} | " + " | ".join("n/a" if median[c][key] is None else f"{median[c][key]:g}"
                                             for _, key in columns) + " |")
    ratio = [median[CONDITIONS[1]][key] / median[CONDITIONS[0]][key]
             if median[CONDITIONS[0]][key] and median[CONDITIONS[1]][key] is not None else float("nan")
             for _, key in columns]
    lines.append("| ratio | " + " | ".join(f"{x:.2f}" for x in ratio) + " |")
    return "\n".join(lines)


ARCH = Option("arch", "transformer", "the arch trained (default: fairseq's own transformer, at --size)")
RUNS = (
    Option("updates", 100, "updates per process (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("max_tokens", 4096, "default: %(default)s", kind="int", minimum=1, metavar="N"),
    Option("rounds", 3, "processes per condition (default: %(default)s)", kind="int", minimum=1, metavar="N"),
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    files.add_data(p, binarized=True)
    add_to_command(p, [ARCH])
    flags.add_size(p, "small", "small = 2+2 layers d=128 FFN 512 4 heads (default); tiny = tests")
    add_to_command(p, RUNS)
    flags.add_threads(p, per="process")
    files.add_out(p, "malloc.jsonl")
    a = p.parse_args(argv)
    data = flags.binarized_folder(p, a.data)
    if not shutil.which("fairseq-train", path=tool_env()["PATH"]):
        p.error("fairseq-train is not on PATH (make venv installs it)")

    train_argv = runs.benchmark_train_argv(data.resolve(), a.arch, [], SIZES[a.size], seed=1,
                                           max_tokens=a.max_tokens, lr=1e-3, warmup=300, dropout=0.3,
                                           save_every=10 ** 9, keep=1, validate=False)
    started = run_id()
    records = []
    for round_ in range(1, a.rounds + 1):
        order = CONDITIONS if round_ % 2 else CONDITIONS[::-1]
        for condition in order:
            print(f"[malloc] round {round_}/{a.rounds}: {condition} ...", file=sys.stderr, flush=True)
            result = time_process(train_argv, a.updates, condition, a.threads)
            record = {"benchmark": "malloc", "arch": a.arch, "size": {"name": a.size, **SIZES[a.size].as_dict()},
                      "updates": a.updates, "max_tokens": a.max_tokens, "threads": a.threads, "round": round_,
                      "run": started, **cpu_description(), "load_at_start": round(os.getloadavg()[0], 2),
                      **result}
            append_jsonl(Path(a.out), record)
            records.append(record)
            print(f"[malloc]   {result['wall_seconds']:.1f} s wall, {result['kernel_seconds']:.1f} s kernel, "
                  f"{result['updates_per_s']} updates/s, loss {result['final_train_loss']}", file=sys.stderr, flush=True)
    losses = {r["final_train_loss"] for r in records}
    print(malloc_table(records))
    print(f"\nfinal training loss: {'the same in every process' if len(losses) == 1 else 'DIFFERS'} "
          f"({', '.join(str(x) for x in sorted(losses, key=str))})")
    return 0 if len(losses) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
