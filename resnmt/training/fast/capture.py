"""``--fast-path``'s captured steps: each step recorded once per input shape as a CUDA
graph and replayed.

A CUDA graph records the kernels a piece of code launches (their arguments and memory
addresses included) and launches all of them again with one call, so an update of
about 1,500 small kernels costs the host a handful of calls instead of 1,500 launches.
It replays the same kernels on the same memory: the inputs must be copied into the
buffers the recording read (``static`` inputs), the shapes cannot change (the shape
buckets give a few, ``buckets.py``), no code may read a device value on the host while
recording (the update of ``update.py`` reads none), and numbers that change between
updates must be device tensors filled in place (``DeviceUpdate.prepare``).

:class:`StepGraphs` runs a step function ``fn(inputs)`` (``inputs`` a nest of dicts,
lists and tensors, as a fairseq batch; ``fn`` returning tensors) per key, the key being
the step's name and the shapes and dtypes of its input tensors:

* the first ``warmup`` calls of a key run ``fn`` eagerly (on CUDA on a side stream, as
  torch requires before a capture: lazy initialisation, cuBLAS workspaces); they are
  real steps, their results count;
* and nothing is recorded before ``keys_before_capture`` keys have run eagerly (the
  trainer sets it to its batch shapes and the update): caches that a model grows with
  the length it meets (fairseq's decoder rebuilds its causal mask for a longer batch)
  reach their final size eagerly, so no recorded graph keeps reading a cache that was
  replaced;
* the next call copies the inputs into new static buffers, records ``fn`` over them
  into a graph (``capture``) and replays it: the recording itself computes nothing;
* every later call copies the inputs into that key's buffers (``copy_(...,
  non_blocking=True)``) and replays the graph;
* a key whose warm-up or recording raises (an operation that may not run while
  recording, a kernel that cannot be captured, memory) runs eagerly from then on: one
  warning line names the step, its shapes and the error (:attr:`StepGraphs.failures`),
  and the call that failed is run again eagerly. A failure costs that shape its speed,
  never the run.

All the warm-ups and recordings run on one side stream (:meth:`StepGraphs.for_cuda`):
torch's caching allocator reuses a freed block only on the stream it was allocated on,
so a new stream per warm-up would leave each shape's first-step memory cached apart.

The outputs a replay returns are the graph's own tensors: valid until any graph of the
same :class:`StepGraphs` is replayed again (all share one memory pool, which is safe as
long as they never run concurrently and no output is kept across replays); the caller
copies what it keeps. Every capture is counted with the time it took
(:attr:`StepGraphs.captures`, logged once each), so that a run shows that nothing is
captured after the warm-up but a batch shape met for the first time.

Dropout under a graph uses torch's graph-safe random numbers (the default CUDA
generator's seed and offset are read at each replay), so fairseq's re-seeding before
every update (``Trainer._set_seed``) applies to replays as to eager steps.

The capture and the warm-up context are injected (:meth:`StepGraphs.for_cuda` gives
torch's), so the bookkeeping is tested on the CPU with a fake graph
(tests/test_fast_path.py).
"""
import contextlib
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

logger = logging.getLogger(__name__)

# capture(record) -> (graph, outputs): ``record()`` run under capture; graph.replay() reruns it
Capture = Callable[[Callable[[], Any]], Tuple[Any, Any]]


def cuda_capture(pool=None, stream=None) -> Capture:
    """torch's ``torch.cuda.graph`` into the memory pool ``pool`` (one shared by all the
    graphs of a StepGraphs) on ``stream`` (the warm-ups' side stream), in thread-local
    error mode: fairseq's data loader pins memory in a thread of its own while a step is
    recorded."""
    def capture(record):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            outputs = record()
        return graph, outputs
    return capture


def side_stream_context(side) -> Callable[[], Any]:
    """A context running the enclosed eager steps on the stream ``side``, which waits for,
    and is waited for by, the current one (torch's recipe for the steps before a capture);
    the same stream for every warm-up."""
    @contextlib.contextmanager
    def on_side_stream():
        current = torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            yield
        current.wait_stream(side)
    return on_side_stream


def root_error(error: BaseException) -> BaseException:
    """The first exception of a chain (a failed recording raises again when torch ends the
    capture; the first error says why)."""
    seen = {id(error)}
    while error.__context__ is not None and id(error.__context__) not in seen:
        error = error.__context__
        seen.add(id(error))
    return error


def describe_key(key: tuple) -> str:
    """``forward_backward 16x24 16x30 ...``: the step and its input shapes."""
    shapes = " ".join("x".join(map(str, shape)) for shape, _, _ in key[1:])
    return f"{key[0]} {shapes}".strip()


class _Entry:
    __slots__ = ("graph", "static", "spec", "outputs")

    def __init__(self, graph, static, spec, outputs):
        self.graph, self.static, self.spec, self.outputs = graph, static, spec, outputs


def shape_key(name: str, leaves: List[Any]) -> tuple:
    """The step's name with the shape, dtype and device of each input tensor."""
    return (name,) + tuple((tuple(x.shape), x.dtype, x.device.type) for x in leaves if torch.is_tensor(x))


class StepGraphs:
    """Steps run through graphs recorded once per shape (module docstring)."""

    def __init__(self, capture: Capture, warmup_context: Callable[[], Any] = contextlib.nullcontext,
                 warmup: int = 1, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Callable[[], None] = lambda: None, keys_before_capture: int = 0):
        self.capture = capture
        self.keys_before_capture = keys_before_capture
        self.warmup_context = warmup_context
        self.warmup = warmup
        self.clock = clock
        self.synchronize = synchronize
        self.entries: Dict[tuple, _Entry] = {}
        self.eager_runs: Dict[tuple, int] = {}
        self.captures: List[dict] = []  # {"key", "seconds", "call"} per graph recorded, in order
        self.replays = 0
        self.calls = 0  # calls of run so far
        self.first_seen: Dict[tuple, int] = {}  # each key's first call
        self.failures: Dict[tuple, str] = {}  # keys run eagerly for good: why

    @classmethod
    def for_cuda(cls, warmup: int = 1) -> "StepGraphs":
        """Graphs of torch.cuda, all in one memory pool, warmed up and recorded on one side stream."""
        side = torch.cuda.Stream()
        return cls(cuda_capture(torch.cuda.graph_pool_handle(), stream=side), warmup_context=side_stream_context(side),
                   warmup=warmup, synchronize=torch.cuda.synchronize)

    def clear(self) -> None:
        """Forget every graph (the tensors they were recorded over are replaced)."""
        self.entries.clear()
        self.eager_runs.clear()
        self.first_seen.clear()
        self.failures.clear()

    def _fail(self, key: tuple, stage: str, error: BaseException) -> None:
        """``key`` runs eagerly from now on; one line says which shape and why."""
        error = root_error(error)
        first_line = (str(error).strip().splitlines() or [""])[0]
        self.failures[key] = f"{type(error).__name__}: {first_line}"
        self.entries.pop(key, None)
        try:
            self.synchronize()
        except Exception:  # the failure may be the device's own; the eager step will say
            pass
        logger.warning("[fast path] %s: its %s failed (%s); this shape runs eagerly from now on", describe_key(key),
                       stage, self.failures[key])

    @property
    def capture_seconds(self) -> float:
        return sum(c["seconds"] for c in self.captures)

    def run(self, name: str, fn: Callable[[Any], Any], inputs: Any) -> Any:
        """``fn(inputs)``, eagerly, recorded or replayed (module docstring)."""
        leaves, spec = tree_flatten(inputs)
        key = shape_key(name, leaves)
        self.calls += 1
        self.first_seen.setdefault(key, self.calls)
        if key in self.failures:
            return fn(inputs)
        entry = self.entries.get(key)
        if entry is None:
            runs = self.eager_runs.get(key, 0)
            if runs < self.warmup or len(self.eager_runs) < self.keys_before_capture:
                self.eager_runs[key] = runs + 1
                try:
                    with self.warmup_context():
                        return fn(inputs)
                except Exception as error:
                    self._fail(key, "warm-up", error)
                    return fn(inputs)
            try:
                entry = self._record(key, fn, leaves, spec)
            except Exception as error:
                self._fail(key, "capture", error)
                return fn(inputs)
        else:
            for buffer, value in zip(entry.static, leaves):
                if torch.is_tensor(buffer):
                    buffer.copy_(value, non_blocking=True)
        entry.graph.replay()
        self.replays += 1
        return entry.outputs

    def _record(self, key, fn, leaves, spec) -> _Entry:
        static = [x.detach().clone() if torch.is_tensor(x) else x for x in leaves]
        static_inputs = tree_unflatten(static, spec)
        self.synchronize()
        start = self.clock()
        graph, outputs = self.capture(lambda: fn(static_inputs))
        self.synchronize()
        seconds = self.clock() - start
        entry = self.entries[key] = _Entry(graph, static, spec, outputs)
        self.captures.append({"key": key, "seconds": seconds, "call": self.calls})
        logger.info("[fast path] captured %s as a CUDA graph in %.2f s (graph %d)", describe_key(key), seconds,
                    len(self.captures))
        return entry

    def summary(self) -> Optional[dict]:
        return {"graphs": len(self.captures), "capture_seconds": self.capture_seconds, "replays": self.replays,
                "eager_shapes": len(self.failures)}
