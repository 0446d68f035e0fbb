"""``--compile-layers``: each encoder and decoder layer compiled for training.

Training an update of the base Transformer on a GPU launches some thousands of small
kernels (dropouts, residual additions, layer norms, the connections' elementwise work),
and the GPU mostly waits for Python to launch them (docs/benchmarks.md). With
``--compile-layers`` (a flag of the ``resnmt_translation`` task) every layer of the
model's encoder and decoder runs through ``torch.compile(dynamic=True)`` while it trains:
the layer's forward and backward become a few generated kernels around the matrix
products, and ``dynamic=True`` makes batch size and sequence length symbolic, so batches
of new shapes reuse the graphs instead of compiling again.

Only training is compiled: a layer runs its eager forward whenever it is in eval mode or
gradients are off (validation, decoding, and incremental decoding with its cached
states), so decoding is unchanged. The model, its parameters and its checkpoints are
the same objects as without the flag; the compiled graphs compute the same function
(tests/test_compile.py: losses and gradients equal eager's, no recompilation for new
batch shapes, evaluation eager).

``--compile-mode`` passes torch.compile's mode. ``reduce-overhead`` (and ``max-autotune``)
also replays each layer's kernels as CUDA graphs, one launch per layer instead of one per
kernel, the lever for an update bound by launching kernels rather than by the GPU's
arithmetic. A CUDA graph has fixed shapes: one is recorded for each new batch shape (the
first batches of each shape run slower and keep their memory), so bucket the shapes with
fairseq's ``--required-seq-len-multiple`` (8, say); the task marks each update as a new
step of the graphs (``torch.compiler.cudagraph_mark_step_begin``). On the CPU there are
no CUDA graphs and the modes only change inductor's code generation.
"""
import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes that record CUDA graphs


def check_compile_options(backend: str, mode: Optional[str]) -> None:
    """One line naming the bad value and what is allowed."""
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f"--compile-backend {backend}: choose one of {', '.join(COMPILE_BACKENDS)}")
    if mode is not None and mode not in COMPILE_MODES:
        raise ValueError(f"--compile-mode {mode}: choose one of {', '.join(COMPILE_MODES)}")
    if mode not in (None, "default") and backend != "inductor":
        raise ValueError(f"--compile-mode {mode} needs --compile-backend inductor ({backend} ignores the mode)")


class CompiledForTraining:
    """A layer's forward: the compiled one while training with gradients, else the eager one."""

    def __init__(self, layer: torch.nn.Module, backend: str = "inductor", mode: Optional[str] = None):
        self.layer = layer
        self.eager = layer.forward
        kwargs = {"mode": mode} if mode else {}
        self.compiled = torch.compile(self.eager, dynamic=True, backend=backend, **kwargs)
        self.compiled_calls = 0

    def __call__(self, *args, **kwargs):
        if self.layer.training and torch.is_grad_enabled():
            self.compiled_calls += 1
            return self.compiled(*args, **kwargs)
        return self.eager(*args, **kwargs)


def model_layers(model):
    for stack in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        for layer in getattr(stack, "layers", None) or []:
            yield layer


def compile_layers_for_training(model: torch.nn.Module, backend: str = "inductor", mode: Optional[str] = None) -> int:
    """Compile every encoder and decoder layer of ``model`` for training (see the module
    docstring); returns how many layers. Calling it again changes nothing."""
    check_compile_options(backend, mode)
    mode = None if mode == "default" else mode  # torch.compile's own default
    layers = 0
    for layer in model_layers(model):
        if not isinstance(layer.__dict__.get("forward"), CompiledForTraining):
            layer.forward = CompiledForTraining(layer, backend, mode)
        layers += 1
    logger.info(f"--compile-layers: {layers} layers compiled for training (torch.compile, dynamic shapes, "
                f"backend {backend}{', mode ' + mode if mode else ''}); "
                f"evaluation and decoding run eagerly")
    return layers


def compiled_calls(model: torch.nn.Module) -> int:
    """How many layer calls ran compiled so far."""
    return sum(layer.forward.compiled_calls for layer in model_layers(model)
               if isinstance(layer.__dict__.get("forward"), CompiledForTraining))
