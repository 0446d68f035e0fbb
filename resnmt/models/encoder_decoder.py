"""fairseq's Transformer encoder and decoder with resnmt layers, and the one layer loop they share.

Each stack is built from its side of the model's resolved choices (a
:class:`~resnmt.connections.ConnectionSpec`, ``spec``) and reads nothing else.
The layer factories are overridden, so fairseq keeps building everything else:
embeddings, positions, LayerDrop, activation checkpointing and FSDP wrapping, the final
norm (told by the spec through fairseq's own ``normalize_before``), incremental decoding.

Both stacks run their layers through :meth:`ResidualStack.run_layers`: every layer
returns ``(x, extra, residual_sum)`` (``extra``: the encoder's fc2 output with
``return_fc``, the decoder's attention), and the stack's residual stream
(:mod:`resnmt.connections.streams`; plain stacking for most kinds) decides what each layer
reads and what the stack returns. Around the loop the stacks compute exactly what
fairseq's own forward computes, so post-LN equals fairseq's ``transformer``.
"""
import copy
from typing import Any, Dict, List, Optional, Tuple

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from resnmt.connections import build_stream
from resnmt.connections.streams import ResidualStream
from resnmt.models.layers import LayerSpec, ResidualDecoderLayer, ResidualEncoderLayer
from resnmt.models.model_spec import ModelSpec


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's own layer factories do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def fairseq_config(cfg, side: str, final_norm: bool):
    """A copy of fairseq's ``cfg`` whose ``{side}.normalize_before`` is ``final_norm``: in
    fairseq that flag decides the stack's final LayerNorm (the layers ignore it here)."""
    cfg = copy.copy(cfg)
    sub = copy.copy(getattr(cfg, side))
    sub.normalize_before = final_norm
    setattr(cfg, side, sub)
    return cfg


class ResidualStack:
    """What the encoder and decoder share: their side's spec, the residual stream, the
    layers' construction and the layer loop. Mixed into fairseq's two stacks."""

    side: str
    # pass the padding masks whatever the batch holds, instead of asking the batch on the host
    # whether it holds padding (a host-device synchronisation on a GPU): the same result, set
    # by --fast-path (resnmt/training/fast/step.py), whose batches have static shapes and
    # whose updates are CUDA graphs that cannot wait for the host
    static_padding: bool = False

    def _begin_stack(self, spec: ModelSpec, embed_dim: int) -> ResidualStream:
        """Before fairseq's ``__init__`` builds the layers: this side's spec, the stream
        (returned: registered by :meth:`_finish_stack`, once ``nn.Module`` exists) and the
        layers' specs. fairseq builds the layers in order, calling ``build_*_layer(cfg)``
        once per layer without an index, so the stack hands them their specs in that order."""
        self.connection_spec = spec.side(self.side)
        stream = build_stream(embed_dim, self.connection_spec) or ResidualStream()
        self._layer_specs = iter([
            LayerSpec(self.connection_spec.at_layer(index), spec.activation, stream.reads_sublayer_outputs)
            for index in range(self.connection_spec.layers)
        ])
        return stream

    def _finish_stack(self, stream: ResidualStream, embed_dim: int) -> None:
        """After fairseq's ``__init__``: the stream, and the final norm of ``--normalization``."""
        if next(self._layer_specs, None) is not None:
            raise RuntimeError(f"fairseq built {len(self.layers)} {self.side} layers for a spec of "
                               f"{self.connection_spec.layers}")
        del self._layer_specs
        spec = self.connection_spec
        if self.layer_norm is not None and spec.normalization != "layer_norm":
            self.layer_norm = spec.norm(embed_dim)  # the final norm of pre-LN-like stacks
        self.residual_stream = stream

    def run_layers(self, x: Tensor, layer_args: Dict[str, Any], alignment_layer: Optional[int] = None
                   ) -> Tuple[Tensor, List[Tensor], List[Optional[Tensor]]]:
        """The layer loop of both stacks.

        Args:
            x: the embedded input ``(seq_len, batch, embed_dim)``.
            layer_args: what every layer is called with besides its input.
            alignment_layer: (decoder) the layer asked for its attention weights.

        Returns:
            the stack's output (after the stream's end and the final norm), each layer's
            output, and each layer's extra output (fc2 output or attention, or None).
        """
        stream = self.residual_stream
        state = stream.begin(x)
        outputs: List[Tensor] = []
        extras: List[Optional[Tensor]] = []
        for index, layer in enumerate(self.layers):
            if alignment_layer is not None:
                layer_args["need_attn"] = layer_args["need_head_weights"] = index == alignment_layer
            x, extra, residual_sum = layer(stream.layer_input(state, index, x), **layer_args)
            state = stream.after_layer(state, index, x, residual_sum)
            outputs.append(x)
            extras.append(extra)
        x = stream.end(state, x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x, outputs, extras


class ResidualTransformerEncoder(ResidualStack, TransformerEncoderBase):
    side = "encoder"

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False, *, spec: ModelSpec):
        stream = self._begin_stack(spec, embed_tokens.embedding_dim)
        cfg = fairseq_config(cfg, self.side, self.connection_spec.has_final_norm)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self._finish_stack(stream, embed_tokens.embedding_dim)

    def build_encoder_layer(self, cfg):
        return wrap_layer(ResidualEncoderLayer(cfg, next(self._layer_specs), return_fc=self.return_fc), cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        """fairseq's encoder forward, its layers run by :meth:`run_layers`."""
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = self.static_padding or bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        embedded = x
        x, outputs, fc_results = self.run_layers(x, {"encoder_padding_mask": padding_mask if has_pads else None})
        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": [embedded, *outputs] if return_all_hiddens else [],
            "fc_results": fc_results if return_all_hiddens else [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class ResidualTransformerDecoder(ResidualStack, TransformerDecoderBase):
    side = "decoder"

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None, *,
                 spec: ModelSpec):
        stream = self._begin_stack(spec, embed_tokens.embedding_dim)
        cfg = fairseq_config(cfg, self.side, self.connection_spec.has_final_norm)
        super().__init__(
            cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn, output_projection=output_projection
        )
        self._finish_stack(stream, embed_tokens.embedding_dim)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(ResidualDecoderLayer(cfg, next(self._layer_specs), no_encoder_attn=no_encoder_attn), cfg)

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
        """fairseq's decoder features, its layers run by :meth:`run_layers`. The attention
        weights of ``alignment_layer`` come back as ``attn``: by default, as in fairseq, the
        last layer's in eval mode (what the generator's alignments read), and none in training,
        where nothing reads them unless it asks (a caller passing ``alignment_layer``)."""
        if alignment_layer is None and not self.training:
            alignment_layer = self.num_layers - 1
        enc = encoder_out["encoder_out"][0] if encoder_out and encoder_out["encoder_out"] else None
        enc_mask = (encoder_out["encoder_padding_mask"][0]
                    if encoder_out and encoder_out["encoder_padding_mask"] else None)
        x = self.embed_target(prev_output_tokens, incremental_state)
        tokens = prev_output_tokens[:, -1:] if incremental_state is not None else prev_output_tokens
        padding = tokens.eq(self.padding_idx)
        layer_args = dict(
            encoder_out=enc, encoder_padding_mask=enc_mask, incremental_state=incremental_state,
            self_attn_mask=self.buffered_future_mask(x) if incremental_state is None and not full_context_alignment
            else None,
            self_attn_padding_mask=padding if self.static_padding or padding.any() else None,
        )
        inner_states: List[Optional[Tensor]] = [x]
        x, outputs, attentions = self.run_layers(x, layer_args, alignment_layer)
        inner_states.extend(outputs)
        attn: Optional[Tensor] = None
        if alignment_layer is not None and alignment_layer < len(attentions):
            attn = attentions[alignment_layer]
        if attn is not None:
            attn = attn.float().to(outputs[alignment_layer])
            attn = (attn[:alignment_heads] if alignment_heads is not None else attn).mean(dim=0)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}
