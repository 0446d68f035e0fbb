"""A process that stops reading fairseq's prefetched batches mid-epoch exits cleanly once
resnmt is imported (resnmt.training.prefetch_exit); without it, the prefetch thread is caught in
torch's C++ code at shutdown and the process aborts (the CI failure that led to it)."""
from conftest import cli_env, forked

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


def stop_mid_epoch(mode: str, times: int, tmp_path) -> list:
    """``times`` processes that each stop mid-epoch (forked from one that imported torch:
    conftest.forked; each exit is its own process's)."""
    return [forked(["-c", STOP_MID_EPOCH, mode], tmp_path, 300, cli_env()) for _ in range(times)]


def test_prefetch_thread_busy_at_exit_aborts_without_the_guard(tmp_path):
    """The failure the guard exists for, reproduced: at least one of three unguarded
    exits aborts with SIGABRT and the C++ runtime's message (nearly all do)."""
    procs = stop_mid_epoch("unguarded", 1, tmp_path)
    if procs[0].returncode == 0:  # the race lost once: two more tries
        procs += stop_mid_epoch("unguarded", 2, tmp_path)
    aborted = [p for p in procs if p.returncode != 0]
    assert aborted and aborted[0].returncode == -6, [(p.returncode, p.stderr[-300:]) for p in procs]
    assert "terminate called without an active exception" in aborted[0].stderr


def test_prefetch_thread_busy_at_exit_exits_cleanly_with_resnmt(tmp_path):
    for proc in stop_mid_epoch("guarded", 3, tmp_path):
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "torch.Size([50, 64])"
        assert "terminate called" not in proc.stderr


def test_a_prefetch_thread_whose_last_put_was_waiting_ends_and_the_exit_goes_on():
    """A run stopped in the last batches of its epoch: the prefetch thread has fetched them
    all and waits for room to put the end-of-epoch marker. Emptying its queue lets that
    last put through and the thread ends instead of arriving at another put; the exit
    counts it as ended (it used to wait the full timeout for it)."""
    import threading
    import time

    from fairseq.data.iterators import BufferedIterator

    from resnmt.training.prefetch_exit import park

    batches = BufferedIterator(2, [1, 2, 3])
    assert next(batches) == 1  # the thread puts 2 and 3, then waits to put the marker
    consumer = batches._consumer
    for _ in range(6000):  # until then (a guard against a hang, not a timing)
        if consumer.count == 3 and batches._queue.full():
            break
        time.sleep(0.01)
    assert consumer.count == 3 and batches._queue.full() and consumer.is_alive()
    assert park([consumer], timeout=600) == {"parked": 0, "ended": 1, "left": 0}
    assert not consumer.is_alive() and consumer not in threading.enumerate()
