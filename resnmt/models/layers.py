"""Encoder and decoder layers whose sublayer connections are chosen at construction.

The layers subclass fairseq's ``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase``
so attention, fc1/fc2, dropout and quant-noise are built exactly as fairseq builds them;
the parent's fixed LayerNorms are replaced by one connection module per sublayer:

    encoder layer: ``self_attn_connection``, ``ffn_connection``
    decoder layer: ``self_attn_connection``, ``encoder_attn_connection``, ``ffn_connection``

and the fc1 activation by ``ffn_activation`` (``activation(h, padding_mask)``). Each
sublayer runs as ``connection(x, dropout(sublayer(connection.prenorm(x))))``
(``self_attention_sublayer`` and ``ffn_sublayer``, shared by both layers; the decoder's
cross-attention in its ``forward``); every choice is made at construction (``torch.jit.Final`` attributes), so
the layers script with ``torch.jit.script`` as fairseq's do.

Kinds with n residual streams (``multi_stream``: hyper, mhc) get ``x`` as the streams
(T, B, n, C) and run each sublayer as ``h, mixed, write = connection.width(x)``,
``x = connection.depth(dropout(sublayer(connection.prenorm(h))), mixed, write)``; kinds
with ``qkv_normalized`` (hybrid_norm) get attentions with per-head normalized Q, K, V
(:func:`resnmt.connections.qkv_norm_attention.qkv_norm_attention`, built with fairseq's
arguments). Each connection is built for its layer and sublayer
(``spec.at_layer(l).at_sublayer(s)``).

Both layers return ``(x, extra, residual_sum)``: ``extra`` is the encoder's fc2 output
(with ``return_fc``) or the decoder's attention weights, ``residual_sum`` the sum of the
sublayers' ``dropout(F)`` when the stack's residual stream reads it (ResiDual), else None.

Checkpoints of fairseq's own ``transformer`` are upgraded on load by renaming
``self_attn_layer_norm`` -> ``self_attn_connection.norm`` and so on (see
``upgrade_state_dict_named``).
"""
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from resnmt.connections import (
    CONNECTION_CLASSES,
    FFN_IN,
    FFN_OUT,
    KEY,
    OUTPUT,
    QUERY,
    VALUE,
    ConnectionSpec,
    build_connection,
)
from resnmt.connections.qkv_norm_attention import qkv_norm_attention

# fairseq's LayerNorm name -> our connection name, per sublayer
FAIRSEQ_NORM_NAMES = {
    "self_attn_layer_norm": "self_attn_connection",
    "encoder_attn_layer_norm": "encoder_attn_connection",
    "final_layer_norm": "ffn_connection",
}
# fairseq's LayerNorm name -> the sublayer (ConnectionSpec.at_sublayer)
SUBLAYER_OF = {"self_attn_layer_norm": "self_attn", "encoder_attn_layer_norm": "encoder_attn",
               "final_layer_norm": "ffn"}


class ConnectedSublayers:
    """What encoder and decoder layers share: running a sublayer through its connection,
    the FFN, and the checkpoint renaming. Mixed into the two fairseq layer classes."""

    last_reads_layer_input: torch.jit.Final[bool]  # B2T: the FFN's connection also reads the layer's input
    collects_residual_sum: torch.jit.Final[bool]  # the stack's stream reads the sum of the dropout(F)
    multi_stream: torch.jit.Final[bool]  # x is n streams (T, B, n, C); each connection's width/depth (HC, mHC)

    def _keep_spec(self, spec: ConnectionSpec) -> None:
        """Before fairseq's ``__init__``: the spec its attention factories read (a plain
        attribute, before nn.Module exists; dropped by :meth:`_replace_parent_norms`)."""
        object.__setattr__(self, "_pending_spec", spec)

    def _attention(self, fairseq_build, embed_dim: int, num_heads: int, **kwargs):
        """The attention of this layer's kind: fairseq's, or with per-head normalized Q, K,
        V (HybridNorm: ``qkv_normalized``), built with the same arguments."""
        spec = self.__dict__["_pending_spec"]
        if not CONNECTION_CLASSES[spec.kind].qkv_normalized:
            return fairseq_build()
        if kwargs.pop("add_bias_kv", False) or kwargs.pop("add_zero_attn", False):
            raise ValueError(f"--residual {spec.kind}: --add-bias-kv/--add-zero-attn are not supported")
        return qkv_norm_attention(embed_dim, num_heads, q_noise=self.quant_noise,
                                  qn_block_size=self.quant_noise_block_size, normalization=spec.normalization,
                                  dyt_alpha_init=spec.dyt_alpha_init, export=spec.export, **kwargs)

    def _replace_parent_norms(self, spec: ConnectionSpec, names: List[str], collect_residual_sum: bool) -> None:
        """Drop fairseq's fixed LayerNorms and the plain activation function; build one
        connection per sublayer instead, and settle what ``forward`` computes."""
        for fairseq_name in names:
            delattr(self, fairseq_name)
            connection = build_connection(self.embed_dim, spec.at_sublayer(SUBLAYER_OF[fairseq_name]))
            setattr(self, FAIRSEQ_NORM_NAMES[fairseq_name], connection)
        del self.activation_fn
        self.__dict__.pop("_pending_spec", None)
        self.last_reads_layer_input = self.ffn_connection.reads_layer_input
        self.collects_residual_sum = collect_residual_sum
        self.multi_stream = self.ffn_connection.multi_stream

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

    def self_attention_sublayer(self, x: Tensor, padding_mask: Optional[Tensor], attn_mask: Optional[Tensor],
                                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]
                                ) -> Tuple[Tensor, Tensor]:
        """The self-attention sublayer behind its connection: ``(x after it, its dropout(F))``."""
        h, mixed, write = x, x, x
        if self.multi_stream:
            h, mixed, write = self.self_attn_connection.width(x)
        h = self.self_attn_connection.prenorm(h)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=padding_mask,
                              incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
        f = self.dropout_module(h)
        if self.multi_stream:
            return self.self_attn_connection.depth(f, mixed, write), f
        return self.self_attn_connection(x, f), f

    def ffn_sublayer(self, x: Tensor, layer_input: Tensor, padding_mask: Optional[Tensor]
                     ) -> Tuple[Tensor, Tensor, Tensor]:
        """The FFN sublayer behind its connection: ``(x after it, fc2's output, its dropout(F))``;
        ``layer_input`` is read by connections that reach back to the layer's input (B2T)."""
        h, mixed, write = x, x, x
        if self.multi_stream:
            h, mixed, write = self.ffn_connection.width(x)
        fc_result = self.feed_forward(self.ffn_connection.prenorm(h), padding_mask)
        f = self.dropout_module(fc_result)
        if self.multi_stream:
            return self.ffn_connection.depth(f, mixed, write), fc_result, f
        if self.last_reads_layer_input:
            return self.ffn_connection(x, f, layer_input), fc_result, f
        return self.ffn_connection(x, f), fc_result, f

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
        connection: the encoder side's connection spec, for this layer.
        ffn_activation: the module between fc1 and fc2.
        return_fc: also return the fc2 output (fairseq's ``return_fc``).
        collect_residual_sum: also return the sum of the sublayers' dropout(F).
    """

    def __init__(self, cfg, connection: ConnectionSpec, ffn_activation: nn.Module, return_fc: bool = False,
                 collect_residual_sum: bool = False):
        self._keep_spec(connection)
        super().__init__(cfg, return_fc=return_fc)
        self._replace_parent_norms(connection, ["self_attn_layer_norm", "final_layer_norm"], collect_residual_sum)
        self.ffn_activation = ffn_activation
        self._initialize_sublayers()

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
            x: ``(seq_len, batch, embed_dim)``
            encoder_padding_mask: ``(batch, seq_len)``, True at padding, or None
            attn_mask: ``(seq_len, seq_len)``, 1 where attention is forbidden, or None

        Returns:
            ``(x, fc2 output with return_fc or None, residual sum or None)``.
        """
        layer_input = x
        if attn_mask is not None:  # same masking values as fairseq
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)

        x, f_attn = self.self_attention_sublayer(x, encoder_padding_mask, attn_mask, None)
        x, fc_result, f_ffn = self.ffn_sublayer(x, layer_input, encoder_padding_mask)

        residual_sum: Optional[Tensor] = None
        if self.collects_residual_sum:
            residual_sum = f_attn + f_ffn
        return x, (fc_result if self.return_fc else None), residual_sum


class ResidualDecoderLayer(ConnectedSublayers, TransformerDecoderLayerBase):
    """Decoder layer: self-attention, encoder-decoder attention and FFN, each behind its
    connection. fairseq's NormFormer options (``--scale-attn`` etc.) and
    ``--cross-self-attention`` are rejected when the model's flags are resolved."""

    def __init__(
        self,
        cfg,
        connection: ConnectionSpec,
        ffn_activation: nn.Module,
        no_encoder_attn: bool = False,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        collect_residual_sum: bool = False,
    ):
        self._keep_spec(connection)
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        norms = ["self_attn_layer_norm", "final_layer_norm"]
        if self.encoder_attn is not None:
            norms.append("encoder_attn_layer_norm")
        else:
            del self.encoder_attn_layer_norm
            self.encoder_attn_connection = None
        self._replace_parent_norms(connection, norms, collect_residual_sum)
        self.ffn_activation = ffn_activation
        self._initialize_sublayers()

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
            x: ``(tgt_len, batch, embed_dim)``; one step (tgt_len = 1) in incremental decoding
            encoder_out: ``(src_len, batch, embed_dim)``
            encoder_padding_mask: ``(batch, src_len)``, True at padding
            incremental_state: fairseq's per-layer key/value cache
            self_attn_mask: causal mask ``(tgt_len, tgt_len)``
            self_attn_padding_mask: ``(batch, tgt_len)``, True at padding

        Returns:
            ``(x, attention weights or None, residual sum or None)``.
        """
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("resnmt decoder layers do not take prev_*_attn_state; use incremental_state")
        if need_head_weights:
            need_attn = True
        layer_input = x

        x, f_self = self.self_attention_sublayer(x, self_attn_padding_mask, self_attn_mask, incremental_state)
        residual_sum: Optional[Tensor] = None
        if self.collects_residual_sum:
            residual_sum = f_self

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and self.encoder_attn_connection is not None and encoder_out is not None:
            h = x
            if self.multi_stream:
                h, mixed, write = self.encoder_attn_connection.width(x)
            h = self.encoder_attn_connection.prenorm(h)
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
            f_cross = self.dropout_module(h)
            if self.multi_stream:
                x = self.encoder_attn_connection.depth(f_cross, mixed, write)
            else:
                x = self.encoder_attn_connection(x, f_cross)
            if residual_sum is not None:
                residual_sum = residual_sum + f_cross

        x, _, f_ffn = self.ffn_sublayer(x, layer_input, self_attn_padding_mask)
        if residual_sum is not None:
            residual_sum = residual_sum + f_ffn
        return x, attn, residual_sum
