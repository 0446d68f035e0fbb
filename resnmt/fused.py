"""``--fused-connections``: the elementwise chains of SAS and NReLU/NSwish, compiled.

SAS's combination (the gates' sigmoids, ``gamma``, ``LN(x + F)`` and
``alpha*x + beta*F + gamma*LN(x + F)``) and the normalized activation (statistics,
normalization, output) are a dozen small passes over memory each in eager PyTorch.
Here they are pure functions handed to ``torch.compile`` (inductor: C++/OpenMP on CPU,
Triton on GPU), which fuses each into a few kernels, forward and backward (AOT autograd
derives the backward from the same function, so it is the eager gradient).

* Exception: NReLU/NSwish with per-token statistics (the default) on the CPU use the
  native kernel of ``resnmt.activations.native`` instead. There a compiled call's fixed
  cost in Python (guards, AOT autograd's wrapper, ~40 µs) is as large as the work at
  decoding sizes; the kernel is a few µs per call (measured in docs/benchmarks.md).
* The eager path (``resnmt.connections``, ``resnmt.activations.normalized``)
  stays the reference: the functions below compute the same equations, and the tests
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
import torch.nn.functional as F
from torch import Tensor

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


# --------------------------------------------------------------------------- SAS


def sas_output(
    x: Tensor, fx: Tensor, logits: Tensor, norm_weight: Tensor, norm_bias: Tensor, eps: float, gamma_from_gate: bool
) -> Tensor:
    """``alpha*x + beta*F + gamma*LN(x + F)`` from the gates' logits ``(..., 2 or 3)``:
    alpha, beta (and gamma with ``gamma_from_gate``) are their sigmoids, otherwise
    ``gamma = (1-alpha)(1-beta)`` (SAS paper eq. 3/4). The LayerNorm is fairseq's
    (``torch.nn.LayerNorm`` with ``norm_weight``, ``norm_bias``, ``eps``)."""
    gates = torch.sigmoid(logits)
    alpha, beta = gates[..., 0:1], gates[..., 1:2]
    gamma = gates[..., 2:3] if gamma_from_gate else (1 - alpha) * (1 - beta)
    s = x + fx
    normed = F.layer_norm(s, (s.size(-1),), norm_weight, norm_bias, eps)
    return alpha * x + beta * fx + gamma * normed


fused_sas_output = compiled(sas_output)


# --------------------------------------------------------------------------- NReLU / NSwish


def _activate(x: Tensor, swish: bool) -> Tensor:
    return F.silu(x) if swish else torch.relu(x)


def _scaled(h: Tensor, omega: Tensor, mu: Tensor, rho: Tensor, rho_prime: Tensor, swish: bool) -> Tensor:
    """``2*sigmoid(omega) * lambda * (f(h) - mu)`` in float32, output in ``h``'s dtype;
    the statistics are constants for autograd (detached), as in the eager path."""
    x = h.float()
    lam = ((rho.reciprocal() + rho_prime.reciprocal()) * 0.5).sqrt()
    scale = 2.0 * torch.sigmoid(omega.float()) * lam.detach()
    return (scale * (_activate(x, swish) - mu.detach())).to(h.dtype)


def instance_activation(h: Tensor, omega: Tensor, swish: bool, clamp_min: float, clamp_max: float, eps: float) -> Tensor:
    """NReLU/NSwish with per-token statistics over the last (feature) dimension."""
    x = h.float().detach()
    a = _activate(x, swish)
    mu = a.mean(dim=-1, keepdim=True)
    var_h = (x.square().mean(dim=-1, keepdim=True) - x.mean(dim=-1, keepdim=True).square()).clamp(min=0.0)
    var_a = (a.square().mean(dim=-1, keepdim=True) - mu.square()).clamp(min=0.0)
    rho = (var_a / (var_h + eps)).clamp(clamp_min, clamp_max)
    rho_prime = (x > 0).float().mean(dim=-1, keepdim=True).clamp(clamp_min, clamp_max)
    return _scaled(h, omega, mu, rho, rho_prime, swish)


def batch_statistics(h: Tensor, weights: Tensor, swish: bool, eps: float):
    """``(mu, rho, p)`` over every feature of the tokens weighted by ``weights``
    ``(seq_len, batch)`` (1 at real tokens, 0 at padding); unclamped, no gradient."""
    x = h.float().detach()
    a = _activate(x, swish)
    w = weights / weights.sum().clamp(min=1.0)
    mean_h_t, mean_a_t = x.mean(dim=-1), a.mean(dim=-1)
    var_h_t = (x.square().mean(dim=-1) - mean_h_t.square()).clamp(min=0.0)
    var_a_t = (a.square().mean(dim=-1) - mean_a_t.square()).clamp(min=0.0)
    mu = (w * mean_a_t).sum()
    mean_h = (w * mean_h_t).sum()
    var_a = (w * (var_a_t + (mean_a_t - mu).square())).sum()
    var_h = (w * (var_h_t + (mean_h_t - mean_h).square())).sum()
    p = (w * (x > 0).float().mean(dim=-1)).sum()
    return mu, var_a / (var_h + eps), p


def scaled_activation(h: Tensor, omega: Tensor, mu: Tensor, rho: Tensor, rho_prime: Tensor, swish: bool) -> Tensor:
    """The output for given (already clamped) statistics: batch mode's last step."""
    return _scaled(h, omega, mu, rho, rho_prime, swish)


fused_instance_activation = compiled(instance_activation)
fused_batch_statistics = compiled(batch_statistics)
fused_scaled_activation = compiled(scaled_activation)
