"""Encoder and decoder layers whose sublayer connections are chosen at construction.

The layers subclass fairseq's ``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase``
so attention, fc1/fc2, dropout and quant-noise are built exactly as fairseq builds them;
the parent's fixed LayerNorms are replaced by one connection module per sublayer:

    encoder layer: ``self_attn_connection``, ``ffn_connection``
    decoder layer: ``self_attn_connection``, ``encoder_attn_connection``, ``ffn_connection``

and the fc1 activation by ``ffn_activation`` (``activation(h, padding_mask)``). Every
sublayer of every kind runs the one protocol of :class:`~resnmt.connections.SublayerConnection`::

    branch_input, carry = connection.read(x)
    x = connection.write(x, dropout(sublayer(branch_input)), layer_input, carry)

written once per sublayer (:meth:`ConnectedSublayers.self_attention_sublayer`,
:meth:`~ConnectedSublayers.cross_attention_sublayer`, :meth:`~ConnectedSublayers.ffn_sublayer`,
shared by both layers): the layer does not know how many streams ``x`` holds (n for
Hyper-Connections) nor which connection reads its input (B2T's last). The attentions are
the kind's (:func:`~resnmt.connections.build_attention`: fairseq's, or HybridNorm's with
per-head normalized Q, K, V), built with fairseq's arguments. Each connection is built for
its layer and sublayer (``spec.at_sublayer(s)`` of the layer's spec); every choice is made
at construction (``torch.jit.Final`` attributes), so the layers script with
``torch.jit.script`` as fairseq's do.

Both layers return ``(x, extra, residual_sum)``: ``extra`` is the encoder's fc2 output
(with ``return_fc``) or the decoder's attention weights, ``residual_sum`` the sum of the
sublayers' ``dropout(F)`` when the stack's residual stream reads it (ResiDual), else None.

Checkpoints of fairseq's own ``transformer`` are upgraded on load by renaming
``self_attn_layer_norm`` -> ``self_attn_connection.norm`` and so on (see
``upgrade_state_dict_named``).
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from resnmt.activations.ffn import build_ffn_activation
from resnmt.activations.normalized import ActivationSpec
from resnmt.connections import (
    FFN_IN,
    FFN_OUT,
    KEY,
    OUTPUT,
    QUERY,
    VALUE,
    ConnectionSpec,
    build_attention,
    build_connection,
)

# fairseq's LayerNorm name -> our connection name, per sublayer
FAIRSEQ_NORM_NAMES = {
    "self_attn_layer_norm": "self_attn_connection",
    "encoder_attn_layer_norm": "encoder_attn_connection",
    "final_layer_norm": "ffn_connection",
}
# fairseq's LayerNorm name -> the sublayer (ConnectionSpec.at_sublayer)
SUBLAYER_OF = {"self_attn_layer_norm": "self_attn", "encoder_attn_layer_norm": "encoder_attn",
               "final_layer_norm": "ffn"}


@dataclass(frozen=True)
class LayerSpec:
    """Everything one layer is built from, besides fairseq's ``cfg``: its side's connection
    spec at the layer (``connection.layer_index``), the model's FFN activation spec, and
    whether the stack's stream reads the sum of the layer's sublayer outputs."""

    connection: ConnectionSpec
    activation: ActivationSpec
    collect_residual_sum: bool = False


class ConnectedSublayers:
    """What encoder and decoder layers share: each sublayer run through its connection,
    the FFN, and the checkpoint renaming. Mixed into the two fairseq layer classes, whose
    ``__init__`` is given the :class:`LayerSpec` as ``self.spec`` before fairseq's own runs
    (fairseq's ``__init__`` calls the attention factories, as fairseq's stacks set
    ``self.cfg`` before theirs)."""

    collects_residual_sum: torch.jit.Final[bool]  # the stack's stream reads the sum of the dropout(F)

    def _attention(self, fairseq_attention, embed_dim: int, num_heads: int, **kwargs):
        """The attention of this layer's kind (fairseq's own, ``fairseq_attention()``,
        unless the kind builds another), with fairseq's arguments."""
        return build_attention(self.spec.connection, fairseq_attention, embed_dim, num_heads,
                               q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size, **kwargs)

    def _replace_parent_norms(self, names: List[str], activation_fn: str) -> None:
        """Drop fairseq's fixed LayerNorms and the plain activation function; build one
        connection per sublayer and the FFN activation instead, and let each connection
        initialise the sublayer it wraps."""
        spec = self.spec.connection
        for fairseq_name in names:
            delattr(self, fairseq_name)
            connection = build_connection(self.embed_dim, spec.at_sublayer(SUBLAYER_OF[fairseq_name]))
            setattr(self, FAIRSEQ_NORM_NAMES[fairseq_name], connection)
        del self.activation_fn
        self.collects_residual_sum = self.spec.collect_residual_sum
        self.ffn_activation = build_ffn_activation(self.spec.activation, activation_fn, spec.side, spec.layer_index,
                                                   spec.layers)
        self._initialize_sublayers()

    def _initialize_sublayers(self) -> None:
        """Let each connection initialise the sublayer it wraps (DeepNorm scales the
        projections; the other kinds keep fairseq's init)."""
        self.ffn_connection.initialize_sublayer({FFN_IN: self.fc1, FFN_OUT: self.fc2})
        for attention, connection in self._attention_sublayers():
            connection.initialize_sublayer(
                {QUERY: attention.q_proj, KEY: attention.k_proj, VALUE: attention.v_proj, OUTPUT: attention.out_proj}
            )

    def _attention_sublayers(self):
        """(attention module, its connection) of each attention sublayer of the layer."""
        yield self.self_attn, self.self_attn_connection
        if getattr(self, "encoder_attn", None) is not None:
            yield self.encoder_attn, self.encoder_attn_connection

    def feed_forward(self, x: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """fc2(act_dropout(activation(fc1(x)))), before the output dropout."""
        h = self.ffn_activation(self.fc1(x), padding_mask)
        return self.fc2(self.activation_dropout_module(h))

    def self_attention_sublayer(self, x: Tensor, layer_input: Tensor, padding_mask: Optional[Tensor],
                                attn_mask: Optional[Tensor],
                                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]
                                ) -> Tuple[Tensor, Tensor]:
        """The self-attention sublayer behind its connection: ``(x after it, its dropout(F))``."""
        h, carry = self.self_attn_connection.read(x)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=padding_mask,
                              incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
        f = self.dropout_module(h)
        return self.self_attn_connection.write(x, f, layer_input, carry), f

    def ffn_sublayer(self, x: Tensor, layer_input: Tensor, padding_mask: Optional[Tensor]
                     ) -> Tuple[Tensor, Tensor, Tensor]:
        """The FFN sublayer behind its connection: ``(x after it, fc2's output, its dropout(F))``."""
        h, carry = self.ffn_connection.read(x)
        fc_result = self.feed_forward(h, padding_mask)
        f = self.dropout_module(fc_result)
        return self.ffn_connection.write(x, f, layer_input, carry), fc_result, f

    def residual_sum(self, sublayer_outputs: List[Tensor]) -> Optional[Tensor]:
        """The sum of the sublayers' dropout(F), in their order, where the stack's stream
        reads it (ResiDual), else None."""
        if not self.collects_residual_sum:
            return None
        total = sublayer_outputs[0]
        for f in sublayer_outputs[1:]:
            total = total + f
        return total

    def _upgrade_norm_names(self, state_dict: Dict[str, Tensor], name: str) -> None:
        """Rename fairseq's LayerNorm keys to ours, for connections that own one ``norm``."""
        for fairseq_name, ours in FAIRSEQ_NORM_NAMES.items():
            connection = getattr(self, ours, None)
            if getattr(connection, "norm", None) is None:
                continue
            for param in ("weight", "bias"):
                old = f"{name}.{fairseq_name}.{param}"
                if old in state_dict:
                    state_dict[f"{name}.{ours}.norm.{param}"] = state_dict.pop(old)


class ResidualEncoderLayer(ConnectedSublayers, TransformerEncoderLayerBase):
    """Encoder layer: self-attention and FFN, each behind its connection.

    Args:
        cfg: fairseq ``TransformerConfig``.
        spec: what the layer is built from (its connection spec, the FFN activation's).
        return_fc: also return the fc2 output (fairseq's ``return_fc``).
    """

    def __init__(self, cfg, spec: LayerSpec, return_fc: bool = False):
        self.spec = spec
        super().__init__(cfg, return_fc=return_fc)
        self._replace_parent_norms(["self_attn_layer_norm", "final_layer_norm"], cfg.activation_fn)

    def build_self_attention(self, embed_dim, cfg):
        return self._attention(lambda: super(ResidualEncoderLayer, self).build_self_attention(embed_dim, cfg),
                               embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout,
                               self_attention=True)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)  # fairseq's layer_norms.N renames
        self._upgrade_norm_names(state_dict, name)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None
                ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """
        Args:
            x: ``(seq_len, batch, embed_dim)`` (n streams: ``(seq_len, batch, n, embed_dim)``)
            encoder_padding_mask: ``(batch, seq_len)``, True at padding, or None
            attn_mask: ``(seq_len, seq_len)``, 1 where attention is forbidden, or None

        Returns:
            ``(x, fc2 output with return_fc or None, residual sum or None)``.
        """
        layer_input = x
        if attn_mask is not None:  # same masking values as fairseq
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)

        x, f_attn = self.self_attention_sublayer(x, layer_input, encoder_padding_mask, attn_mask, None)
        x, fc_result, f_ffn = self.ffn_sublayer(x, layer_input, encoder_padding_mask)
        return x, (fc_result if self.return_fc else None), self.residual_sum([f_attn, f_ffn])


class ResidualDecoderLayer(ConnectedSublayers, TransformerDecoderLayerBase):
    """Decoder layer: self-attention, encoder-decoder attention and FFN, each behind its
    connection. fairseq's NormFormer options (``--scale-attn`` etc.) and
    ``--cross-self-attention`` are rejected when the model's flags are resolved."""

    def __init__(
        self,
        cfg,
        spec: LayerSpec,
        no_encoder_attn: bool = False,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
    ):
        self.spec = spec
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        norms = ["self_attn_layer_norm", "final_layer_norm"]
        if self.encoder_attn is not None:
            norms.append("encoder_attn_layer_norm")
        else:
            del self.encoder_attn_layer_norm
            self.encoder_attn_connection = None
        self._replace_parent_norms(norms, cfg.activation_fn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return self._attention(
            lambda: super(ResidualDecoderLayer, self).build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn),
            embed_dim, cfg.decoder.attention_heads, dropout=cfg.attention_dropout, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn, self_attention=not cfg.cross_self_attention)

    def build_encoder_attention(self, embed_dim, cfg):
        return self._attention(lambda: super(ResidualDecoderLayer, self).build_encoder_attention(embed_dim, cfg),
                               embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim,
                               vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
                               encoder_decoder_attention=True)

    def upgrade_state_dict_named(self, state_dict, name):
        self._upgrade_norm_names(state_dict, name)

    def cross_attention_sublayer(self, x: Tensor, layer_input: Tensor, encoder_out: Tensor,
                                 encoder_padding_mask: Optional[Tensor],
                                 incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
                                 need_attn: bool, need_head_weights: bool
                                 ) -> Tuple[Tensor, Optional[Tensor], Tensor]:
        """The encoder-decoder attention behind its connection: ``(x after it, the attention
        weights where asked for (fairseq's rule) or None, its dropout(F))``."""
        h, carry = self.encoder_attn_connection.read(x)
        h, attn = self.encoder_attn(
            query=h,
            key=encoder_out,
            value=encoder_out,
            key_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state,
            static_kv=True,
            need_weights=need_attn or (not self.training and self.need_attn),
            need_head_weights=need_head_weights,
        )
        f = self.dropout_module(h)
        return self.encoder_attn_connection.write(x, f, layer_input, carry), attn, f

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """
        Args:
            x: ``(tgt_len, batch, embed_dim)`` (n streams: ``(tgt_len, batch, n, embed_dim)``);
                one step (tgt_len = 1) in incremental decoding
            encoder_out: ``(src_len, batch, embed_dim)``
            encoder_padding_mask: ``(batch, src_len)``, True at padding
            incremental_state: fairseq's per-layer key/value cache
            self_attn_mask: causal mask ``(tgt_len, tgt_len)``
            self_attn_padding_mask: ``(batch, tgt_len)``, True at padding
            need_attn, need_head_weights: return the cross-attention's weights (averaged
                over the heads, or per head); in eval mode fairseq's ``need_attn`` of
                ``make_generation_fast_`` asks for them too

        Returns:
            ``(x, attention weights or None, residual sum or None)``.
        """
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("resnmt decoder layers do not take prev_*_attn_state; use incremental_state")
        if need_head_weights:
            need_attn = True
        layer_input = x

        x, f_self = self.self_attention_sublayer(x, layer_input, self_attn_padding_mask, self_attn_mask,
                                                 incremental_state)
        sublayer_outputs = [f_self]
        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and self.encoder_attn_connection is not None and encoder_out is not None:
            x, attn, f_cross = self.cross_attention_sublayer(x, layer_input, encoder_out, encoder_padding_mask,
                                                             incremental_state, need_attn, need_head_weights)
            sublayer_outputs.append(f_cross)
        x, _, f_ffn = self.ffn_sublayer(x, layer_input, self_attn_padding_mask)
        sublayer_outputs.append(f_ffn)
        return x, attn, self.residual_sum(sublayer_outputs)
