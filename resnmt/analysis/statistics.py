"""Per-position statistics of sublayer connections and normalized activations.

Every function here reads a module's own parameters and public methods (so it follows
the module's equations) and returns **per-position** values, shape ``(seq_len, batch)``;
reducing them over the real (non-padding) positions is :func:`masked_sum_count`'s job.
Nothing here keeps a graph: callers run them under ``torch.no_grad()``.

Shapes: ``x`` and ``fx`` are a sublayer's input and its (dropped-out) output,
``(seq_len, batch, embed_dim)``; ``h`` is the fc1 output ``(seq_len, batch, ffn_dim)``.
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from resnmt.modules.connections import HighwayConnection, RSkipLNConnection, SASConnection
from resnmt.modules.normalized_activation import NormalizedActivation, normalization_factor


def sas_gates(conn: SASConnection, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
    """alpha, beta, gamma per position, from ``SASConnection.gate_values``.

    gamma is ``(1-alpha)(1-beta)`` per position (eq. 4), or the third gate with
    ``--sas-gamma gate`` (eq. 3): whatever the connection itself multiplies ``LN(x+F)`` by.
    """
    gates = conn.gate_values(x, fx)
    return {name: value.squeeze(-1).float() for name, value in gates.items()}


def layer_norm_sigma(norm, z: Tensor) -> Tensor:
    """What ``norm`` divides ``z - mean`` by: ``sqrt(Var[z] + eps)`` over features
    (biased variance, the LayerNorm's own eps), shape ``z.shape[:-1]``."""
    z = z.float()
    var = z.var(dim=-1, unbiased=False)
    return torch.sqrt(var + float(norm.eps))


def rskip_ratio(conn: RSkipLNConnection, x: Tensor, fx: Tensor) -> Tensor:
    """Effective skip : residual ratio of rSkip+LN (rSkip paper, appendix A), per position.

    The connection computes ``y_1 = LN_1(x + F)``, ``y_k = LN_k(x + y_{k-1})``. Writing
    ``LN_j(z) = w_j * (z - mean) / sigma_j + b_j`` and unrolling, the input of the last
    LayerNorm holds ``x`` and ``F`` in the per-feature ratio::

        x : F = 1 + sum_{i=1..lambda-1} prod_{j=1..i} sigma_j / w_j

    (``sigma_1 / w_1 + 1`` for lambda = 2), where ``sigma_j`` is the standard deviation
    over features of the input of ``LN_j`` at this position (``x + F`` for j = 1,
    ``x + y_{j-1}`` after), including the LayerNorm's eps, and ``w_j`` its gain
    (per feature). Returns the mean over features, ``(seq_len, batch)``; lambda = 1
    (post-LN) gives 1.
    """
    x = x.float()
    y = fx.float()
    ratio = torch.ones_like(x)
    product = torch.ones_like(x)
    norms = list(conn.norms)
    for j, norm in enumerate(norms):
        z = x + y
        if j < len(norms) - 1:  # the last LN's sigma does not enter the ratio
            product = product * layer_norm_sigma(norm, z).unsqueeze(-1) / norm.weight.float()
            ratio = ratio + product
        y = norm(z.to(fx.dtype)).float()
    return ratio.mean(dim=-1)


def highway_gate(conn: HighwayConnection, x: Tensor) -> Tensor:
    """The transform gate ``t = sigmoid(x W_T + b_T)`` (weight of F; 1-t weighs the skip),
    averaged over features, ``(seq_len, batch)``."""
    return conn.gate_values(x).float().mean(dim=-1)


def activation_stats(act: NormalizedActivation, h: Tensor, padding_mask: Optional[Tensor]) -> Dict[str, Tensor]:
    """rho, rho' and lambda of an NReLU/NSwish for the fc1 output ``h``, per position.

    ``instance`` statistics: the activation's own per-token values
    (``NormalizedActivation.statistics``, which has no side effect in that mode).
    ``batch`` statistics: the running estimates the activation used in its last forward
    (read from its buffers, so the hook does not update them a second time), broadcast
    to every position. ``lambda = sqrt((1/rho + 1/rho') / 2)`` per position, the factor the
    activation multiplies by (before its ``2*sigmoid(omega)`` gain).
    """
    shape = h.shape[:-1]
    if act.batch_stats:
        rho = act.running_rho.float().expand(shape)
        rho_prime = act.running_rho_prime.float().expand(shape)
    else:
        x = h.float()
        _, rho, rho_prime = act.statistics(x, *act.activate(x), padding_mask)
        rho, rho_prime = rho.squeeze(-1), rho_prime.squeeze(-1)
    return {"rho": rho, "rho_prime": rho_prime, "lambda": normalization_factor(rho, rho_prime)}


def masked_sum_count(values: Tensor, padding_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Sum of ``values`` ``(seq_len, batch)`` over real positions, and their number.

    ``padding_mask`` is ``(batch, seq_len)``, True at padding, or None (no padding).
    Both results are 0-dim float tensors (no device sync).
    """
    values = values.float()
    if padding_mask is None:
        return values.sum(), values.new_tensor(float(values.numel()))
    keep = (~padding_mask).t().to(values.dtype)
    if keep.shape != values.shape:
        raise ValueError(f"padding mask {tuple(padding_mask.shape)} does not fit values {tuple(values.shape)}")
    return (values * keep).sum(), keep.sum()
