"""A process that stops reading fairseq's prefetched batches mid-epoch exits cleanly once
resnmt is imported (resnmt.training.prefetch_exit); without it, the prefetch thread is caught in
torch's C++ code at shutdown and the process aborts (the CI failure that led to it)."""
import subprocess
import sys

from conftest import run_cli

# One batch from a BufferedIterator whose source collates slowly (many torch ops per
# batch, as fairseq's collater does for large batches), then the interpreter exits with
# the prefetch thread busy collating the next one.
STOP_MID_EPOCH = """
import atexit, sys, torch
import resnmt
from resnmt.training.prefetch_exit import park_prefetch_threads
if sys.argv[1] == "unguarded":
    atexit.unregister(park_prefetch_threads)
from fairseq.data.iterators import BufferedIterator

class SlowCollation:
    def __len__(self):
        return 1000
    def __iter__(self):
        rows = [torch.arange(50) for _ in range(64)]
        for _ in range(1000):
            for _ in range(200):
                batch = torch.nn.utils.rnn.pad_sequence(rows)
            yield batch

batches = BufferedIterator(2, SlowCollation())
print(next(batches).shape, flush=True)
"""


def stop_mid_epoch(mode: str) -> subprocess.CompletedProcess:
    return run_cli([sys.executable, "-c", STOP_MID_EPOCH, mode], check=False, timeout=300)


def test_prefetch_thread_busy_at_exit_aborts_without_the_guard():
    """The failure the guard exists for, reproduced: at least one of three unguarded
    exits aborts with SIGABRT and the C++ runtime's message (nearly all do)."""
    procs = []
    for _ in range(3):
        procs.append(stop_mid_epoch("unguarded"))
        if procs[-1].returncode != 0:
            break
    assert procs[-1].returncode == -6, [(p.returncode, p.stderr[-300:]) for p in procs]
    assert "terminate called without an active exception" in procs[-1].stderr


def test_prefetch_thread_busy_at_exit_exits_cleanly_with_resnmt():
    for _ in range(3):
        proc = stop_mid_epoch("guarded")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "torch.Size([50, 64])"
        assert "terminate called" not in proc.stderr
