"""A CUDA graph's semantics on the CPU, for the fast path's tests: record the aten operations
a step runs, replay exactly those operations on exactly those tensors.

A CUDA graph replays the kernels it recorded with the arguments they had: the same memory
(a tensor rebound after the recording, such as a ``.grad`` set to None and allocated again,
or a cache rebuilt for a longer batch, is not what a replay reads or writes), the same
Python numbers (a learning rate passed as a float is baked in), no Python (a branch
decided on the host is decided once). :class:`OpGraph` gives a test those semantics
without a GPU: while recording, a ``TorchDispatchMode`` keeps every aten call (the backward
pass's included) with its argument objects and its outputs; a replay calls the same
operations on the same argument objects and copies each result into the output tensors
the recording made, which later operations read. Random operations draw again from the
global generator, in the recorded order (as graph-safe random numbers do on CUDA).

Operations that read a device value on the host (``.item()``, ``bool(t)``, ``nonzero``)
raise while recording, as they do while capturing a CUDA graph: a step that would fail to
capture on a GPU fails here too.

Unlike a CUDA graph, the recording computes (the step runs once while recorded), so the
first replay after a capture does nothing (the recording was that step), as
``StepGraphs`` expects of a capture followed by a replay.
"""
import os
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
HOST_READS = {aten._local_scalar_dense, aten.is_nonzero, aten.nonzero, aten.equal, aten.masked_select,
              aten.unique_consecutive, aten._unique2}


# lines that read a tensor which is on the host on a GPU as well: no wait, allowed while capturing
HOST_TENSOR_LINES = {
    # fairseq's sinusoidal positions: a shape as a CPU tensor (torch.onnx.operators.shape_as_tensor)
    "if max_pos > self.weights.size(0):",
    "weights.index_select(0, positions.view(-1)).view(bsz, seq_len, -1).detach()",
}


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in HOST_READS and _caller_line() not in HOST_TENSOR_LINES:
            raise RuntimeError(f"operation not permitted when stream is capturing: {func} reads a device value "
                               f"at {_caller()}")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def _caller_frame():
    """The innermost frame of the stack outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        if f"{os.sep}torch{os.sep}" not in frame.filename and not frame.filename.endswith("cpu_graph.py"):
            return frame
    return None


def _caller_line() -> str:
    frame = _caller_frame()
    return (frame.line or "").strip() if frame else ""


def _caller() -> str:
    frame = _caller_frame()
    return f"{os.path.basename(frame.filename)}:{frame.lineno} ({frame.line})" if frame else "?"


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.shape == b.shape


class OpGraph:
    """The recorded operations of ``record()`` (module docstring)."""

    def __init__(self, record):
        recorder = _Recorder()
        with recorder:
            self.outputs = record()
        self.ops = recorder.ops
        self.replays, self.fresh = 0, True

    def replay(self):
        self.replays += 1
        if self.fresh:  # the recording computed this step
            self.fresh = False
            return
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                result = func(*args, **kwargs)
                for target, value in zip(tree_leaves(out), tree_leaves(result)):
                    if torch.is_tensor(target) and not _same_memory(target, value):
                        target.copy_(value)


def op_capture(record):
    """A ``StepGraphs`` capture recording into an :class:`OpGraph`."""
    graph = OpGraph(record)
    return graph, graph.outputs
