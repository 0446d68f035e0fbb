"""CPU cores for processes side by side: the cores this process may run on split into one
set per process, and a process started on its own set (so that runs on one machine do not
take turns on the same cores)."""
import os
import subprocess
from typing import List, Sequence


def core_sets(n: int, cores: Sequence[int] = None) -> List[List[int]]:
    """``cores`` (default: those this process may run on) split into ``n`` contiguous sets
    of sizes differing by at most one; with fewer cores than ``n``, the sets wrap round
    (process i gets core i mod len(cores))."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if n <= len(cores):
        return [list(cores[i * len(cores) // n:(i + 1) * len(cores) // n]) for i in range(n)]
    return [[cores[i % len(cores)]] for i in range(n)]


def popen_on(cores, argv, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` whose process (and its children) run on
    ``cores`` only (None: wherever this process may)."""
    if cores is None:
        return subprocess.Popen(argv, **kwargs)
    return subprocess.Popen(argv, preexec_fn=lambda: os.sched_setaffinity(0, cores), **kwargs)


def start_side_by_side(argvs, pin: bool, outputs=None, **kwargs) -> List[subprocess.Popen]:
    """Each of ``argvs`` started at once (``outputs``: a file per process for its stdout and
    stderr); ``pin``: each on its own :func:`core_sets` set."""
    sets = core_sets(len(argvs)) if pin else [None] * len(argvs)
    outputs = outputs or [None] * len(argvs)
    return [popen_on(cores, argv, stdout=out, stderr=subprocess.STDOUT if out else None, **kwargs)
            for cores, argv, out in zip(sets, argvs, outputs)]
