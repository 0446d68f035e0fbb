"""Kinds that place the normalization by depth or by sublayer (2025): Mix-LN (post-LN in
the lowest layers, pre-LN above), LayerNorm Scaling (pre-LN scaled by 1/√ℓ) and
HybridNorm (normalized Q, K, V; the FFN's residual from its normalized input).

Each reads the layer (``spec.layer_index``) or the sublayer (``spec.sublayer``) it is
built for; none carries anything across layers.

HybridNorm's attention (:func:`qkv_norm_attention`, built by the kind's ``build_attention``
for every attention of its layers): Zhuo et al., arXiv 2503.04598, Eq. 5:

    attn_QKV(Q, K, V) = softmax(Norm(Q) Norm(K)ᵀ / √d_head) Norm(V)

with ``Q = X W_Q + b_Q`` and so on, and each ``Norm`` of size d_head (affine), applied to
every head's slice of the projection (the authors' code: ``use_{query,key,value}_norm``;
one norm per Q, K, V, shared by the heads). The norm is the stack's ``--normalization``
(LayerNorm as in the paper, RMSNorm or DyT). The paper has no cross-attention; here it is
normalized in the same way (our choice). The attention is fairseq's
``MultiheadAttention`` whose ``q_proj``, ``k_proj``, ``v_proj`` are :class:`HeadNormedLinear`:
the same ``nn.Linear`` (same weights, fairseq's init, same state-dict keys
``q_proj.weight``/``q_proj.bias``), followed by the norm (``q_proj.norm.*``). fairseq's
forward therefore computes everything else as before, including the incremental state: the
keys and values it caches, for self-attention and for cross-attention's ``static_kv``, are
the projections' outputs, i.e. the normalized ones. The 1/√d_head scaling comes after the
norm (fairseq scales ``q_proj``'s output).
"""
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

from resnmt.connections.base import SublayerConnection
from resnmt.connections.classic import PreLNConnection
from resnmt.connections.norms import DEFAULT_DYT_ALPHA, DEFAULT_NORMALIZATION, build_norm
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, register_connection
from resnmt.options import Option


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
        Option("mix_ln_fraction", 0.25, kind="number", metavar="A",
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

    The per-head norms live in the attention (:meth:`build_attention`,
    :func:`qkv_norm_attention`); the connection owns the input norm where there is one. The FFN's connection computes ``Norm(x)`` twice (once
    for the sublayer, once for the residual), as the interface gives it ``x``.
    """

    kind = "hybrid_norm"
    equation = "x + Attn_QKV(x); Norm(x) + FFN(Norm(x))"
    note = "Q, K, V normalized per head (self and cross); a final LN after each stack"
    source = "HybridNorm, Zhuo et al., NeurIPS 2025, arXiv:2503.04598"
    flags = (
        Option("hybrid_norm_star", False, kind="switch", owners_only=True,
               help="hybrid_norm: HybridNorm*, the first layer of each stack with pre-LN attention input "
               "and a pre-LN FFN (default: every layer alike)"),
    )
    final_norm = True
    arch_family = "hybrid_norm"
    skip_normalized: torch.jit.Final[bool]

    @classmethod
    def build_attention(cls, spec: ConnectionSpec, fairseq_attention: Callable[[], nn.Module], embed_dim: int,
                        num_heads: int, **kwargs) -> nn.Module:
        """Every attention of the layer (self and cross) with per-head normalized Q, K, V,
        built with fairseq's arguments (:func:`qkv_norm_attention`)."""
        if kwargs.pop("add_bias_kv", False) or kwargs.pop("add_zero_attn", False):
            raise ValueError(f"--residual {spec.kind}: --add-bias-kv/--add-zero-attn are not supported")
        return qkv_norm_attention(embed_dim, num_heads, normalization=spec.normalization,
                                  dyt_alpha_init=spec.dyt_alpha_init, export=spec.export, **kwargs)

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


# ---------------------------------------------------------------------------- HybridNorm's attention


class HeadNormedLinear(nn.Linear):
    """``norm(x Wᵀ + b)`` with ``norm`` of size ``out_features / num_heads`` applied to each
    head's slice: (..., in_features) -> (..., out_features)."""

    def __init__(self, in_features: int, out_features: int, num_heads: int, norm: nn.Module, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        if out_features % num_heads:
            raise ValueError(f"out_features {out_features} is not a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = out_features // num_heads
        self.norm = norm

    @classmethod
    def from_linear(cls, linear: nn.Linear, num_heads: int, norm: nn.Module) -> "HeadNormedLinear":
        """The same parameters as ``linear`` (shared, not copied), then the norm."""
        module = cls(linear.in_features, linear.out_features, num_heads, norm, bias=linear.bias is not None)
        module.weight = linear.weight
        module.bias = linear.bias
        return module

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        return self.norm(y.reshape(-1, self.num_heads, self.head_dim)).reshape(y.shape)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_heads={self.num_heads}"


def qkv_norm_attention(embed_dim: int, num_heads: int, kdim: Optional[int] = None, vdim: Optional[int] = None,
                       dropout: float = 0.0, bias: bool = True, self_attention: bool = False,
                       encoder_decoder_attention: bool = False, q_noise: float = 0.0, qn_block_size: int = 8, *,
                       normalization: str = DEFAULT_NORMALIZATION, dyt_alpha_init: float = DEFAULT_DYT_ALPHA,
                       export: bool = False) -> MultiheadAttention:
    """fairseq's ``MultiheadAttention`` (same arguments, same forward and incremental state)
    with per-head normalized Q, K, V. ``normalization``/``dyt_alpha_init``/``export``: passed to
    :func:`~resnmt.connections.norms.build_norm` for the three norms of size d_head.

    Input and output as fairseq's: query (T, B, C), key/value (S, B, kdim/vdim) or None ->
    (T, B, C) and the attention weights.

    A factory, not a subclass: TorchScript compiles fairseq's forward (which names
    ``MultiheadAttention`` for a static method) only for that class itself.
    """
    # no add_bias_kv/add_zero_attn: their extra key/value rows would join the cache unnormalized
    attention = MultiheadAttention(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, bias=bias,
                                   self_attention=self_attention, encoder_decoder_attention=encoder_decoder_attention,
                                   q_noise=0.0, qn_block_size=qn_block_size)
    for name in ("q_proj", "k_proj", "v_proj"):
        norm = build_norm(attention.head_dim, normalization, export=export, dyt_alpha_init=dyt_alpha_init)
        projection = HeadNormedLinear.from_linear(getattr(attention, name), num_heads, norm)
        setattr(attention, name, quant_noise(projection, q_noise, qn_block_size))
    attention.out_proj = quant_noise(attention.out_proj, q_noise, qn_block_size)
    # fairseq's fast path (torch's fused multi_head_attention_forward) reads the projection
    # weights directly and would skip the norms; this flag is the one condition of that path
    # a module may set (it also skips an embed-dim assertion).
    attention.skip_embed_dim_check = True
    return attention


def has_qkv_norm(attention: nn.Module) -> bool:
    """Whether ``attention`` was built by :func:`qkv_norm_attention`."""
    return isinstance(getattr(attention, "q_proj", None), HeadNormedLinear)
