"""Kinds that place the normalization by depth or by sublayer (2025): Mix-LN (post-LN in
the lowest layers, pre-LN above), LayerNorm Scaling (pre-LN scaled by 1/√ℓ) and
HybridNorm (normalized Q, K, V; the FFN's residual from its normalized input).

Each reads the layer (``spec.layer_index``) or the sublayer (``spec.sublayer``) it is
built for; none carries anything across layers.
"""
import math

import torch
from torch import Tensor

from resnmt.connections.base import SublayerConnection
from resnmt.connections.classic import PreLNConnection
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, register_connection
from resnmt.flags import Flag


def mix_ln_post_layers(layers: int, fraction: float) -> int:
    """How many of a stack's lowest layers Mix-LN makes post-LN: ``int(fraction * layers)``
    (the authors' ``layer_index < POST_NUM``)."""
    return int(fraction * layers)


@register_connection
class MixLNConnection(SublayerConnection):
    """Mix-LN: post-LN ``LN(x + F)`` in layers ``l < int(fraction * L)`` (0-based, each
    stack counted by itself), pre-LN ``x + F(LN(x))`` above; the final norm always kept,
    the embedding enters the first layer un-normalized (Li, Yin, Liu, ICLR 2025,
    arXiv:2412.13795; code pixeli99/MixLN). At 2 layers and the default 0.25 no layer is
    post-LN: the stack is exactly pre-LN."""

    kind = "mix_ln"
    equation = "LN(x + F) if l < ⌊αL⌋, else x + F(LN(x))"
    note = "α = --mix-ln-fraction; a final LN after each stack"
    source = "Mix-LN, Li et al., ICLR 2025, arXiv:2412.13795"
    flags = (
        Flag("mix_ln_fraction", 0.25, check=float, metavar="A",
             help="mix_ln: the lowest int(A*L) layers of each stack (L its layers) are post-LN, the others "
             "pre-LN; 0 <= A <= 1 (default: 0.25, the Mix-LN paper's)"),
    )
    final_norm = True
    arch_family = "mix_ln"
    post: torch.jit.Final[bool]

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = spec.norm(dim)
        layer = spec.layer_index or 0
        self.post = layer < mix_ln_post_layers(spec.layers, spec.mix_ln_fraction)

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        if not 0.0 <= spec.mix_ln_fraction <= 1.0:
            raise ConnectionConfigError(
                f"--mix-ln-fraction {spec.mix_ln_fraction:g} is invalid: it must lie in [0, 1]")

    def prenorm(self, x: Tensor) -> Tensor:
        if self.post:
            return x
        return self.norm(x)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        if self.post:
            return self.norm(x + fx)
        return x + fx

    def extra_repr(self) -> str:
        return "post-LN" if self.post else "pre-LN"


@register_connection
class LNScalingConnection(PreLNConnection):
    """LayerNorm Scaling: pre-LN whose every pre-norm output in block ℓ (1-based, each stack
    by itself; self-attention, cross-attention and FFN alike) is scaled by ``1/√ℓ``; the
    residual add and the final norm are pre-LN's (Sun et al., "The Curse of Depth in
    LLMs", NeurIPS 2025, arXiv:2502.05795; code lmsdss/LayerNorm-Scaling)."""

    kind = "ln_scaling"
    equation = "x + F(LN(x)/√ℓ)"
    note = "pre-LN, ℓ the 1-based block index; a final LN after each stack"
    source = "LayerNorm Scaling, Sun et al., NeurIPS 2025, arXiv:2502.05795"
    arch_family = "ln_scaling"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.scale = 1.0 / math.sqrt((spec.layer_index or 0) + 1)

    def prenorm(self, x: Tensor) -> Tensor:
        return self.norm(x) * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}"


@register_connection
class HybridNormConnection(SublayerConnection):
    """HybridNorm (Zhuo et al., arXiv:2503.04598, NeurIPS 2025; code BryceZhuo/HybridNorm):
    every attention (self and cross) normalizes its Q, K and V per head and takes no input
    norm, ``y = x + Attn_QKV(x)``; the FFN takes its residual from its normalized input,
    ``y = Norm(x) + FFN(Norm(x))``; the final norm kept. ``--hybrid-norm-star`` (HybridNorm*)
    changes the first layer of each stack: its attentions read ``Norm(x)`` and its FFN is
    pre-LN's, ``y = x + FFN(Norm(x))``.

    The per-head norms live in the attention (the layer builds it,
    :func:`resnmt.connections.qkv_norm_attention.qkv_norm_attention`); the connection owns the
    input norm where there is one. The FFN's connection computes ``Norm(x)`` twice (once
    for the sublayer, once for the residual), as the interface gives it ``x``.
    """

    kind = "hybrid_norm"
    equation = "x + Attn_QKV(x); Norm(x) + FFN(Norm(x))"
    note = "Q, K, V normalized per head (self and cross); a final LN after each stack"
    source = "HybridNorm, Zhuo et al., NeurIPS 2025, arXiv:2503.04598"
    flags = (
        Flag("hybrid_norm_star", False, switch=True, owners_only=True,
             help="hybrid_norm: HybridNorm*, the first layer of each stack with pre-LN attention input "
             "and a pre-LN FFN (default: every layer alike)"),
    )
    final_norm = True
    arch_family = "hybrid_norm"
    qkv_normalized = True
    skip_normalized: torch.jit.Final[bool]

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        first = spec.hybrid_norm_star and (spec.layer_index or 0) == 0
        ffn = spec.sublayer in (None, "ffn")  # built for the side as a whole: the FFN's form
        self.skip_normalized = ffn and not first
        self.norm = spec.norm(dim) if first or ffn else None

    def prenorm(self, x: Tensor) -> Tensor:
        if self.norm is not None:
            return self.norm(x)
        return x

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        if self.skip_normalized:
            return self.norm(x) + fx
        return x + fx

    def extra_repr(self) -> str:
        return "Norm(x) + F(Norm(x))" if self.skip_normalized else "x + F(Norm(x))" if self.norm is not None else "x + F(x)"
