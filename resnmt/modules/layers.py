"""Encoder and decoder layers whose sublayer connections are chosen at construction.

The layers subclass fairseq's ``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase``
so attention, fc1/fc2, dropout and quant-noise are built exactly as fairseq builds them;
the parent's fixed LayerNorms are replaced by one connection module per sublayer:

    encoder layer: ``self_attn_connection``, ``ffn_connection``
    decoder layer: ``self_attn_connection``, ``encoder_attn_connection``, ``ffn_connection``

and the fc1 activation by ``ffn_activation`` (``activation(h, padding_mask)``).
Checkpoints of fairseq's own ``transformer`` are upgraded on load by renaming
``self_attn_layer_norm`` -> ``self_attn_connection.norm`` and so on (see
``upgrade_state_dict_named``).
"""
from typing import Callable, Dict, List, Optional

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from resnmt.modules.connections import (
    FFN_IN,
    FFN_OUT,
    KEY,
    OUTPUT,
    QUERY,
    VALUE,
    ConnectionSpec,
    SublayerConnection,
    build_connection,
)

# fairseq's LayerNorm name -> our connection name, per sublayer
FAIRSEQ_NORM_NAMES = {
    "self_attn_layer_norm": "self_attn_connection",
    "encoder_attn_layer_norm": "encoder_attn_connection",
    "final_layer_norm": "ffn_connection",
}


class ConnectedSublayers:
    """What encoder and decoder layers share: running a sublayer through its connection,
    the FFN, and the checkpoint renaming. Mixed into the two fairseq layer classes."""

    dropout_module: nn.Module
    activation_dropout_module: nn.Module
    fc1: nn.Module
    fc2: nn.Module
    ffn_activation: nn.Module
    ffn_connection: SublayerConnection

    def _replace_parent_norms(self, spec: ConnectionSpec, names: List[str]) -> None:
        """Drop fairseq's fixed LayerNorms and the plain activation function; build one
        connection per sublayer instead."""
        for fairseq_name in names:
            delattr(self, fairseq_name)
            setattr(self, FAIRSEQ_NORM_NAMES[fairseq_name], build_connection(self.embed_dim, spec))
        del self.activation_fn
        self.normalize_before = spec.has_final_norm  # informational; forward never reads it

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

    def connect(self, connection: SublayerConnection, x: Tensor, sublayer: Callable[[Tensor], Tensor],
                outputs: Optional[List[Tensor]] = None, layer_input: Optional[Tensor] = None) -> Tensor:
        """``connection(x, dropout(sublayer(connection.prenorm(x))))``; the dropout(F) is
        appended to ``outputs`` when given (a residual stream reads them), and the layer's
        input is passed on to a connection that reads it (B2T's last one)."""
        fx = self.dropout_module(sublayer(connection.prenorm(x)))
        if outputs is not None:
            outputs.append(fx)
        if layer_input is not None and connection.reads_layer_input:
            return connection(x, fx, layer_input)
        return connection(x, fx)

    @staticmethod
    def residual_sum(outputs: List[Tensor]) -> Tensor:
        """The sum of a layer's sublayer outputs dropout(F), for a residual stream."""
        total = outputs[0]
        for fx in outputs[1:]:
            total = total + fx
        return total

    def feed_forward(self, x: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """fc2(act_dropout(activation(fc1(x)))), before the output dropout."""
        h = self.ffn_activation(self.fc1(x), padding_mask)
        return self.fc2(self.activation_dropout_module(h))

    def _upgrade_norm_names(self, state_dict: Dict[str, Tensor], name: str) -> None:
        """Rename fairseq's LayerNorm keys to ours, for connections that own one ``norm``."""
        for fairseq_name, ours in FAIRSEQ_NORM_NAMES.items():
            connection = getattr(self, ours, None)
            if connection is None or not hasattr(connection, "norm"):
                continue
            for param in ("weight", "bias"):
                old = f"{name}.{fairseq_name}.{param}"
                if old in state_dict:
                    state_dict[f"{name}.{ours}.norm.{param}"] = state_dict.pop(old)


class ResidualEncoderLayer(ConnectedSublayers, TransformerEncoderLayerBase):
    """Encoder layer: self-attention and FFN, each behind its connection.

    Args:
        cfg: fairseq ``TransformerConfig``.
        connection: the encoder side's connection spec.
        ffn_activation: the module between fc1 and fc2.
    """

    def __init__(self, cfg, connection: ConnectionSpec, ffn_activation: nn.Module, return_fc: bool = False):
        super().__init__(cfg, return_fc=return_fc)
        self._replace_parent_norms(connection, ["self_attn_layer_norm", "final_layer_norm"])
        self.ffn_activation = ffn_activation
        self._initialize_sublayers()

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)  # fairseq's layer_norms.N renames
        self._upgrade_norm_names(state_dict, name)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None,
                return_residual_sum: bool = False):
        """
        Args:
            x: ``(seq_len, batch, embed_dim)``
            encoder_padding_mask: ``(batch, seq_len)``, True at padding, or None
            attn_mask: ``(seq_len, seq_len)``, 1 where attention is forbidden, or None
            return_residual_sum: also return the sum of the sublayers' dropout(F)
                (for a residual stream, :mod:`resnmt.modules.streams`)

        Returns:
            ``(seq_len, batch, embed_dim)``; with ``return_fc`` also the fc2 output; with
            ``return_residual_sum`` always ``(x, fc2 output or None, residual sum)``.
        """
        layer_input = x
        outputs: Optional[List[Tensor]] = [] if return_residual_sum else None
        if attn_mask is not None:  # same masking values as fairseq
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)

        def self_attention(h: Tensor) -> Tensor:
            return self.self_attn(
                query=h, key=h, value=h, key_padding_mask=encoder_padding_mask, need_weights=False, attn_mask=attn_mask
            )[0]

        x = self.connect(self.self_attn_connection, x, self_attention, outputs)

        fc_result: List[Tensor] = []

        def ffn(h: Tensor) -> Tensor:
            out = self.feed_forward(h, encoder_padding_mask)
            fc_result.append(out)
            return out

        x = self.connect(self.ffn_connection, x, ffn, outputs, layer_input)
        if outputs is not None:
            return x, (fc_result[0] if self.return_fc else None), self.residual_sum(outputs)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result[0]
        return x


class ResidualDecoderLayer(ConnectedSublayers, TransformerDecoderLayerBase):
    """Decoder layer: self-attention, encoder-decoder attention and FFN, each behind its
    connection. fairseq's NormFormer options (``--scale-attn`` etc.) and
    ``--cross-self-attention`` are rejected at model build."""

    def __init__(
        self,
        cfg,
        connection: ConnectionSpec,
        ffn_activation: nn.Module,
        no_encoder_attn: bool = False,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
    ):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        norms = ["self_attn_layer_norm", "final_layer_norm"]
        if self.encoder_attn is not None:
            norms.append("encoder_attn_layer_norm")
        else:
            del self.encoder_attn_layer_norm
        self._replace_parent_norms(connection, norms)
        self.ffn_activation = ffn_activation
        self._initialize_sublayers()

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
        return_residual_sum: bool = False,
    ):
        """
        Args:
            x: ``(tgt_len, batch, embed_dim)``; one step (tgt_len = 1) in incremental decoding
            encoder_out: ``(src_len, batch, embed_dim)``
            encoder_padding_mask: ``(batch, src_len)``, True at padding
            incremental_state: fairseq's per-layer key/value cache
            self_attn_mask: causal mask ``(tgt_len, tgt_len)``
            self_attn_padding_mask: ``(batch, tgt_len)``, True at padding
            return_residual_sum: return the sum of the sublayers' dropout(F) in place of
                the ``None`` (for a residual stream, :mod:`resnmt.modules.streams`)

        Returns:
            ``(x, attn, None)`` as fairseq's decoder layer (``None``: the residual sum
            with ``return_residual_sum``).
        """
        layer_input = x
        outputs: Optional[List[Tensor]] = [] if return_residual_sum else None
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("resnmt decoder layers do not take prev_*_attn_state; use incremental_state")
        if need_head_weights:
            need_attn = True

        def self_attention(h: Tensor) -> Tensor:
            return self.self_attn(
                query=h,
                key=h,
                value=h,
                key_padding_mask=self_attn_padding_mask,
                incremental_state=incremental_state,
                need_weights=False,
                attn_mask=self_attn_mask,
            )[0]

        x = self.connect(self.self_attn_connection, x, self_attention, outputs)

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            attn_weights: List[Optional[Tensor]] = []

            def encoder_attention(h: Tensor) -> Tensor:
                out, weights = self.encoder_attn(
                    query=h,
                    key=encoder_out,
                    value=encoder_out,
                    key_padding_mask=encoder_padding_mask,
                    incremental_state=incremental_state,
                    static_kv=True,
                    need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights,
                )
                attn_weights.append(weights)
                return out

            x = self.connect(self.encoder_attn_connection, x, encoder_attention, outputs)
            attn = attn_weights[0]

        x = self.connect(self.ffn_connection, x, lambda h: self.feed_forward(h, self_attn_padding_mask), outputs,
                         layer_input)
        return x, attn, (self.residual_sum(outputs) if outputs is not None else None)
