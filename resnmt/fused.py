"""``--fused-connections``: how a feature's elementwise chain is compiled.

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
import shutil
from typing import Optional

import torch

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


@functools.lru_cache(maxsize=None)
def _compiler():
    require_compile()
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < MIN_RECOMPILE_LIMIT:
        setattr(config, name, MIN_RECOMPILE_LIMIT)
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
