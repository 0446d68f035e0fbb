"""Your connection kind under the study's protocol, beside the shipped rows: one command.

    resnmt-study verdict layerscale                 # the study's CPU protocol, seed 1
    resnmt-study verdict layerscale --quick         # a first look: 2+2 to 600 updates
    resnmt-study verdict my_kind --connections my_kind.py --flags "--my-flag 2" --seeds 1,2
    resnmt-study verdict layerscale --report        # the comparison from what is recorded
    resnmt-study verdict layerscale --device cuda   # the GPU study's base size (6+6, d=512)
    resnmt-study verdict layerscale --seeds 1,2,3 --executor slurm --partition main --time 240 \
        --workdir /shared/verdict                   # each (size, seed) run a SLURM job (submitit)

First the kind is checked: imported, built once at a tiny size, one forward and one
incremental decoding step (resnmt.testing.preflight); what is wrong is one line, and
nothing is made. Then one line says what the protocol costs here: the runs, the updates
still to train and the time they take at a rate measured on this machine over a few
updates of the kind's own model (--quick and --tiny say what they leave out).

It trains the kind (installed, or named with --connections) as the study trains every
row (Multi30k EN-DE, 2+2 layers to 2,400 updates and 6+6 to 1,200 at d=128, the study's
schedule, checkpoints averaged, test2016 decoded with beam 4, sacreBLEU), one run per size
and seed, each milestone appended to --out with a progress line, so that a killed or
repeated command resumes where it stopped; with --executor each run is a job of submitit
(local: processes side by side on this machine; slurm: a cluster's jobs), a job that dies
submitted again to resume from its last checkpoint. It then prints the kind's sacreBLEU
beside the shipped rows' (the study's lines, installed with resnmt, --reference; not
retrained): post-LN, pre-LN and the best shipped row at each size's budget, and the
study's questions: above post-LN at 2+2? above pre-LN at 6+6? level with the best (within
0.5 BLEU on both sides, else above or below)? Each answer shows the differences the rule
reads, paired by seed with the seeds named (mean against mean, said so, where no seed is
shared), how many seeds stand behind it and whether that is a verdict (the protocol's
budget, 2 seeds or more) or a first look. --quick trains 2+2 to 600 updates only and says
on every line that it is a first look, not the protocol.

--device cuda trains the GPU study's base size (6+6, d=512, to 4,000 updates, a checkpoint
every 100, under its schedule) and compares it with the study's base-size rows; where the
study has none yet, it says so in one line. --tiny is a smoke test: the tiny model to 2
updates on any prepared corpus, set beside the shipped rows.
"""
import argparse
import copy
import os
from pathlib import Path

from resnmt.cli.common import OneLineErrorParser
from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import read_jsonl
from resnmt.experiment.runtime import tool_env
from resnmt.options import Option, add_to_command
from resnmt.study import flags
from resnmt.study.cost import cost_line, left_out, measured_rate
from resnmt.study.jobs import add_executor_options, executor, run_jobs, with_absolute_paths
from resnmt.study.milestones import (done_milestones, progress, resume_point, run_dir_of, run_parser, study_settings,
                                     train_and_score)
from resnmt.study.records import cpu_description, cuda_description, settings_key
from resnmt.study.rows import Row, slug
from resnmt.study.verdict import PROTOCOLS, REFERENCE, TINY_FLAGS, TINY_MILESTONES, report
from resnmt.testing.preflight import problem


KIND = (
    Option("kind", positional=True, help="the --residual name of your kind"),
    Option("flags", "", "more fairseq-train flags of the kind, in one string", metavar="FLAGS"),
    Option("connections", metavar="MODULE", help=(
        "your kind's module or .py file, when it is not installed (passed to every tool as RESNMT_CONNECTIONS)")),
    Option("seeds", [1], "comma-separated seeds (default: 1; the study's rows have 1-3)", kind="int", listed=True,
           minimum=1, metavar="N,N,..."),
    Option("quick", False, "a first look, not the protocol: 2+2 to 600 updates (--device cuda: base to 1000)",
           kind="switch"),
    Option("device", "cpu", "cpu: the study's CPU protocol (default); cuda: the GPU study's base size",
           kind="choice", choices=tuple(sorted(PROTOCOLS))),
    Option("data", "data/multi30k", "Multi30k EN-DE prepared by resnmt-prepare multi30k (default: %(default)s)",
           metavar="DIR"),
)
FILES = (
    Option("workdir", help="checkpoints and logs (default: runs/verdict, runs/verdict-cuda on a GPU)", metavar="DIR"),
    Option("out", help="your runs' lines, appended per milestone (default: WORKDIR/curves.jsonl)", metavar="JSONL"),
    Option("reference", str(REFERENCE), metavar="JSONL", help=(
        "the study's lines the kind is compared with (default: the shipped rows, installed with resnmt)")),
)
MODES = (
    Option("report", False, "print the comparison from --out only, training nothing", kind="switch"),
    Option("tiny", False, kind="switch", help=(
        "a smoke test: the tiny model to 2 updates, set beside the shipped rows at the quick look's budget (every "
        "verdict line says so)")),
)


def parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="resnmt-study verdict", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(command="verdict")
    add_to_command(p, KIND)
    flags.add_reference(p)
    add_to_command(p, FILES)
    flags.add_threads(p, 2)
    add_to_command(p, MODES)
    add_executor_options(p)
    return p


def study_args(a, protocol, tiny: bool = False):
    """The run options of this protocol (their defaults: the study's settings), its schedule,
    this command's data, work directory and output; ``tiny``: the smoke test's."""
    schedule = ["--lr", f"{protocol.schedule[0]:g}", "--warmup", str(protocol.schedule[1])] if protocol.schedule else []
    argv = ["--data", a.data, "--workdir", a.workdir, "--out", a.out, "--threads", str(a.threads),
            "--remove-bpe", a.remove_bpe, *(["--ref", a.ref] if a.ref else []), *protocol.run_flags, *schedule,
            *(TINY_FLAGS if tiny else ())]
    args = run_parser().parse_args(argv)
    args.command, args.workdir, args.out = "verdict", Path(args.workdir), Path(args.out)
    return args


def train(p, a, args, row: str, seeds: list, milestones: dict) -> int:
    """Each (size, seed) run of ``row`` to its milestones, resuming what is done: its cost
    said first, then in this process one after another, or as jobs (--executor). The exit
    status: 1 where a job failed for good."""
    args.milestones = {s: list(m) for s, m in milestones.items()}
    args.bin_dir, args.ref = flags.scored_corpus(p, args.data, args.ref)
    here = a.device == "cpu" or __import__("torch").cuda.is_available()  # a SLURM job's GPU is on its node
    if not here and a.executor != "slurm":
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    settings = study_settings(args)
    key = settings_key(settings)
    env = tool_env(threads=args.threads, cpu_only=a.device == "cpu")
    if a.connections:
        env["RESNMT_CONNECTIONS"] = a.connections
    runs = [(size, row, seed) for size in milestones for seed in seeds]
    say_cost(a, args, key, runs, measure=here)
    if a.executor:
        job_args = with_absolute_paths(copy.copy(args))
        failures = run_jobs(executor(a, f"verdict-{slug(row)}"), runs, lambda run: (job_args, settings, key, run, env),
                            a.retries, lambda text: progress(args, text))
        for line in failures:
            progress(args, f"error: {line}")
        return 1 if failures else 0
    device = cpu_description() if a.device == "cpu" else cuda_description()
    for run in runs:
        done = done_milestones([args.out], key, a.device).get(run, set())
        if not train_and_score(args, settings, key, run, done, env, device):
            progress(args, f"{' '.join(map(str, run))}: another copy trains it")
    return 0


def say_cost(a, args, key, runs, measure: bool = True) -> None:
    """The cost line (runs, updates, the time at a rate measured here; ``measure`` False: no
    device here to measure on), and what a quick look or a smoke test leaves out."""
    protocol = PROTOCOLS[a.device]
    if a.tiny or a.quick:
        what = "--tiny (the tiny model, a smoke test)" if a.tiny else "--quick"
        progress(args, left_out(protocol.milestones, args.milestones, what))
    done = done_milestones([args.out], key, a.device)
    todo = {(size, seed): 0 if set(args.milestones[size]) <= done.get((size, row, seed), set())
            else args.milestones[size][-1] - resume_point(run_dir_of(args, key, size, row, seed) / "checkpoints")
            for size, row, seed in runs}
    sizes = sorted({size for (size, _), left in todo.items() if left > 0}, key=list(args.milestones).index)
    rates = {size: measured_rate(args.bin_dir, args.rows[runs[0][1]].arch, args.rows[runs[0][1]].flags,
                                 SIZES["tiny" if args.tiny else size], max_tokens=args.max_tokens, lr=args.lr,
                                 threads=args.threads, device=a.device) for size in sizes} if measure else None
    progress(args, cost_line(todo, rates, args.milestones))


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    seeds = sorted(a.seeds)
    protocol = PROTOCOLS[a.device]
    a.workdir = a.workdir or ("runs/verdict" if a.device == "cpu" else f"runs/verdict-{a.device}")
    a.out = a.out or str(Path(a.workdir) / "curves.jsonl")
    if a.connections and Path(a.connections).suffix == ".py":
        a.connections = os.path.abspath(a.connections)  # the tools run elsewhere
    row = " ".join([a.kind, *a.flags.split()])
    if not Path(a.reference).is_file():
        p.error(f"--reference {a.reference}: no such file; the shipped rows are {REFERENCE}")
    reference = read_jsonl(a.reference)
    if row in {r.get("row") for r in reference}:
        p.error(f"{a.kind}: a shipped row of the study has this name; its numbers are in {a.reference}")
    milestones = TINY_MILESTONES if a.tiny else protocol.quick if a.quick else protocol.milestones
    ours, theirs = study_args(a, protocol, tiny=a.tiny), study_args(a, protocol)
    ours.rows = {row: Row("resnmt_transformer", ("--residual", a.kind, *a.flags.split()), seeds=len(seeds))}
    status = 0
    if not a.report:
        found = problem(["--residual", a.kind, *a.flags.split(), *(["--connections", a.connections] if a.connections
                                                                   else [])], always=True)
        if found:
            p.error(found)
        status = train(p, a, ours, row, seeds, milestones)
    keys = (settings_key(study_settings(ours)), settings_key(study_settings(theirs)))
    print("\n".join(report(read_jsonl(a.out), reference, row, protocol, milestones, keys, tiny=a.tiny)))
    return status
