"""Per-position statistics of normalized activations, and their reduction over real tokens.

What a sublayer connection reports is its own class's ``measure(x, fx)``
(``resnmt.connections``: SAS gates, rSkip ratio, highway gate, skip:residual
ratios, ReZero's a, Admin's omega). The functions here read a module's own parameters
and public methods and return **per-position** values, shape ``(seq_len, batch)``;
reducing them over the real (non-padding) positions is :func:`masked_sum_count`'s job.
Nothing here keeps a graph: callers run them under ``torch.no_grad()``.

Shape: ``h`` is the fc1 output ``(seq_len, batch, ffn_dim)``.
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from resnmt.activations.normalized import NormalizedActivation, normalization_factor


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
