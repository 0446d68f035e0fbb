"""HybridNorm's attention: queries, keys and values normalized per head.

Zhuo et al., "HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid
Normalization", arXiv 2503.04598 (NeurIPS 2025), Eq. 5:

    attn_QKV(Q, K, V) = softmax(Norm(Q) Norm(K)ᵀ / √d_head) Norm(V)

with ``Q = X W_Q + b_Q`` and so on, and each ``Norm`` of size d_head (affine), applied to every
head's slice of the projection (the authors' code: ``use_{query,key,value}_norm``; one norm
per Q, K, V, shared by the heads). The norm is the stack's ``--normalization``
(:func:`resnmt.connections.norms.build_norm`): LayerNorm as in the paper, RMSNorm or DyT.
The paper has no cross-attention; here it is normalized in the same way (methods.md: [X]).

:func:`qkv_norm_attention` builds fairseq's ``MultiheadAttention`` whose ``q_proj``,
``k_proj``, ``v_proj`` are :class:`HeadNormedLinear`: the same ``nn.Linear`` (same weights,
fairseq's init, same state-dict keys ``q_proj.weight``/``q_proj.bias``), followed by the
norm (``q_proj.norm.*``). fairseq's forward therefore computes everything else as before,
including the incremental state: the keys and values it caches, for self-attention and
for cross-attention's ``static_kv``, are the projections' outputs, i.e. the normalized
ones. The 1/√d_head scaling comes after the norm (fairseq scales ``q_proj``'s output).
"""
from typing import Optional

import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

from resnmt.connections.norms import DEFAULT_DYT_ALPHA, DEFAULT_NORMALIZATION, build_norm


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
    :func:`resnmt.connections.norms.build_norm` for the three norms of size d_head.

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
