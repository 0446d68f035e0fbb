"""Shared test fixtures: paths, a tiny real-data corpus binarized by fairseq, CLI runner."""
import atexit
import fcntl
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# RESNMT_TEST_DATA: another copy of it (the GPU job carries one: benchmarks/gpu_job.sh)
SHARED_DATA = Path(os.environ.get("RESNMT_TEST_DATA") or REPO_ROOT.parent / "shared" / "data")
BIN_DIR = Path(sys.executable).parent  # the venv's bin: fairseq-train & co. live here

# Triton's interpreter is chosen when triton is first imported (its library's own jit
# functions are made then, and torch may import it before tests/test_fused_loss_kernel.py
# does): on a machine without an NVIDIA device every test process runs Triton interpreted.
if not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    """Parallel workers (make test: pytest-xdist, one per core) share the cores: one torch
    thread each, as the command-line tools the tests start already get (cli_env)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def shared_data_dir(name: str) -> Path:
    """A dataset under ../shared/data; a missing one is an error, never a skip."""
    path = SHARED_DATA / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"test data {path} is missing: tests read real data from ../shared/data "
            "relative to the repository root"
        )
    return path


def cli_env(**extra) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


# The variables of the tests' own that a forked command may be given: read when it runs, not
# when torch or a library is imported (the probe's output folder, test_distributed.PROBE).
RUN_TIME_ENV = ("PROBE_OUT", "PROBE_STOP")
# The venv's console scripts that import torch and fairseq, which run_cli starts from the fork
# server below instead of a new interpreter (with no environment of their own but RUN_TIME_ENV:
# the server's is the test process's), as it starts Python scripts (this Python, a .py file).
FORKED_SCRIPTS = ("fairseq-train", "fairseq-generate", "fairseq-interactive", "resnmt-train", "resnmt-average",
                  "resnmt-analyze", "resnmt-evaluate")

# A process that imports torch (with torch._dynamo, which every optimizer loads) and the
# libraries fairseq imports (not fairseq: importing it configures logging, which fairseq-train
# does itself when it starts, before it imports fairseq) once, then forks a child per command
# it reads (one JSON line: [name, args, cwd, env, stdout file, stderr file, timeout]): the
# child's stdin is /dev/null, its stdout and stderr the files, its directory and environment
# the command's, and it calls the console script's entry point as the installed script does
# (sys.exit(main()); its exit and atexit handlers its own), or runs the code of a "-c"
# command as `python -c` does, a .py file as `python FILE` does; SIGALRM ends it after the
# timeout. The server answers each with the child's exit status (negative: the signal).
FORK_SERVER = r"""
import json, logging, os, runpy, signal, sys
from importlib.metadata import entry_points
import torch, torch._dynamo, numpy, scipy.stats, sklearn.metrics, omegaconf, hydra
assert not logging.getLogger().handlers, "an import configured logging, which the commands do themselves"

for request in sys.stdin:
    name, args, cwd, env, out, err, timeout = json.loads(request)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.chdir(cwd)
        os.environ.clear(); os.environ.update(env)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        files = {}  # stdout and stderr one file where they are one path
        for fd, path in ((1, out), (2, err)):
            if path not in files:
                files[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(files[path], fd)
        signal.alarm(timeout)
        if name == "-c":  # python -c CODE ARGS
            sys.argv = ["-c", *args[1:]]
            exec(compile(args[0], "<string>", "exec"), {"__name__": "__main__"})
            sys.exit(0)
        if name.endswith(".py"):  # python SCRIPT ARGS: the script's folder first on sys.path
            sys.argv, sys.path[0] = [name, *args], os.path.dirname(os.path.abspath(name))
            runpy.run_path(name, run_name="__main__")
            sys.exit(0)
        (script,) = entry_points(group="console_scripts", name=name)
        sys.argv = [os.path.join(os.path.dirname(sys.executable), name), *args]
        sys.exit(script.load()())
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""
_fork_server = None


def stop_fork_server(server) -> None:
    """End the fork server (its input closed, it ends its loop) and wait for it."""
    server.stdin.close()
    server.wait()


def forked(args, cwd, timeout: int, env: dict, merge_stderr: bool = False) -> subprocess.CompletedProcess:
    """``args`` (a FORKED_SCRIPTS name, a .py file, or "-c" and Python code, then the
    arguments) run as subprocess.run(..., capture_output=True, text=True) runs it
    (``merge_stderr``: as with stdout=PIPE, stderr=STDOUT), in a process forked from this
    worker's fork server (FORK_SERVER, started on first use): a process of its own, without
    a new interpreter's imports of torch and fairseq's libraries."""
    import json
    import signal
    import tempfile

    global _fork_server
    if _fork_server is None or _fork_server.poll() is not None:
        _fork_server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, cwd=str(REPO_ROOT), env=cli_env(), text=True)
        atexit.register(stop_fork_server, _fork_server)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "stdout")
        err = out if merge_stderr else Path(tmp, "stderr")
        request = [args[0], args[1:], str(cwd), env, str(out), str(err), int(timeout)]
        _fork_server.stdin.write(json.dumps(request) + "\n")
        _fork_server.stdin.flush()
        answer = _fork_server.stdout.readline()
        if not answer:  # the server itself ended (its traceback is on this worker's stderr)
            raise RuntimeError(f"the tests' fork server ended (exit status {_fork_server.wait()}) before running "
                               f"{' '.join(args)}")
        code = int(answer)
        stdout, stderr = out.read_text(), None if merge_stderr else err.read_text()
        if code == -signal.SIGALRM:
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
        return subprocess.CompletedProcess(args, code, stdout, stderr)


def compiled_for_sm90(code: str, cache_dir) -> list:
    """The lines ``code`` prints, run in a Python process of its own with Triton compiling for
    real (TRITON_INTERPRET unset) into ``cache_dir`` (compiled here, not found in a cache):
    the kernels' check for the H100/H200's architecture, sm_90, on a machine without one."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split("\n")


def run_cli(args, cwd=None, check=True, timeout=900, **env_extra):
    """Run a command-line tool (list of str) with the venv's bin first on PATH; one of
    FORKED_SCRIPTS or a Python script, without an environment of its own but RUN_TIME_ENV,
    in a process forked from one that imported torch and fairseq's libraries (``forked``)."""
    args, cwd, env = [str(a) for a in args], str(cwd or REPO_ROOT), cli_env(**env_extra)
    script = args[1:2] if args[0] == sys.executable and args[1:2] and args[1].endswith(".py") else []
    if set(env_extra) <= set(RUN_TIME_ENV) and (args[0] in FORKED_SCRIPTS or script):
        proc = forked(args[1:] if script else args, cwd, timeout, env)
    else:
        proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, args))}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc


def write_multi30k_subset(dest: Path, n_train=300, n_valid=60, n_test=60) -> Path:
    """First lines of the real Multi30k EN-DE splits, lower-cased, as fairseq text files."""
    src = shared_data_dir("multi30k")
    dest.mkdir(parents=True, exist_ok=True)
    splits = {"train": ("train", n_train), "valid": ("val", n_valid), "test": ("test_2016_flickr", n_test)}
    for split, (name, n) in splits.items():
        for lang in ("en", "de"):
            with gzip.open(src / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f).strip().lower() for _ in range(n)]
            (dest / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The directory ``name``, made by ``build(path)`` once per test run and shared by every
    pytest-xdist worker (the first to ask builds it, under a lock; the others wait and read
    it): a corpus or a trained checkpoint costs one build however the tests are spread.
    Tests only read it. A build that failed is tried again by the next to ask."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base temporary directory, above each worker's own
    path, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            build(path)
            done.touch()
    return path


def fairseq_preprocess(*args) -> None:
    """fairseq-preprocess ARGS run in this process, for the tests' own corpora (the command's
    behaviour is not what they test): the test process has imported fairseq already, a new
    one would spend its time importing it again. The log file each run adds is closed after it."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess

    log = logging.getLogger("fairseq_cli.preprocess")
    before = list(log.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args([str(a) for a in args]))
    finally:
        for handler in [h for h in log.handlers if h not in before]:
            log.removeHandler(handler)
            handler.close()


def build_tiny_bin(root: Path) -> None:
    text = write_multi30k_subset(root / "text")
    fairseq_preprocess(
        "--source-lang", "en", "--target-lang", "de",
        "--trainpref", text / "train", "--validpref", text / "valid", "--testpref", text / "test",
        "--destdir", root / "bin", "--joined-dictionary", "--workers", "1",
    )


@pytest.fixture(scope="session")
def tiny_bin(tmp_path_factory) -> Path:
    """A few hundred real Multi30k EN-DE pairs, binarized with a joined dictionary (text/
    beside bin/ holds them as text); built once per test run."""
    return built_once(tmp_path_factory, "multi30k_tiny", build_tiny_bin) / "bin"
