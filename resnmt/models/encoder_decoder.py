"""fairseq's Transformer encoder and decoder with resnmt layers.

The layer factories are overridden, so fairseq keeps doing everything else: embeddings,
positions, LayerDrop, activation checkpointing and FSDP wrapping, the final norm of
pre-LN stacks (``normalize_before``), incremental decoding. A kind whose stack carries a
residual stream (ResiDual, DLCL: :mod:`resnmt.modules.streams`) runs the layer loop below
instead of fairseq's; every other kind runs fairseq's loop untouched.
"""
from typing import Dict, List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from resnmt.models.options import activation_spec, side_connection_spec
from resnmt.modules.connections import build_stream
from resnmt.modules.ffn_activation import build_ffn_activation
from resnmt.modules.layers import ResidualDecoderLayer, ResidualEncoderLayer


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's own layer factories do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class ResidualStack:
    """What the encoder and decoder share: the kind's residual stream, and the stack's
    final norm of the chosen ``--normalization``. Mixed into fairseq's two stacks."""

    def _build_stack_extras(self, embed_dim: int) -> None:
        spec = self.connection_spec
        if self.layer_norm is not None and spec.normalization != "layer_norm":
            self.layer_norm = spec.norm(embed_dim)  # the final norm of pre-LN-like stacks
        self.residual_stream = build_stream(embed_dim, spec)

    def run_layer(self, layer, x: Tensor, **kwargs):
        """One layer in the stream loop: ``(x, extra, residual_sum or None)``."""
        stream = self.residual_stream
        if stream.reads_sublayer_outputs:
            return layer(x, return_residual_sum=True, **kwargs)
        out = layer(x, **kwargs)
        return (out[0], out[1], None) if isinstance(out, tuple) else (out, None, None)


class ResidualTransformerEncoder(ResidualStack, TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        # read by build_encoder_layer, which the parent's __init__ calls
        self.connection_spec = side_connection_spec(cfg, "encoder")
        self.activation_spec = activation_spec(cfg)
        self._layers_built = 0
        cfg.encoder.normalize_before = self.connection_spec.has_final_norm
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self._build_stack_extras(embed_tokens.embedding_dim)

    def build_encoder_layer(self, cfg):
        activation = build_ffn_activation(
            self.activation_spec, cfg.activation_fn, "encoder", self._layers_built, cfg.encoder.layers
        )
        self._layers_built += 1
        layer = ResidualEncoderLayer(cfg, self.connection_spec, activation, return_fc=self.return_fc)
        return wrap_layer(layer, cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        """fairseq's encoder forward; with a residual stream, the stream's loop."""
        if self.residual_stream is None:
            return super().forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        states: List[Tensor] = [x] if return_all_hiddens else []
        fc_results: List[Optional[Tensor]] = []
        stream = self.residual_stream
        state = stream.begin(x)
        for index, layer in enumerate(self.layers):
            x = stream.layer_input(state, index, x)
            x, fc_result, residual_sum = self.run_layer(
                layer, x, encoder_padding_mask=padding_mask if has_pads else None
            )
            state = stream.after_layer(state, index, x, residual_sum)
            if return_all_hiddens:
                states.append(x)
                fc_results.append(fc_result)
        x = stream.end(state, x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": states,
            "fc_results": fc_results,
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class ResidualTransformerDecoder(ResidualStack, TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.connection_spec = side_connection_spec(cfg, "decoder")
        self.activation_spec = activation_spec(cfg)
        self._layers_built = 0
        cfg.decoder.normalize_before = self.connection_spec.has_final_norm
        super().__init__(
            cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn, output_projection=output_projection
        )
        self._build_stack_extras(embed_tokens.embedding_dim)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        activation = build_ffn_activation(
            self.activation_spec, cfg.activation_fn, "decoder", self._layers_built, cfg.decoder.layers
        )
        self._layers_built += 1
        layer = ResidualDecoderLayer(cfg, self.connection_spec, activation, no_encoder_attn=no_encoder_attn)
        return wrap_layer(layer, cfg)

    def upgrade_state_dict_named(self, state_dict, name):
        state_dict = super().upgrade_state_dict_named(state_dict, name)  # fairseq's layer_norms.N renames
        for i, layer in enumerate(self.layers):
            layer.upgrade_state_dict_named(state_dict, f"{name}.layers.{i}")
        return state_dict

    def embed_target(self, prev_output_tokens: Tensor, incremental_state) -> Tensor:
        """The decoder's input (T x B x C) as fairseq's decoder embeds it: scaled tokens,
        positions, optional embedding LN, dropout; only the last step when decoding
        incrementally."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x).transpose(0, 1)

    def extract_features_scriptable(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                                    incremental_state=None, full_context_alignment: bool = False,
                                    alignment_layer: Optional[int] = None, alignment_heads: Optional[int] = None):
        """fairseq's decoder features; with a residual stream, the stream's loop."""
        if self.residual_stream is None:
            return super().extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                       full_context_alignment, alignment_layer, alignment_heads)
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc = encoder_out["encoder_out"][0] if encoder_out and encoder_out["encoder_out"] else None
        enc_mask = (encoder_out["encoder_padding_mask"][0]
                    if encoder_out and encoder_out["encoder_padding_mask"] else None)
        x = self.embed_target(prev_output_tokens, incremental_state)
        tokens = prev_output_tokens[:, -1:] if incremental_state is not None else prev_output_tokens
        padding = tokens.eq(self.padding_idx)
        self_attn_padding_mask = padding if padding.any() else None

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        stream = self.residual_stream
        state = stream.begin(x)
        for index, layer in enumerate(self.layers):
            x = stream.layer_input(state, index, x)
            mask = self.buffered_future_mask(x) if incremental_state is None and not full_context_alignment else None
            x, layer_attn, residual_sum = self.run_layer(
                layer, x, encoder_out=enc, encoder_padding_mask=enc_mask, incremental_state=incremental_state,
                self_attn_mask=mask, self_attn_padding_mask=self_attn_padding_mask,
                need_attn=index == alignment_layer, need_head_weights=index == alignment_layer,
            )
            state = stream.after_layer(state, index, x, residual_sum)
            inner_states.append(x)
            if layer_attn is not None and index == alignment_layer:
                attn = layer_attn.float().to(x)
        if attn is not None:
            attn = (attn[:alignment_heads] if alignment_heads is not None else attn).mean(dim=0)
        x = stream.end(state, x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}
