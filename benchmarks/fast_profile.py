#!/usr/bin/env python
"""The fast path's own profile: where an update's time goes once every batch shape and the
update are recorded (resnmt/training/fast/).

    python benchmarks/fast_profile.py --data .gpu/multi30k/bin --out $OUT/fast_path_profile.json
    python benchmarks/fast_profile.py --smoke --cpu --data DIR --out /tmp/p.json   # the CPU rehearsal

Builds the fast path's trainer from the same command line as the GPU job's whole process
(``--run``, rows.WHOLE_PROCESSES; base size, ``--tokens`` per batch), trains ``--warmup``
updates (the first records every bucket's step and the update as CUDA graphs), then runs
``--updates`` updates under torch.profiler and writes, per update:

* ``wall_ms``: from the first update's call to the device's end of the last, divided;
* ``host_ms``: the host's time inside ``train_step`` (median): what the host spends to queue
  an update (graph replays, copies of the batch into the graphs' buffers, fairseq's meters);
* ``kernel_ms``: the device time of the kernels (the captured graphs' included), summed:
  kernels only, no ``record_function`` range (a range reports the whole interval it spans
  on the device, idle gaps and the kernels inside it included: summed with the kernels it
  would count them twice); the ranges' spans are in ``ranges_ms``, apart;
* ``device_busy``: ``kernel_ms / wall_ms`` (below 1: the device waits for the host or for
  a synchronisation);
* ``kernel_launches`` (launched one by one by the host) and ``graph_launches``
  (``cudaGraphLaunch``: a replayed graph's kernels are launched by one call), host
  synchronisations, and the top kernels and host operations;
* the graphs recorded, their seconds, the shapes that run eagerly, the Adam kernel and the
  loss's (``triton``: the fused cross-entropy; ``fairseq``: the criterion's own).

On the CPU (``--cpu``) the steps run eagerly and there is no device time: the rehearsal
checks the code path and the file, not the numbers.
"""
import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # resnmt, where it is not installed (the GPU machine)
    sys.path.insert(0, str(REPO_ROOT))

from resnmt.options import Option, add_to_command  # noqa: E402
from resnmt.study import flags  # noqa: E402
from campaign import files  # noqa: E402
from fairseq_trainer import device_time, fairseq_training, kernels_and_ranges, synchronize  # noqa: E402
from eager_training import training_batches  # noqa: E402
from whole_processes import whole_argv  # noqa: E402

FAST_RUNS = ("resnmt_train_fast_bf16", "resnmt_train_fast_big_bf16")
STEP_RANGE = "fast_path.train_step"


def build(a):
    """``(trainer, batches)``: the fast path's trainer from run ``--run``'s command line and
    the epoch's first batches (the shape buckets' own)."""
    from resnmt.training.fast.step import FastPathTrainer

    scratch = tempfile.mkdtemp(prefix="fast_profile_")
    run = SimpleNamespace(data=a.data, whole_tokens=a.tokens, whole_updates=a.warmup + a.updates, whole_interval=1,
                          smoke=a.smoke, cpu=a.cpu, compile_backend="inductor")
    argv = whole_argv(run, a.run, scratch)[3:]  # without the interpreter and its module
    cfg, task, model, criterion = fairseq_training(argv)
    trainer = FastPathTrainer(cfg, task, model, criterion)
    task.load_dataset("train", combine=False, epoch=1)
    batches = training_batches(task, cfg.dataset.max_tokens, a.warmup + a.updates, at_most=True)  # cycled
    return trainer, batches


def timed_updates(trainer, batches, start: int, n: int) -> list:
    """``n`` updates, each in one ``record_function`` range; the host's seconds in each."""
    from torch.profiler import record_function

    host = []
    for i in range(start, start + n):
        with record_function(STEP_RANGE):
            t0 = time.perf_counter()
            trainer.train_step([batches[i % len(batches)]])
            host.append(time.perf_counter() - t0)
    return host


def profile_fast_path(trainer, batches, warmup: int, updates: int, cpu: bool) -> dict:
    """The profile of ``updates`` updates after ``warmup`` (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    for i in range(warmup):
        trainer.train_step([batches[i % len(batches)]])
    synchronize(cpu)
    warmup_s = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([] if cpu else [ProfilerActivity.CUDA])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        host = timed_updates(trainer, batches, warmup, updates)
        synchronize(cpu)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    kernels, ranges = kernels_and_ranges(events)

    def per_update(pattern):
        return sum(e.count for e in events if re.search(pattern, e.key)) / updates

    wall_ms = 1e3 * wall / updates
    kernel_ms = sum(device_time(e) for e in kernels) / 1e3 / updates
    update = trainer.device_update()
    graphs = trainer._graphs
    return {
        "updates": updates, "warmup_updates": warmup, "warmup_s": warmup_s,
        "wall_ms": wall_ms, "host_ms": 1e3 * statistics.median(host), "host_ms_max": 1e3 * max(host),
        "kernel_ms": kernel_ms, "device_busy": kernel_ms / wall_ms if not cpu else None,
        "ranges_ms": {e.key[:80]: device_time(e) / 1e3 / updates for e in ranges},
        "kernel_launches": per_update(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC|cuLaunchKernelEx)$"),
        "graph_launches": per_update(r"^(cudaGraphLaunch|cuGraphLaunch)$"),
        "host_syncs": {k: per_update(rf"^{k}$") for k in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                           "cudaEventSynchronize")},
        "adam_kernel": update.adam_kernel,
        "loss_kernel": trainer.loss_kernel,
        "graphs": graphs.summary() if graphs is not None else None,
        "eager_shapes": {" ".join(map(str, k[1:])): why for k, why in graphs.failures.items()} if graphs else {},
        "top_kernels": [{"name": e.key[:160], "count": e.count / updates, "device_ms": device_time(e) / 1e3 / updates}
                        for e in kernels[:15]],
        "top_host_ops": [{"name": e.key[:160], "count": e.count / updates,
                          "self_cpu_ms": e.self_cpu_time_total / 1e3 / updates}
                         for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]],
    }


OPTIONS = (
    Option("out", required=True, help="the profile, a JSON file", metavar="JSON"),
    Option("run", FAST_RUNS[0], "whose command line (default: %(default)s)", kind="choice", choices=FAST_RUNS),
    Option("tokens", 4096, "--max-tokens per batch (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("warmup", 10, "updates before the profile (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("updates", 10, "profiled updates (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("smoke", False, "tiny model (2+2, d=64) for a quick check", kind="switch"),
    Option("cpu", False, "run on the CPU (the rehearsal: float32, no graphs)", kind="switch"),
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    files.add_data(p, binarized=True, required=True)
    add_to_command(p, OPTIONS)
    a = p.parse_args(argv)
    flags.binarized_folder(p, a.data)
    import torch

    if not a.cpu and not torch.cuda.is_available():
        p.error("no CUDA device here (torch.cuda.is_available() is False): run on a GPU, or --smoke --cpu")
    trainer, batches = build(a)
    result = {"run": a.run, "tokens": a.tokens, "device": "cpu" if a.cpu else torch.cuda.get_device_name(0),
              **profile_fast_path(trainer, batches, a.warmup, a.updates, a.cpu)}
    out = Path(a.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)
    keys = ("wall_ms", "host_ms", "kernel_ms", "device_busy", "kernel_launches", "graph_launches", "adam_kernel",
            "loss_kernel")
    print(json.dumps({k: result[k] for k in keys}), flush=True)


if __name__ == "__main__":
    main()
