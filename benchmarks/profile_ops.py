#!/usr/bin/env python
"""Where a config's extra training time goes: torch.profiler op totals of a config and
of its reference, side by side (same batches, same size as speed.py; rows.py names both).

    python benchmarks/profile_ops.py --config rskip_ln2 --reference transformer
    python benchmarks/profile_ops.py --config nswish --reference swish --top 25

Prints, per op, the summed self CPU time (ms) over ``--updates`` training updates of
each model and the difference, largest differences first. Configs are speed.py's
(``rows.CONFIGS``). Op times under a profiler on a shared machine are noisy: read the
large differences, not the small ones.
"""
import argparse
import sys
from collections import defaultdict

from eager_training import Optimizer, train_step, training_batches
from rows import CONFIGS, fairseq_argv

from resnmt.experiment.presets import SIZES
from resnmt.options import Option, add_to_command
from resnmt.study import flags
from campaign import files


def profile(config, a):
    import torch
    from fairseq import options, tasks
    from torch.profiler import ProfilerActivity, profile as torch_profile

    size = SIZES[a.size]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=fairseq_argv(a.data, config, size, a.max_tokens))
    task = tasks.setup_task(args)
    task.load_dataset("train")
    batches = training_batches(task, a.max_tokens, 1 + a.updates)
    torch.manual_seed(1)
    model = task.build_model(args)
    opt = Optimizer(model, torch.float32)  # speed.py's: Adam (0.9, 0.98), float32

    def step(batch):
        train_step(model, opt, batch, task.target_dictionary.pad())

    step(batches[0])
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[1:]:
            step(b)
    totals = defaultdict(float)
    for ev in prof.key_averages():
        totals[ev.key] += ev.self_cpu_time_total / 1000.0
    return totals


CONFIG = (
    Option("config", kind="choice", choices=tuple(sorted(CONFIGS)), required=True, help="the config profiled"),
    Option("reference", "transformer", "the config it is compared with (default: %(default)s)", kind="choice",
           choices=tuple(sorted(CONFIGS))),
)
PROFILE = (
    Option("max_tokens", 1024, "tokens per training batch (default: %(default)s)", kind="int", minimum=1,
           metavar="N"),
    Option("updates", 3, "profiled training updates (default: %(default)s)", kind="int", minimum=1, metavar="N"),
)
TOP = Option("top", 20, "ops listed, largest differences first (default: %(default)s)", kind="int", minimum=1,
             metavar="N")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(p, CONFIG)
    files.add_data(p, binarized=True)
    flags.add_size(p, "cpu", "speed.py's on the CPU (default: cpu = 6+6 layers d=256 FFN 1024 4 heads)")
    add_to_command(p, PROFILE)
    flags.add_threads(p, per="process")
    add_to_command(p, [TOP])
    a = p.parse_args(argv)
    a.data = flags.binarized_folder(p, a.data)
    import torch

    torch.set_num_threads(a.threads)
    ref = profile(a.reference, a)
    cfg = profile(a.config, a)
    keys = sorted(set(ref) | set(cfg), key=lambda k: -abs(cfg.get(k, 0) - ref.get(k, 0)))
    print(f"{'op':<45} {a.reference:>14} {a.config:>14} {'diff ms':>10}")
    for k in keys[: a.top]:
        print(f"{k[:45]:<45} {ref.get(k, 0):14.1f} {cfg.get(k, 0):14.1f} {cfg.get(k, 0) - ref.get(k, 0):10.1f}")
    print(f"{'TOTAL':<45} {sum(ref.values()):14.1f} {sum(cfg.values()):14.1f} {sum(cfg.values()) - sum(ref.values()):10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
