#!/usr/bin/env python
"""CPU time of beam-4 decoding: resnmt's fast beam search against fairseq's SequenceGenerator,
on the same model and sentences, measured in one process, interleaved (A B, B A, ...), the
minimum over rounds; and how many hypotheses differ.

The model: ``resnmt_transformer`` of the small preset's size (2+2 layers, d=128, FFN 512, 4
heads; ``--size``), random weights (seed 1), each ``--kinds``; the sentences: ``--sentences``
of the binarized test split of ``--data`` (a fairseq-preprocess'd or resnmt-prepare'd bin/) in
batches of ``--batch-size``; the search: beam 4, GNMT length penalty 0.6, max length
``src + --max-len-b`` (random weights rarely end early, so a hypothesis is about as long as
its source: translation-like lengths). Run it with one thread:

    OMP_NUM_THREADS=1 python benchmarks/fast_beam_speed.py --data data/multi30k/bin --kinds post_ln dlcl
"""
import argparse
import time

import torch

from resnmt.decoding.fast_beam import FastSequenceGenerator
from resnmt.decoding.sequence_generator import with_gnmt_penalty
from resnmt.experiment.presets import SIZES
from resnmt.options import Option, add_to_command

OPTIONS = [
    Option("data", None, "binarized data (its dict.*.txt and test split)", metavar="DIR", required=True),
    Option("kinds", ["post_ln", "dlcl"], "the connection kinds (default: post_ln dlcl)", metavar="KIND", nargs="+"),
    Option("size", "small", "model size (default: %(default)s)", kind="choice", choices=tuple(SIZES)),
    Option("sentences", 1000, "test sentences decoded (default: %(default)s)", kind="int", minimum=1),
    Option("batch_size", 32, "sentences per batch (default: %(default)s)", kind="int", minimum=1),
    Option("rounds", 3, "interleaved rounds (default: %(default)s)", kind="int", minimum=1),
    Option("max_len_b", 0, "max length = source length + N (default: %(default)s)", kind="int", minimum=0),
    Option("profile", False, "also print where the fast search's time goes (torch.profiler, one round)",
           kind="switch"),
]


def build(data: str, kind: str, size: str):
    from fairseq import options, tasks

    import resnmt  # noqa: F401

    argv = [data, "--arch", "resnmt_transformer", *SIZES[size].fairseq_flags(), "--residual", kind,
            "--task", "resnmt_translation", "--lenpen-form", "gnmt"]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    task = tasks.setup_task(args)
    torch.manual_seed(1)
    model = task.build_model(args).eval()
    return model, task


def batches(task, sentences: int, batch_size: int):
    task.load_dataset("test")
    ds = task.dataset("test")
    n = min(sentences, len(ds))
    order = sorted(range(n), key=lambda i: (ds.src_sizes[i], i))  # by length, as fairseq-generate batches
    return [ds.collater([ds[i] for i in order[s:s + batch_size]]) for s in range(0, n, batch_size)]


def decode(generator, model, samples):
    start = time.process_time()
    out = []
    with torch.no_grad():
        for sample in samples:
            out += [[h["tokens"].tolist() for h in hyps] for hyps in generator.generate([model], sample)]
    return time.process_time() - start, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(parser, OPTIONS)
    a = parser.parse_args(argv)
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    print(f"torch threads: {torch.get_num_threads()}; {a.sentences} sentences, batch {a.batch_size}, beam 4, "
          f"GNMT 0.6, max length src + {a.max_len_b}")
    print("| kind | fairseq (CPU s) | fast (CPU s) | speed-up | hypotheses differing | tokens per hypothesis |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in a.kinds:
        model, task = build(a.data, kind, a.size)
        tgt = task.target_dictionary
        samples = batches(task, a.sentences, a.batch_size)
        kwargs = dict(beam_size=4, len_penalty=0.6, max_len_a=1, max_len_b=a.max_len_b)
        gens = {name: with_gnmt_penalty(cls)([model], tgt, search_strategy=search.BeamSearch(tgt), **kwargs)
                for name, cls in (("fairseq", SequenceGenerator), ("fast", FastSequenceGenerator))}
        times = {"fairseq": [], "fast": []}
        outputs = {}
        for r in range(a.rounds):
            for name in (("fairseq", "fast") if r % 2 == 0 else ("fast", "fairseq")):
                seconds, outputs[name] = decode(gens[name], model, samples)
                times[name].append(seconds)
        differing = sum(x != y for x, y in zip(outputs["fairseq"], outputs["fast"]))
        length = sum(len(h[0]) for h in outputs["fast"]) / len(outputs["fast"])
        slow, fast = min(times["fairseq"]), min(times["fast"])
        print(f"| {kind} | {slow:.2f} | {fast:.2f} | {slow / fast:.2f}x | {differing} of {len(outputs['fast'])} "
              f"| {length:.1f} |", flush=True)
        if a.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                decode(gens["fast"], model, samples)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
