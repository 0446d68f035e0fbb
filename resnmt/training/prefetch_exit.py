"""Let ``fairseq-train`` exit cleanly when it stops while batches are being prefetched.

fairseq prefetches batches in a daemon thread (``fairseq.data.iterators.BackgroundConsumer``,
``--data-buffer-size`` batches ahead of training). When training stops before its epoch
ends (``--max-update``, or a crash elsewhere), that thread is often still collating the
next batch inside torch's C++ code while the interpreter shuts down. Python 3.11 ends a
daemon thread that wants the GIL back during shutdown with ``pthread_exit``, and the
forced unwinding through torch's C++ frames calls ``std::terminate``: the process prints
"terminate called without an active exception" and dies with SIGABRT (exit -6) *after*
a successful run, its checkpoints saved, so whatever called it sees a failure.

:func:`park_prefetch_threads` runs at exit, before shutdown begins: each prefetch thread
finishes the batch it is on and then stops at its next ``put``, waiting on a lock (its
queue is emptied, so a thread blocked on a full queue gets there too). A thread waiting
on a lock is ended harmlessly by the shutdown. A thread whose blocked ``put`` was its last
(the epoch's batches all fetched, the end-of-epoch marker waiting for room) ends instead of
arriving at another ``put``: the exit goes on as soon as it has ended.
"""
import atexit
import queue
import sys
import threading
import time

# How long the exit waits for one prefetch thread to finish its batch. A batch takes
# milliseconds to collate; a thread that does not arrive in this time is left as it is.
PARK_TIMEOUT_S = 30.0
# How often the exit looks whether a thread it waits for has ended instead of arriving.
POLL_S = 0.01


def _park(consumer) -> threading.Event:
    """Make ``consumer`` wait forever at its next ``put``; return the event it sets there."""
    arrived = threading.Event()

    def put_and_wait(*args, **kwargs):
        arrived.set()
        threading.Event().wait()  # never set: the thread waits here until the process ends

    batches = consumer._queue
    batches.put = put_and_wait  # the instance attribute shadows queue.Queue.put
    while True:  # emptied, so that a thread blocked in the old put on a full queue returns
        try:
            batches.get_nowait()
        except queue.Empty:
            return arrived


def _settled(consumer, arrived: threading.Event, timeout: float) -> str:
    """Wait until ``consumer`` arrives at its parked ``put`` ("parked") or ends ("ended"), at
    most ``timeout`` seconds ("left": it is left as it is)."""
    deadline = time.monotonic() + timeout
    while not arrived.wait(POLL_S):
        if not consumer.is_alive():
            return "ended"
        if time.monotonic() >= deadline:
            return "left"
    return "parked"


def park(consumers, timeout: float = PARK_TIMEOUT_S) -> dict:
    """Stop the prefetch threads ``consumers`` at their next ``put``; return how many were
    "parked" there, how many "ended" instead (their last ``put`` done) and how many were
    "left" (not there after ``timeout`` seconds)."""
    counts = {"parked": 0, "ended": 0, "left": 0}
    for consumer, arrived in [(c, _park(c)) for c in consumers]:
        counts[_settled(consumer, arrived, timeout)] += 1
    return counts


def park_prefetch_threads(timeout: float = PARK_TIMEOUT_S) -> dict:
    """:func:`park` fairseq's live prefetch threads (none where fairseq's iterators were never
    imported: nothing is imported at exit)."""
    iterators = sys.modules.get("fairseq.data.iterators")
    if iterators is None:
        return park([])
    BackgroundConsumer = iterators.BackgroundConsumer
    return park([t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()], timeout)


def park_prefetch_threads_at_exit() -> None:
    """Register :func:`park_prefetch_threads` to run at interpreter exit (applied once, by
    resnmt.fairseq_patches)."""
    atexit.register(park_prefetch_threads)
