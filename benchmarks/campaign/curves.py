"""BLEU against the training budget: one run per (depth, row, seed), scored at several budgets.

Each run trains with ``fairseq-train`` (the rows of ``campaign.rows``, on Multi30k
EN-DE, or EN-FR with ``--pair en-fr``) and stops at every milestone (``--milestones``, in updates): the newest
``--average`` update checkpoints are averaged, test2016 is decoded with beam 4 and the
GNMT length penalty 0.6 (maximum length source + 50, tensor2tensor's), scored with
``resnmt-evaluate``, the milestone's checkpoint is run through ``resnmt-analyze`` on the
validation set, and one JSON line is appended to ``--out`` holding the BLEU, the
validation losses so far and the analysis. Training then resumes to the next milestone
(stopping and resuming fairseq is exact, see tests/test_resume.py).

Runs are taken in the study's priority order. Several copies of this command can run at
once (``--workers`` starts them): each run directory is locked by the copy working on it.
A killed run resumes from its last checkpoint; milestones already in ``--out`` are not
scored again, so the study can be continued over several sessions.

Checkpoints live in the (ignored) ``--workdir``, so a run continues across sessions only on
a machine that keeps it (``--list`` names the update each unfinished run's checkpoints
reach); on a fresh checkout a run restarts at update 0 and skips the milestones already
recorded. On a 2-core CPU a 2+2 run to its final 14400 updates takes 2.7-5.4 h, more than a
3-hour working session leaves for training, and two 6+6 runs side by side reach 2400
updates in about 2.5 h (the measured rates are in docs/study.md). The thread count is how a
run was executed, not what it computes: it is recorded per line (``torch_threads``) and
left out of the settings key.

    python benchmarks/curves.py                        # the whole study, one run at a time
    python benchmarks/curves.py --list                 # what is done, what is missing, what can resume
    python benchmarks/curves.py --only small:post_ln:1 # one run
    python benchmarks/curves.py --workers 2 --threads 1 --only deep:pre_ln:1,deep:sas:1   # a pair side by side
    python benchmarks/curves.py --device cuda --workers 8 --threads 1   # on a GPU: the study, plus the base size
    python benchmarks/curves.py --device cuda --sizes base,base12 --lr 7e-4 --warmup 2000 --save-every 100 --bf16 \
        --sdpa-backends flash,efficient,math --workers 4 --pin-cores --threads 1  # the papers' sizes (gpu_job.sh part 7)
    python benchmarks/curves.py --device cuda --bf16 --pin-cores --threads 1 --concurrency-sweep 1,4,8,12 \
        --sweep-lines sweep.jsonl        # how many runs share the GPU best (gpu_job.sh part 11)
    python benchmarks/curves.py --executor slurm --partition gpu --time 240 --device cuda --sizes base \
        --workdir /shared/runs --out /shared/curves.jsonl   # each run a SLURM job (submitit)

With ``--device cuda`` every run trains and decodes on the (first) GPU, several at once
with ``--workers`` (these models are far too small to fill one), and the study adds the
papers' sizes (base: 6+6 layers, d=512; base12: 12+12), which a CPU cannot train in a
session. GPU lines record their device, are kept apart from the CPU lines (a GPU run never
skips a milestone because the CPU run has it) and are plotted in panels of their own; fp32
on both unless ``--bf16`` (resnmt-train's bf16, which the papers' sizes train in: another
settings key). Every line records its schedule; another schedule (the papers' sizes are trained
under one of their own, chosen by ``--choose-schedule`` from a sweep of post-LN:
benchmarks/gpu_job.sh part 6) gives another settings key, so its runs and their lines are
others, tabulated and drawn apart. ``--concurrency-sweep`` measures how many runs side by side
give the GPU's highest total updates per second (campaign.concurrency).
"""
import argparse
import copy
import sys
from pathlib import Path

from resnmt.cli.common import OneLineErrorParser
from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl, read_jsonl
from resnmt.experiment.runtime import tool_env
from resnmt.options import Option, add_to_command
from resnmt.study import flags, runs
from resnmt.study.jobs import add_executor_options, executor, run_jobs, with_absolute_paths
from resnmt.study.milestones import (PAIRS, add_run_options, done_milestones, execution_flags, progress, resume_point,
                                     run_dir_of, run_plan, schedule_of, study_settings, trainer)
from resnmt.study.records import cpu_description, cuda_description, run_id, settings_key
from resnmt.study.rows import slug

from campaign import concurrency, files
from campaign.cores import start_side_by_side
from campaign.plan import (GPU_ONLY_SIZES, PLANS, plan_order, planned, sweep_choice, updates_per_second, workers_for,
                           workers_from_sweep)
from campaign.rows import CURVES_ROWS, DEFAULT_MILESTONES


MILESTONES = Option("milestones", kind="int", listed=True, minimum=1, metavar="N,N,...", help=(
    "comma-separated budgets in updates at which each run of every size is scored; the last is the run's length "
    "(default, per pair and size: " + "; ".join(f"{pair} {size} {','.join(map(str, ms))}"
                                                for pair, plan in PLANS.items() for size, ms in plan.milestones.items())
    + ")"))
ONLY = Option("only", metavar="SIZE:ROW:SEED,...",
              help="comma-separated runs SIZE:ROW:SEED (e.g. small:post_ln:1,deep:sas:1)")
DEVICE = Option("device", "cpu", "where every run trains and decodes (default: %(default)s); cuda adds the base size "
                "(6+6, d=512)", kind="choice", choices=("cpu", "cuda"))
EXECUTION = (
    Option("workers", 1, "runs at a time (copies of this command; default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("workdir", help="checkpoints and logs (default: runs/curves, runs/curves-cuda with --device cuda)",
           metavar="DIR"),
)
PLANNING = (
    Option("sizes", metavar="SIZE,...", help=(
        "comma-separated sizes to plan, of " + ", ".join(DEFAULT_MILESTONES) + " (default: every size the device "
        "trains; the GPU study of benchmarks/gpu_job.sh plans base,base12)")),
    Option("pin_cores", False, kind="switch", help=(
        "with --workers N (and --concurrency-sweep): each copy on its own share of this process's CPU cores "
        "(os.sched_setaffinity), so runs side by side do not take turns on a core")),
)
SWEEP = (
    Option("concurrency_sweep", kind="int", listed=True, minimum=1, metavar="N,N,...", help=(
        "measure instead of training: for each N, N post-LN runs (base size; --tiny: tiny) side by side for "
        "--sweep-seconds, each one's updates per second from fairseq's log; one line per N appended to the first "
        "--sweep-lines, a readable line per N printed, the last line the runs to train side by side "
        "(campaign.plan.workers_from_sweep); then exit")),
    Option("sweep_seconds", 60.0, "each step's window of --concurrency-sweep, start-up included (default: "
           "%(default)g)", kind="number", above=0, metavar="S"),
    Option("sweep_lines", [], repeat=True, metavar="JSONL", help=(
        "the concurrency sweep's lines: the first is written by --concurrency-sweep; every one that exists is read "
        "by --throughput, whose worker count then comes from the sweep (repeatable)")),
    Option("done_from", [], repeat=True, metavar="JSONL", help=(
        "more curves lines counted as done (read only; e.g. the committed results while --out is a fresh folder's), "
        "repeatable")),
)
ACTIONS = (
    Option("choose_schedule", False, kind="switch", help=(
        "print the GPU study's schedule as 'LR WARMUP', chosen by campaign.plan.choose_schedule from the post-LN "
        "base runs (seed 1) of the schedule sweep (campaign.plan.SWEEP_SCHEDULES) in --out and --done-from, the "
        "other settings as given; then exit")),
    Option("throughput", False, kind="switch", help=(
        "print each run's updates per second in --workdir (fairseq's, its newest 10 intervals), their sum and the "
        "runs that can train side by side, each reaching the last --milestones within the plan's time limit per run "
        "(campaign.plan.workers_for; the last line is that number); then exit")),
    Option("list", False, kind="switch", help=(
        "print the planned runs, the milestones each has recorded and, for an unfinished run, the update its "
        "checkpoints in --workdir reach; then exit")),
)


def parser() -> argparse.ArgumentParser:
    """``python benchmarks/curves.py``' command line; its defaults are the study's settings."""
    p = OneLineErrorParser(prog="benchmarks/curves.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(command="curves", rows=CURVES_ROWS)  # what a progress line is named, the rows it trains
    files.add_data(p, binarized=False, default=None)
    add_run_options(p, DEVICE)
    add_to_command(p, [MILESTONES, ONLY])
    add_to_command(p, EXECUTION)
    files.add_out(p, "curves.jsonl")
    add_to_command(p, (*PLANNING, *SWEEP, *ACTIONS))
    add_executor_options(p)
    return p


def main(argv) -> int:
    """``python benchmarks/curves.py ARGV``: check the arguments, then list, choose, measure or train."""
    p = parser()
    a = p.parse_args(argv)
    check_sizes_and_milestones(p, a)
    check_only(p, a)
    check_sweep(p, a)
    a.workdir = Path(a.workdir or ("runs/curves" if a.device == "cpu" else f"runs/curves-{a.device}"))
    a.out = Path(a.out)
    settings = study_settings(a)
    key = settings_key(settings)
    lines = [a.out, *map(Path, a.done_from)]
    plan = planned(a, lines)

    if a.choose_schedule:
        (lr, warmup), why = sweep_choice(settings, lines, a.device)
        print(why, file=sys.stderr)
        print(f"{lr:g} {warmup}")
        return 0
    if a.throughput:
        print_throughput(a)
        return 0
    if a.list:
        print_plan(a, plan, lines, key)
        return 0
    a.bin_dir, a.ref = flags.scored_corpus(p, a.data, a.ref, PAIRS[a.pair])
    if a.device == "cuda" and a.executor != "slurm":  # a SLURM job's GPU is on its node
        check_cuda(p)
    env = tool_env(threads=a.threads, cpu_only=a.device == "cpu")
    if a.executor and not a.concurrency_sweep:
        return run_as_jobs(a, settings, key, plan, lines, env)
    if a.workers > 1:
        return run_copies(argv, a.workers, a.pin_cores)
    device = cpu_description() if a.device == "cpu" else cuda_description()
    if a.concurrency_sweep:
        return run_sweep(a, settings, key, env, device)
    return run_plan(a, settings, key, plan, lines, env, device)


def run_as_jobs(a, settings, key, plan, lines, env) -> int:
    """--executor: each planned run not done a submitit job (resnmt.study.jobs), every job
    appending to --out; 1 where a job failed for good (one line each)."""
    done = done_milestones(lines, key, a.device)
    todo = [r for r in plan if not set(a.milestones[r[0]]) <= done.get(r, set())]
    job_args = with_absolute_paths(copy.copy(a))
    failures = run_jobs(executor(a, "curves"), todo, lambda run: (job_args, settings, key, run, env), a.retries,
                        lambda text: progress(a, text))
    for line in failures:
        progress(a, f"error: {line}")
    return 1 if failures else 0


def check_cuda(p) -> None:
    """--device cuda on a machine where torch sees no CUDA device: one error line."""
    import torch

    if not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")


def run_copies(argv, workers: int, pin: bool = False) -> int:
    """``workers`` copies of this command (without --workers), side by side (``pin``: each
    on its own CPU cores, which its trainings inherit): they share the plan through the run
    directories' locks. The highest exit status of them."""
    argv = [c for i, c in enumerate(argv) if not (c == "--workers" or (i and argv[i - 1] == "--workers")
                                                  or c.startswith("--workers="))]
    child = [sys.executable, str(Path(__file__).resolve().parents[1] / "curves.py"), *argv]
    procs = start_side_by_side([child] * workers, pin)
    return max(proc.wait() for proc in procs)


def run_sweep(a, settings, key, env, device) -> int:
    """--concurrency-sweep: each step's line appended to the first --sweep-lines and printed
    readably; the last line printed is the runs to train side by side."""
    size = "tiny" if a.tiny else "base"
    row = CURVES_ROWS["post_ln"]

    def argv_of(save_dir):
        return runs.benchmark_train_argv(
            a.bin_dir, row.arch, list(row.flags), SIZES[size], seed=1, max_tokens=a.max_tokens, lr=a.lr,
            warmup=a.warmup, dropout=a.dropout, save_every=a.save_every, keep=1, validate=False,
            program=trainer(a)) + execution_flags(a) + [
            "--no-save", "--save-dir", save_dir, "--max-update", "1000000",
            "--log-interval", str(concurrency.SWEEP_LOG_INTERVAL)]

    recorded = {"size": size, "row": "post_ln", "settings": settings, "settings_key": key,
                "schedule": schedule_of(settings), "dtype": "bf16" if a.bf16 else "fp32",
                "execution_flags": execution_flags(a), **device,
                "torch_threads": a.threads, "finished": None}
    lines = []
    for line in concurrency.measure(a.concurrency_sweep, a.sweep_seconds, argv_of, a.workdir / "concurrency-sweep",
                                    a.pin_cores, env, **recorded):
        line["finished"] = run_id()
        append_jsonl(a.sweep_lines[0], line)
        lines.append(line)
        rates = ", ".join("-" if r is None else f"{r:.2f}" for r in line["per_run_ups"])
        crashed = [e for e in line["ended_early"] if e]
        rates += f"; {len(crashed)} ended early, exit {crashed[0]}: see {a.workdir / 'concurrency-sweep'}" if crashed else ""
        print(f"{line['n_runs']} at once ({line['dtype']}, {'pinned' if line['pinned'] else 'not pinned'}, MPS "
              f"{'on' if line['mps'] else 'off'}): {line['total_ups']:.2f} updates/s in all (each: {rates})", flush=True)
    print_sweep_workers(a, lines)
    return 0


def check_sizes_and_milestones(p, a) -> None:
    """--sizes (known; the GPU-only ones on a GPU) and --milestones (each a multiple of
    --save-every, the first late enough for --average checkpoints), parsed into ``a``."""
    a.sizes = [x.strip() for x in a.sizes.split(",") if x.strip()] if a.sizes else None
    if a.sizes:
        unknown = [x for x in a.sizes if x not in DEFAULT_MILESTONES]
        if unknown:
            p.error(f"--sizes {','.join(unknown)}: no such size; choose from {', '.join(DEFAULT_MILESTONES)}")
        gpu_only = [x for x in a.sizes if x in GPU_ONLY_SIZES]
        if gpu_only and a.device == "cpu" and not a.tiny:
            p.error(f"--sizes {','.join(gpu_only)}: run only with --device cuda (or --tiny, a smoke test)")
    a.data = a.data or str(files.CORPUS.parent / PAIRS[a.pair].name)
    if a.milestones is None:
        a.milestones = {size: list(ms) for size, ms in PLANS[a.pair].milestones.items()}
    else:
        a.milestones = {size: sorted(a.milestones) for size in DEFAULT_MILESTONES}
    for size, ms in a.milestones.items():
        if a.sizes and size not in a.sizes:
            continue
        bad = [m for m in ms if m % a.save_every]  # each >= 1: the parser's check, or the plan's
        if not ms or bad:
            p.error(f"--milestones {bad or ms}: each must be a positive multiple of --save-every {a.save_every}")
        if ms[0] < a.average * a.save_every:
            p.error(f"--milestones {ms[0]}: the first milestone needs {a.average} checkpoints "
                    f"(--average) every {a.save_every} updates (--save-every), so at least {a.average * a.save_every}")


def check_sweep(p, a) -> None:
    """--concurrency-sweep (its run counts checked by the parser) needs a file to write its
    lines to (--sweep-lines)."""
    if a.concurrency_sweep is not None and not a.sweep_lines:
        p.error("--concurrency-sweep needs --sweep-lines JSONL, the file its lines are appended to")


def check_only(p, a) -> None:
    """--only: runs of the study (SIZE:ROW:SEED), the GPU-only sizes on a GPU; a set in ``a``."""
    a.only = set(x.strip() for x in a.only.split(",")) if a.only else None
    if a.only:
        order = plan_order(a, [Path(a.out), *map(Path, a.done_from)])
        known = {f"{s}:{r}:{n}" for s, r, n in order} | {f"{s}:{slug(r)}:{n}" for s, r, n in order}
        unknown = sorted(a.only - known)
        if unknown:
            p.error(f"--only {','.join(unknown)}: not in the {a.pair} study; choose SIZE:ROW:SEED from: "
                    + ", ".join(f"{s}:{slug(r)}:{n}" for s, r, n in order))
        gpu_only = sorted(x for x in a.only if x.split(":", 1)[0] in GPU_ONLY_SIZES)
        if gpu_only and a.device == "cpu" and not a.tiny:
            p.error(f"--only {','.join(gpu_only)}: the {'/'.join(GPU_ONLY_SIZES)} sizes run only with --device cuda "
                    "(or --tiny, a smoke test)")


def longest_milestones(a) -> list:
    """The milestones of the planned size that trains longest."""
    return max((a.milestones[size] for size in (a.sizes or a.milestones)), key=lambda ms: ms[-1])


def print_sweep_workers(a, lines) -> bool:
    """The runs side by side the concurrency sweep's ``lines`` give on --device (a line of
    why, then the number); False, printing nothing, where they hold no step on it."""
    longest = longest_milestones(a)
    n, why = workers_from_sweep(lines, a.device, longest[-1], len(longest))
    if n is None:
        return False
    print(f"the concurrency sweep: {why}")
    print(n)
    return True


def print_throughput(a) -> None:
    """--throughput: each run's updates per second in --workdir, and the workers to run (from
    the concurrency sweep's lines where --sweep-lines holds some)."""
    rates = updates_per_second(a.workdir)
    for run, ups in rates.items():
        print(f"{run.relative_to(a.workdir)}: {ups:.2f} updates/s")
    longest = longest_milestones(a)
    print(f"{len(rates)} runs side by side: {sum(rates.values()):.2f} updates/s in all; each run to "
          f"{longest[-1]} updates ({len(longest)} milestones) within a lease: workers")
    sweep = [r for path in a.sweep_lines if Path(path).is_file() for r in read_jsonl(path)]
    if not print_sweep_workers(a, sweep):
        print(workers_for(sum(rates.values()), longest[-1], len(longest)) if rates else 1)


def print_plan(a, plan, lines, key) -> None:
    """--list: each planned run, the milestones it has recorded, where an unfinished one resumes."""
    done = done_milestones(lines, key, a.device)
    width = max((len(row) for _, row, _ in plan), default=0)
    for size, row, seed in plan:
        have = sorted(done.get((size, row, seed), ()))
        finished = set(a.milestones[size]) <= set(have)
        state = "done   " if finished else ("partial" if have else "missing")
        resumes = 0 if finished else resume_point(run_dir_of(a, key, size, row, seed) / "checkpoints")
        where = f"  (checkpoints to update {resumes} in {a.workdir})" if resumes else ""
        print(f"{state}  {size:5s} {row:{width}s} seed {seed}  milestones {have}{where}")
