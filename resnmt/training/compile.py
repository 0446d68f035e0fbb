"""torch.compile in resnmt, its two uses: each encoder and decoder layer compiled for
training (``--compile-layers``), and the elementwise chains of SAS and NReLU/NSwish
compiled wherever the model runs (``--fused-connections``).

``--compile-layers``
--------------------

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

``--fused-connections``
-----------------------

SAS's combination (the gates' sigmoids, ``gamma``, ``LN(x + F)`` and
``alpha*x + beta*F + gamma*LN(x + F)``; :mod:`resnmt.connections.gated`) and the
normalized activation (statistics, normalization, output;
:mod:`resnmt.activations.normalized`) are a dozen small passes over memory each in eager
PyTorch. Each feature writes its chain as a pure function and wraps it in :func:`compiled`,
which hands it to ``torch.compile`` (inductor: C++/OpenMP on CPU, Triton on GPU) on first
use; inductor fuses each into a few kernels, forward and backward (AOT autograd derives
the backward from the same function, so it is the eager gradient).

* Exception: NReLU/NSwish with per-token statistics (the default) on the CPU use the
  native kernel of ``resnmt.activations.native`` instead. There a compiled call's fixed
  cost in Python (guards, AOT autograd's wrapper, ~40 µs) is as large as the work at
  decoding sizes; the kernel is a few µs per call (measured in docs/benchmarks.md).
* The eager path (``resnmt.connections``, ``resnmt.activations.normalized``)
  stays the reference: the compiled functions compute the same equations, and the tests
  compare them within float tolerance.
* Shapes vary in NMT (every batch has its own length and size), so the functions are
  compiled with ``dynamic=True``: one graph serves every ``(seq_len, batch)``; sizes 0
  and 1 are specialized by torch (a decoding step, a batch of one sentence), so a
  handful of graphs is all a run ever compiles (``tests/test_fused.py`` counts them).
* The choice is made when the model is built: a module built with the flag calls the
  compiled function, one built without it never imports this module's compiler.
  Where ``torch.compile`` cannot work (no C++ compiler, no Triton on a GPU, an
  unsupported Python), :func:`require_compile` stops the model build with one line.
"""
import functools
import logging
import shutil
from typing import Optional

import torch

from resnmt.fairseq_patches import Replacement

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


class CompiledForTraining(Replacement):
    """A layer's forward: the compiled one while training with gradients, else the eager one."""

    method = "forward"

    def __init__(self, layer: torch.nn.Module, backend: str = "inductor", mode: Optional[str] = None):
        super().__init__(layer)
        self.layer = layer
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
        CompiledForTraining.put_on(layer, backend, mode)
        layers += 1
    logger.info(f"--compile-layers: {layers} layers compiled for training (torch.compile, dynamic shapes, "
                f"backend {backend}{', mode ' + mode if mode else ''}); "
                f"evaluation and decoding run eagerly")
    return layers


def compiled_calls(model: torch.nn.Module) -> int:
    """How many layer calls ran compiled so far."""
    return sum(compiled.compiled_calls for compiled in map(CompiledForTraining.on, model_layers(model)) if compiled)

# ---------------------------------------------------- --fused-connections: the elementwise chains

FLAG = "--fused-connections"

# Dynamo keeps at most `recompile_limit` graphs per function and then silently falls
# back to eager. Grad on/off, dtype and the 0/1 specializations give a few graphs per
# function; this leaves room for them with a margin.
MIN_RECOMPILE_LIMIT = 64


def compile_unavailable_reason() -> Optional[str]:
    """None when ``torch.compile`` can build CPU (and, where CUDA is present, GPU) kernels
    here; otherwise why not, in a few words."""
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor  # noqa: F401
    except Exception as err:  # pragma: no cover - depends on the torch build
        return f"torch.compile cannot be imported ({type(err).__name__}: {err})"
    if not torch._dynamo.is_dynamo_supported():  # pragma: no cover - depends on the Python version
        return "torch.compile does not support this Python version"
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++, c++ or clang++) on PATH for inductor's CPU kernels"
    if torch.cuda.is_available():
        try:
            import triton  # noqa: F401
        except ImportError:
            return "CUDA is present but Triton is not installed (inductor's GPU kernels need it)"
    return None


class CompileUnavailableError(ValueError):
    """``--fused-connections`` asked for where ``torch.compile`` cannot work."""


def require_compile() -> None:
    """Raise CompileUnavailableError with one line when ``torch.compile`` is not available here."""
    reason = compile_unavailable_reason()
    if reason is not None:
        raise CompileUnavailableError(f"{FLAG} needs torch.compile, which is not available here: {reason}; "
                           f"train without {FLAG} (the eager path computes the same)")


def raise_recompile_limit() -> None:
    """Dynamo's recompile limit (``cache_size_limit`` before torch 2.6) at least
    MIN_RECOMPILE_LIMIT (the ``dynamo-recompile-limit`` patch of resnmt.fairseq_patches)."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < MIN_RECOMPILE_LIMIT:
        setattr(config, name, MIN_RECOMPILE_LIMIT)


@functools.lru_cache(maxsize=None)
def _compiler():
    from resnmt import fairseq_patches

    require_compile()
    fairseq_patches.apply("dynamo-recompile-limit")
    return functools.partial(torch.compile, dynamic=True)


def compiled(fn):
    """``fn`` compiled with dynamic shapes on first use (so importing costs nothing)."""
    holder = {}

    @functools.wraps(fn)
    def call(*args):
        if "fn" not in holder:
            holder["fn"] = _compiler()(fn)
        return holder["fn"](*args)

    call.eager = fn
    return call
