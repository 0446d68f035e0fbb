"""``--fast-path``'s attention: every attention sublayer of a training step through torch's
``scaled_dot_product_attention`` (SDPA), with the call pattern its fastest kernels take.

fairseq's ``MultiheadAttention`` trains through torch's ``multi_head_attention_forward``,
which turns every mask it is given into a floating-point one (FlashAttention takes none),
and its encoder-decoder attention (``static_kv``) skips that function for batched matrix
products and a float32 softmax. :func:`use_sdpa_attention` gives each attention module of
a model a forward that, while the module trains and nothing asks for the attention weights
or an incremental state, computes

    out_proj(SDPA(q_proj(query), k_proj(key), v_proj(value), mask, dropout, is_causal))

with the heads split as fairseq splits them (SDPA's scale ``1/sqrt(head dim)`` is fairseq's
``scaling``, applied after ``q_proj``, so HybridNorm's normalized projections keep their
order) and:

* the decoder's self-attention ``is_causal=True`` with no mask: the decoder passes its
  causal mask exactly when it attends causally, and right-padded targets (fairseq's
  default, ``--left-pad-target False``) put every padding key after every real query, so
  the causal mask alone hides padding from every real position. Padding positions' own
  outputs then differ from fairseq's, and nothing reads them: the loss ignores padding
  targets and every later attention hides padding keys. With left-padded targets the
  causal and padding masks are joined into one boolean mask instead;
* the encoder's self-attention and the encoder-decoder attention with the key-padding mask
  only, as a boolean mask (True: attend) broadcast over heads and queries;
* no attention weights: SDPA returns none.

Everything else (evaluation, decoding with its incremental state, a caller asking for the
weights, ``--add-bias-kv``/``--add-zero-attn``, an extra ``attn_mask`` on a non-causal
attention) runs fairseq's forward, unchanged. The function is fairseq's to rounding
(tests/test_fast_attention.py states the tolerance); attention dropout draws its own mask
inside SDPA, as torch's path does for self-attention already.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from resnmt.fairseq_patches import Replacement


def sdpa_attention(attention, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor],
                   causal: bool, extra_mask: Optional[Tensor] = None) -> Tensor:
    """fairseq ``MultiheadAttention`` ``attention``'s output for ``query`` ``(T, B, C)`` and
    ``key``/``value`` ``(S, B, C)``, through SDPA (module docstring). ``key_padding_mask``
    ``(B, S)``: True at padding. ``extra_mask``: a boolean ``(T, S)`` mask (True: attend)
    joined with the padding mask (left-padded causal attention)."""
    tgt_len, bsz, embed_dim = query.shape
    heads, head_dim = attention.num_heads, attention.head_dim

    def split(x: Tensor) -> Tensor:  # (L, B, H * D) -> (B, H, L, D)
        return x.view(x.size(0), bsz, heads, head_dim).permute(1, 2, 0, 3)

    mask = None
    if key_padding_mask is not None:
        mask = key_padding_mask.view(bsz, 1, 1, -1).logical_not()
        if extra_mask is not None:
            mask = mask & extra_mask
    dropout = attention.dropout_module.p if attention.training else 0.0
    out = F.scaled_dot_product_attention(split(attention.q_proj(query)), split(attention.k_proj(key)),
                                         split(attention.v_proj(value)), attn_mask=mask, dropout_p=dropout,
                                         is_causal=causal and mask is None)
    return attention.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))


class SDPAForward(Replacement):
    """An attention module's forward: :func:`sdpa_attention` while it trains and nothing asks
    for weights or an incremental state, else fairseq's (module docstring). ``causal``: the
    decoder's self-attention; ``right_padded``: its targets are right-padded."""

    method = "forward"

    def __init__(self, attention, causal: bool, right_padded: bool = True):
        super().__init__(attention)
        self.attention = attention
        self.causal, self.right_padded = causal, right_padded
        self.calls = 0  # the calls that took SDPA

    def takes_sdpa(self, incremental_state, need_weights: bool, before_softmax: bool, attn_mask) -> bool:
        a = self.attention
        return (a.training and incremental_state is None and not need_weights and not before_softmax
                and a.bias_k is None and not a.add_zero_attn and (attn_mask is None or self.causal))

    def __call__(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                 static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        if not self.takes_sdpa(incremental_state, need_weights or need_head_weights, before_softmax, attn_mask):
            return self.eager(query, key, value, key_padding_mask=key_padding_mask,
                              incremental_state=incremental_state, need_weights=need_weights, static_kv=static_kv,
                              attn_mask=attn_mask, before_softmax=before_softmax,
                              need_head_weights=need_head_weights)
        if not torch.compiler.is_compiling():  # a Python counter read while compiling would be guarded on
            self.calls += 1
        causal = self.causal and attn_mask is not None  # the decoder passes its causal mask when it attends causally
        if causal and (self.right_padded or key_padding_mask is None):
            return sdpa_attention(self.attention, query, key, value, None, causal=True), None
        extra = None
        if causal:  # left-padded targets: causal and padding masks joined
            extra = torch.ones(query.size(0), key.size(0), dtype=torch.bool, device=query.device).tril()
        return sdpa_attention(self.attention, query, key, value, key_padding_mask, causal=False,
                              extra_mask=extra), None


def attention_modules(model):
    """``(attention module, whether it is a decoder self-attention)`` of every layer."""
    for side, causal_name in (("encoder", None), ("decoder", "self_attn")):
        for layer in getattr(getattr(model, side, None), "layers", None) or []:
            for name in ("self_attn", "encoder_attn"):
                attention = getattr(layer, name, None)
                if attention is not None:
                    yield attention, name == causal_name


def use_sdpa_attention(model, right_padded_targets: bool = True) -> int:
    """Give every attention module of ``model``'s layers the SDPA forward (module
    docstring); returns how many. Calling it again changes nothing."""
    count = 0
    for attention, causal in attention_modules(model):
        SDPAForward.put_on(attention, causal, right_padded_targets)
        count += 1
    return count


def sdpa_calls(model) -> int:
    """How many attention calls took SDPA so far."""
    return sum(sdpa.calls for sdpa in (SDPAForward.on(a) for a, _ in attention_modules(model)) if sdpa)
