"""A resnmt (or fairseq) Transformer as a CTranslate2 model, for the kinds CTranslate2 computes exactly.

CTranslate2's ``TransformerSpec`` holds one layer form per stack: post-norm ``LN(x + F)``
or pre-norm ``x + F(LN(x))`` with a final norm, every norm a LayerNorm or an RMSNorm (one
epsilon for the model), the FFN's activation one of ReLU, GELU (exact or tanh) and Swish.
So ``post_ln`` and ``pre_ln``, with ``--normalization layer_norm`` or ``rms_norm`` and
fairseq's activations, are written with their own weights and nothing changed: the model
computes what fairseq computes, and decodes to fairseq-generate's hypotheses in float32.
So is ``peri_ln`` (``x + LN_out(F(LN_in(x)))``, a final norm): CTranslate2's
``pre_post_layer_norm`` layer (Gemma's), whose encoder-decoder attention takes its norms
outside (``external_pre_post_encoder_layers``).
Every other kind scales, gates, mixes or re-normalizes what CTranslate2's layer adds
(``x`` unscaled plus ``F``), or adds streams it does not hold, and is refused by
:func:`ctranslate2_refusal` in one line naming the kind, its equation and why.

fairseq's ``ct2-fairseq-converter`` refuses ``resnmt_transformer`` (the model name is not
one it knows), and a resnmt checkpoint names its norms after its connections
(``*_connection.norm``), so this reads the loaded model's modules instead of fairseq's
key names, through CTranslate2's converter API (:class:`ResnmtConverter`, a
``ctranslate2.converters.Converter``). ``ctranslate2`` is an optional dependency
(``pip install resnmt[export]``).
"""
from pathlib import Path
from typing import Optional

from resnmt.connections import CONNECTION_CLASSES
from resnmt.export import ExportError

# the norm placements CTranslate2's Transformer layer computes: kind -> pre_norm (with a final norm);
# peri_ln is its pre_post_layer_norm layer (the sublayer's input and output normalized)
EXACT_KINDS = {"post_ln": False, "pre_ln": True, "peri_ln": True}
PERI = "peri_ln"
EXACT_NORMALIZATIONS = ("layer_norm", "rms_norm")
# fairseq's --activation-fn -> the name of CTranslate2's Activation (as its fairseq converter maps them)
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_accurate": "GELUTanh", "gelu_fast": "GELUTanh",
               "swish": "SWISH"}
WHY = ("CTranslate2's Transformer layer computes LN(x + F) (post_ln), x + F(LN(x)) (pre_ln) or "
       "x + LN(F(LN(x))) (peri_ln) only, with LayerNorm or RMSNorm")
OTHER_FORMAT = "export it with --format torch-export"
INSTALL = "pip install ctranslate2 (or pip install resnmt[export])"


def require_ctranslate2():
    """The ``ctranslate2`` module, or one ExportError line saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ExportError(f"--format ctranslate2 needs the ctranslate2 package: {INSTALL}") from None
    return ctranslate2


def side_kind(stack) -> str:
    """The connection kind of an encoder or decoder: resnmt's spec, or for fairseq's own
    ``transformer`` the placement its ``normalize_before`` chose."""
    spec = getattr(stack, "connection_spec", None)
    if spec is not None:
        return spec.kind
    return "pre_ln" if stack.layers[0].normalize_before else "post_ln"


def side_normalization(stack) -> str:
    spec = getattr(stack, "connection_spec", None)
    return spec.normalization if spec is not None else "layer_norm"


def ffn_activation_name(layer) -> Optional[str]:
    """fairseq's ``--activation-fn`` name of a layer's FFN activation; None for a normalized
    activation (NReLU, NSwish), which CTranslate2 does not compute."""
    module = getattr(layer, "ffn_activation", None)
    if module is None:  # fairseq's own layer
        fn = layer.activation_fn
        name = getattr(fn, "__name__", type(fn).__name__)
        return {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_accurate", "silu": "swish",
                "SiLU": "swish"}.get(name, name)
    return getattr(module, "name", None)


def ctranslate2_refusal(model) -> Optional[str]:
    """Why CTranslate2 cannot compute ``model`` exactly (one line), or None when it can."""
    for stack in (model.encoder, model.decoder):
        kind, side = side_kind(stack), "encoder" if stack is model.encoder else "decoder"
        if kind not in EXACT_KINDS:
            equation = CONNECTION_CLASSES[kind].equation if kind in CONNECTION_CLASSES else "a user's kind"
            return (f"--format ctranslate2 cannot hold the {side}'s --residual {kind} ({equation}): {WHY}; "
                    f"{OTHER_FORMAT}")
        normalization = side_normalization(stack)
        if normalization not in EXACT_NORMALIZATIONS:
            return (f"--format ctranslate2 cannot hold --normalization {normalization}: CTranslate2 normalizes with "
                    f"LayerNorm or RMSNorm only; {OTHER_FORMAT}")
        for layer in stack.layers:
            name = ffn_activation_name(layer)
            if name not in ACTIVATIONS:
                what = f"--activation-fn {name}" if name else "a normalized activation (--normalized-activation)"
                return (f"--format ctranslate2 cannot hold {what}: CTranslate2's FFN applies "
                        f"{', '.join(sorted(ACTIVATIONS))} only; {OTHER_FORMAT}")
        if stack.embed_positions is None:
            return f"--format ctranslate2 cannot hold --no-token-positional-embeddings; {OTHER_FORMAT}"
    activations = {ACTIVATIONS[ffn_activation_name(layer)] for stack in (model.encoder, model.decoder)
                   for layer in stack.layers}
    if len(activations) > 1:
        return f"--format ctranslate2 holds one FFN activation per model, not {sorted(activations)}; {OTHER_FORMAT}"
    if getattr(model.decoder, "adaptive_softmax", None) is not None:
        return f"--format ctranslate2 cannot hold an adaptive softmax; {OTHER_FORMAT}"
    heads = {model.encoder.layers[0].self_attn.num_heads, model.decoder.layers[0].self_attn.num_heads}
    if len(heads) > 1:
        return (f"--format ctranslate2 holds one number of attention heads per model, not {sorted(heads)}; "
                f"{OTHER_FORMAT}")
    return None


def _norm_of(layer, fairseq_name: str, connection_name: str):
    """A sublayer's norm: resnmt's connection's, or fairseq's own LayerNorm."""
    connection = getattr(layer, connection_name, None)
    return connection.norm if connection is not None else getattr(layer, fairseq_name)


def _set_norm(spec, norm) -> None:
    spec.gamma = norm.weight.detach().numpy()
    if hasattr(spec, "beta"):  # a LayerNorm's (an RMSNorm has no bias)
        spec.beta = norm.bias.detach().numpy()


def _norm_eps(model) -> float:
    """The one epsilon of the model's norms (CTranslate2 holds one)."""
    import torch

    eps = {float(m.eps) for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))}
    if len(eps) > 1:
        raise ExportError(f"--format ctranslate2 holds one norm epsilon per model, not {sorted(eps)}")
    return eps.pop() if eps else 1e-5


def set_peri_norms(layer_spec, layer, cross: bool) -> None:
    """Peri-LN's input and output norm of each sublayer, as CTranslate2's pre_post_layer_norm names them."""
    _set_norm(layer_spec.input_layer_norm, layer.self_attn_connection.input_norm)
    _set_norm(layer_spec.post_attention_layer_norm, layer.self_attn_connection.output_norm)
    if cross:
        _set_norm(layer_spec.external_pre_encoder_attention_layer_norm, layer.encoder_attn_connection.input_norm)
        _set_norm(layer_spec.external_post_encoder_attention_layer_norm, layer.encoder_attn_connection.output_norm)
    _set_norm(layer_spec.pre_feedforward_layer_norm, layer.ffn_connection.input_norm)
    _set_norm(layer_spec.post_feedforward_layer_norm, layer.ffn_connection.output_norm)


def build_spec(model, src_dict, tgt_dict):
    """CTranslate2's ``TransformerSpec`` of ``model`` (:func:`ctranslate2_refusal` None),
    its weights and vocabularies set."""
    from ctranslate2.converters import fairseq as ct2_fairseq
    from ctranslate2.specs import common_spec, transformer_spec

    encoder, decoder = model.encoder, model.decoder
    activation = getattr(common_spec.Activation, ACTIVATIONS[ffn_activation_name(encoder.layers[0])])
    rms = side_normalization(encoder) == "rms_norm"
    if side_normalization(decoder) != side_normalization(encoder):
        raise ExportError("--format ctranslate2 holds one normalization per model, not one per side")
    heads = encoder.layers[0].self_attn.num_heads
    peri = {stack: side_kind(stack) == PERI for stack in (encoder, decoder)}
    enc_spec = transformer_spec.TransformerEncoderSpec(
        len(encoder.layers), heads, pre_norm=EXACT_KINDS[side_kind(encoder)], no_final_norm=encoder.layer_norm is None,
        activation=activation, layernorm_embedding=encoder.layernorm_embedding is not None, rms_norm=rms,
        pre_post_layer_norm=peri[encoder])
    dec_spec = transformer_spec.TransformerDecoderSpec(
        len(decoder.layers), heads, pre_norm=EXACT_KINDS[side_kind(decoder)], activation=activation,
        layernorm_embedding=decoder.layernorm_embedding is not None, no_final_norm=decoder.layer_norm is None,
        project_in_out=decoder.project_in_dim is not None, rms_norm=rms, pre_post_layer_norm=peri[decoder],
        external_pre_post_encoder_layers=peri[decoder])
    spec = transformer_spec.TransformerSpec(enc_spec, dec_spec)
    spec.config.add_attribute("layer_norm_epsilon", _norm_eps(model))

    for side_spec, stack in ((enc_spec, encoder), (dec_spec, decoder)):
        ct2_fairseq.set_input_layers(side_spec, stack)
        if stack.layer_norm is not None:
            _set_norm(side_spec.layer_norm, stack.layer_norm)
        if stack.layernorm_embedding is not None:
            _set_norm(side_spec.layernorm_embedding, stack.layernorm_embedding)
        for layer_spec, layer in zip(side_spec.layer, stack.layers):
            ct2_fairseq.set_multi_head_attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
            if stack is decoder:
                ct2_fairseq.set_multi_head_attention(layer_spec.attention, layer.encoder_attn)
            ct2_fairseq.set_linear(layer_spec.ffn.linear_0, layer.fc1)
            ct2_fairseq.set_linear(layer_spec.ffn.linear_1, layer.fc2)
            if peri[stack]:
                set_peri_norms(layer_spec, layer, stack is decoder)
                continue
            _set_norm(layer_spec.self_attention.layer_norm,
                      _norm_of(layer, "self_attn_layer_norm", "self_attn_connection"))
            if stack is decoder:
                _set_norm(layer_spec.attention.layer_norm,
                          _norm_of(layer, "encoder_attn_layer_norm", "encoder_attn_connection"))
            _set_norm(layer_spec.ffn.layer_norm, _norm_of(layer, "final_layer_norm", "ffn_connection"))
    ct2_fairseq.set_linear(dec_spec.projection, decoder.output_projection)
    if decoder.project_in_dim is not None:
        ct2_fairseq.set_linear(dec_spec.project_in, decoder.project_in_dim)
        ct2_fairseq.set_linear(dec_spec.project_out, decoder.project_out_dim)

    spec.register_source_vocabulary(ct2_fairseq._get_vocab(src_dict))
    spec.register_target_vocabulary(ct2_fairseq._get_vocab(tgt_dict))
    spec.config.decoder_start_token = spec.config.eos_token  # fairseq starts the target with </s>
    spec.config.add_source_eos = True  # and ends the source with it
    return spec


def converter_class():
    """:class:`ResnmtConverter`, made once ctranslate2 is imported (an optional dependency)."""
    from ctranslate2.converters.converter import Converter

    class ResnmtConverter(Converter):
        """CTranslate2's converter of a loaded resnmt (or fairseq) Transformer and its dictionaries."""

        def __init__(self, model, src_dict, tgt_dict):
            self.model, self.src_dict, self.tgt_dict = model, src_dict, tgt_dict

        def _load(self):
            import torch

            with torch.no_grad():
                return build_spec(self.model, self.src_dict, self.tgt_dict)

    return ResnmtConverter


def export_ctranslate2(model, task, output_dir, quantization: Optional[str] = None) -> Path:
    """Write ``model`` (with ``task``'s dictionaries) as a CTranslate2 model into the new
    folder ``output_dir``; refused (ExportError, one line) where CTranslate2 cannot compute
    it exactly. ``quantization``: CTranslate2's weight type (None: float32, as trained)."""
    require_ctranslate2()
    refusal = ctranslate2_refusal(model)
    if refusal:
        raise ExportError(refusal)
    converter = converter_class()(model, task.source_dictionary, task.target_dictionary)
    return Path(converter.convert(str(output_dir), quantization=quantization, force=True))
