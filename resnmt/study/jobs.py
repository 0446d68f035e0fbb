"""The study's runs as jobs of submitit (the engine fairseq's authors submit SLURM sweeps
with): each (size, row, seed) run one job, on this machine (``--executor local``: a process
per job, side by side) or a SLURM cluster (``--executor slurm``, with its partition, time
and GPUs per run). Every job appends its milestones' lines to the same results file (a
shared folder, as the run directories are); a job that dies is submitted again and resumes
from its run's last checkpoint (a milestone recorded is not trained again), as a job that
SLURM preempts or times out is requeued by submitit (:class:`RunJob` is checkpointable).
"""
import argparse
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from resnmt.options import Option, add_to_command

EXECUTORS = ("local", "slurm")
OPTIONS = (
    Option("executor", kind="choice", choices=EXECUTORS, help=(
        "run each (size, row, seed) run as a submitit job: local, a process per job on this machine, side by side; "
        "slurm, a job per run on a SLURM cluster (--partition, --time, --gpus-per-run); default: in this process, "
        "one run after another")),
    Option("partition", metavar="NAME", help="--executor slurm: the partition the jobs go to (default: the cluster's)"),
    Option("time", 240, "minutes a job may run before the cluster stops it; a stopped job is requeued and resumes "
           "(default: %(default)s)", kind="int", minimum=1, metavar="MIN"),
    Option("gpus_per_run", None, "GPUs per job (default: 1 with --device cuda, else 0)", kind="int", minimum=0,
           metavar="N"),
    Option("retries", 2, "times a job that dies is submitted again, resuming from its last checkpoint (default: "
           "%(default)s)", kind="int", minimum=0, metavar="N"),
    Option("jobs_folder", metavar="DIR", help="submitit's logs and pickles of the jobs (default: WORKDIR/jobs)"),
)
POLL_SECONDS = 1.0


def add_executor_options(p: argparse.ArgumentParser) -> None:
    add_to_command(p, OPTIONS)


def with_absolute_paths(args):
    """``args`` with its folders and files absolute: a job may start in another folder."""
    for name in ("workdir", "out", "data", "bin_dir", "ref"):
        if getattr(args, name, None):
            setattr(args, name, Path(getattr(args, name)).resolve())
    return args


def executor(a, name: str):
    """The submitit executor ``a.executor`` names, its jobs' resources from ``a`` (threads,
    device, --partition, --time, --gpus-per-run), its folder ``a.jobs_folder`` or ``a.workdir/jobs``."""
    import submitit

    folder = Path(a.jobs_folder or Path(a.workdir) / "jobs")
    ex = submitit.AutoExecutor(folder=folder, cluster=a.executor)
    gpus = a.gpus_per_run if a.gpus_per_run is not None else int(a.device == "cuda")
    ex.update_parameters(name=name, timeout_min=a.time, gpus_per_node=gpus, cpus_per_task=a.threads, nodes=1,
                         tasks_per_node=1, **({"slurm_partition": a.partition} if a.partition else {}))
    return ex


class RunJob:
    """A job: one run trained to each of its milestones not yet recorded in ``args.out``, each
    scored and appended there (:func:`resnmt.study.milestones.train_and_score`). On SLURM,
    preempted or out of time, it is requeued with the same arguments (submitit's
    ``checkpoint``) and resumes from the run's last checkpoint."""

    def __call__(self, args, settings: dict, key: str, run: Tuple[str, str, int], env: Dict[str, str]) -> int:
        from resnmt.study.milestones import done_milestones, train_and_score
        from resnmt.study.records import cpu_description, cuda_description

        device = cpu_description() if args.device == "cpu" else cuda_description()
        done = done_milestones([args.out], key, args.device).get(run, set())
        train_and_score(args, settings, key, run, done, env, device)
        return len(done_milestones([args.out], key, args.device).get(run, set()))

    def checkpoint(self, *args, **kwargs):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)  # the same run again: it resumes where it stopped


def cause(e: BaseException) -> str:
    """A failed job's cause in one line: the last line of the job's own traceback (submitit's
    FailedJobError carries it between dashed lines), else the error's first line."""
    text = str(e).strip()
    parts = text.split("-" * 22)
    lines = [x.strip() for x in (parts[1] if len(parts) > 2 else text).splitlines() if x.strip()]
    if not lines:
        return type(e).__name__
    return lines[-1] if len(parts) > 2 else lines[0]


def run_jobs(ex, runs: Sequence[Tuple[str, str, int]], job_args: Callable[[tuple], tuple], retries: int,
             say: Callable[[str], None], job=RunJob) -> List[str]:
    """Submit ``job()(*job_args(run))`` for each of ``runs`` with ``ex`` and wait for them all;
    a job that dies is submitted again up to ``retries`` times (it resumes from its last
    checkpoint). Progress lines through ``say``; the failures that remain, one line each."""
    if not runs:
        return []
    jobs = {run: ex.submit(job(), *job_args(run)) for run in runs}  # each job's arguments pickled as they are now
    attempts = dict.fromkeys(runs, 1)
    say(f"{len(jobs)} jobs submitted ({type(ex).__name__} {ex.cluster}): "
        + ", ".join(f"{' '.join(map(str, run))} = job {j.job_id}" for run, j in jobs.items()))
    failures = []
    while jobs:
        for run, j in list(jobs.items()):
            if not j.done():
                continue
            del jobs[run]
            name = " ".join(map(str, run))
            try:
                j.result()
                say(f"{name}: job {j.job_id} done")
            except Exception as e:  # the job's exception, or its death (submitit's UncompletedJobError)
                why = cause(e)
                if attempts[run] > retries:
                    failures.append(f"{name}: job {j.job_id} failed {attempts[run]} times; the last: {why} "
                                    f"(its log: {j.paths.stderr})")
                    continue
                attempts[run] += 1
                jobs[run] = ex.submit(job(), *job_args(run))
                say(f"{name}: job {j.job_id} died ({why}); submitted again as job {jobs[run].job_id}, resuming "
                    "from its last checkpoint")
        if jobs:
            time.sleep(POLL_SECONDS)
    return failures
