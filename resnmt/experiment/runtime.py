"""The environment and logging of the external programs an experiment runs
(``fairseq-train``, ``fairseq-generate``, ``resnmt-prepare``, ``resnmt-analyze``)."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

from resnmt.atomic import atomic_open
from resnmt.experiment.errors import ExperimentError

# fairseq's --user-dir: the installed package's directory (absolute, so checkpoints load from anywhere)
USER_DIR = Path(__file__).resolve().parent.parent

# glibc's malloc hands every freed buffer above its mmap threshold (which adapts up to
# 32 MiB) back to the kernel, which faults it in again page by page at the next step. On
# the CPU that is most of a training step's big tensors (a 2+2 model's logits over a
# 4096-token batch are ~100 MiB, their gradient as much): over a quarter of fairseq-train's CPU
# time went to the kernel (measured with and without them). These two keep freed memory
# in the process for reuse; the results are the same to the bit. Other C libraries ignore
# them, and a value already in the environment wins.
KEEP_FREED_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


class _CommandFailed(Exception):
    """Discards a failed command's partial stdout file (raised inside ``atomic_open``)."""


def tool_env(threads: Optional[int] = None, cpu_only: bool = False) -> Dict[str, str]:
    """The environment for the subprocesses: this Python's scripts first on PATH,
    ``threads`` OpenMP/MKL threads when given, and glibc's malloc told to keep freed
    memory (``KEEP_FREED_MEMORY_ENV``) unless the environment already says otherwise."""
    env = {**KEEP_FREED_MEMORY_ENV, **os.environ}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def which(name: str) -> Optional[str]:
    """``name`` on the PATH the subprocesses get (``tool_env``: this Python's scripts first)."""
    return shutil.which(name, path=tool_env()["PATH"])


def require_commands(*names: str) -> None:
    for name in names:
        if which(name) is None:
            raise ExperimentError(f"'{name}' not found on PATH nor beside {sys.executable} "
                                  "(pip install resnmt installs it with resnmt's other requirements)")


def run_logged(cmd: Sequence, log_path: Optional[Path], env: Optional[Dict[str, str]] = None,
               stdout_path: Optional[Path] = None, quiet: bool = False) -> None:
    """Run ``cmd``; its stderr (and stdout unless ``stdout_path``) is appended to ``log_path``
    (or passed through when None; ``quiet``: without fairseq's INFO lines and its
    configuration and model dumps, resnmt.training.quiet). ``stdout_path`` is written atomically: it exists
    only if the command succeeded."""
    cmd = [str(c) for c in cmd]
    log = None
    if log_path is not None:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8")
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
    err = subprocess.PIPE if log is None and quiet else log
    try:
        if stdout_path is None:
            proc = subprocess.run(cmd, stdout=log, stderr=err, env=env)
        else:
            try:
                with atomic_open(stdout_path, "w") as out:
                    proc = subprocess.run(cmd, stdout=out, stderr=err, env=env)
                    if proc.returncode != 0:
                        raise _CommandFailed
            except _CommandFailed:
                pass
    finally:
        if log is not None:
            log.close()
    if err is subprocess.PIPE:
        from resnmt.training.quiet import FairseqNoise, is_info_line

        noise = FairseqNoise()
        lines = proc.stderr.decode(errors="replace").splitlines(True)
        sys.stderr.write("".join(line for line in lines if noise.keep(line) and not is_info_line(line)))
        sys.stderr.flush()
    if proc.returncode != 0:
        where = ""
        if log_path is not None:
            where = f"; log {log_path}:\n" + log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise ExperimentError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}){where}")
