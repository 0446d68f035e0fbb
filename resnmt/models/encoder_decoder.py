"""fairseq's Transformer encoder and decoder with resnmt layers.

Only the layer factories are overridden, so fairseq keeps doing everything else:
embeddings, positions, LayerDrop, activation checkpointing and FSDP wrapping, the
final LayerNorm of pre-LN stacks (``normalize_before``), incremental decoding.
"""
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from resnmt.models.options import activation_spec, side_connection_spec
from resnmt.modules.ffn_activation import build_ffn_activation
from resnmt.modules.layers import ResidualDecoderLayer, ResidualEncoderLayer


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's own layer factories do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class ResidualTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        # read by build_encoder_layer, which the parent's __init__ calls
        self.connection_spec = side_connection_spec(cfg, "encoder")
        self.activation_spec = activation_spec(cfg)
        self._layers_built = 0
        cfg.encoder.normalize_before = self.connection_spec.has_final_norm
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        activation = build_ffn_activation(
            self.activation_spec, cfg.activation_fn, "encoder", self._layers_built, cfg.encoder.layers
        )
        self._layers_built += 1
        layer = ResidualEncoderLayer(cfg, self.connection_spec, activation, return_fc=self.return_fc)
        return wrap_layer(layer, cfg)


class ResidualTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.connection_spec = side_connection_spec(cfg, "decoder")
        self.activation_spec = activation_spec(cfg)
        self._layers_built = 0
        cfg.decoder.normalize_before = self.connection_spec.has_final_norm
        super().__init__(
            cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn, output_projection=output_projection
        )

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
