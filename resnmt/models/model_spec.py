"""A model's choices, resolved once: :func:`resolve_model` turns its flags into a :class:`ModelSpec`.

fairseq hands a model its flags as one flat namespace (or a ``TransformerConfig`` copied
from it). :func:`resolve_model` is the one function that reads resnmt's flags, and the
fairseq flags they depend on, and decides from them, in one pass:

* each side's connection kind: ``--{side}-residual``, else ``pre_ln`` where fairseq's
  ``--{side}-normalize-before`` asks for it, else ``--residual``;
* each side's depth (``--{side}-layers``, or the number of ``--{side}-layers-to-keep``);
* whether each stack ends with a norm (the kind's rule; fairseq's ``--no-decoder-final-norm``);
* the normalization, the kinds' own flag values and the FFN activation;
* every check: a value out of range, a flag no chosen kind takes, a combination the
  layers do not implement. A problem is a ValueError naming the flag, the value and
  what is allowed;
* the user's own kinds: the modules ``--connections`` names are imported, and a kind
  neither built in nor registered is one line naming it and the module it needs.

The model's build runs it once per model and adds the result to the model's
configuration (``cfg.model_spec``, :class:`~resnmt.models.resnmt_transformer.ResolvedChoices`);
the arch functions run it while fairseq parses the flags, only to stop a bad value early.
The stacks, layers, connections and streams read the :class:`ModelSpec` (each stack its
side's :class:`~resnmt.connections.ConnectionSpec`, each layer its
:class:`~resnmt.models.layers.LayerSpec`), never the flags. Nothing is written back into
the flags: a checkpoint keeps the flags as given, and loading it resolves them again, by
this function. The one exception is ``connections``: the model's build records there the
modules of the user's kinds it uses (:func:`record_connection_sources`), so that its
checkpoint names them.
"""
from dataclasses import dataclass

from resnmt.activations.normalized import SIDES, ActivationSpec
from resnmt.connections import (
    CONNECTION_CLASSES,
    CONNECTION_FLAGS,
    ConnectionConfigError,
    ConnectionSpec,
    check_flags_used,
)
from resnmt.connections.plugins import require_kinds, sources_of
from resnmt.training.compile import require_compile
from resnmt.models.flags import (
    ACTIVATION_FLAGS,
    CONNECTIONS,
    DYT_ALPHA_INIT,
    FUSED_CONNECTIONS,
    NORMALIZATION,
    RESIDUAL,
    SIDE_RESIDUAL,
)

# fairseq options whose code paths the resnmt layers do not implement
UNSUPPORTED_FAIRSEQ_FLAGS = {
    "cross_self_attention": "--cross-self-attention",
    "scale_attn": "--scale-attn",
    "scale_fc": "--scale-fc",
    "scale_heads": "--scale-heads",
    "scale_resids": "--scale-resids",
}


@dataclass(frozen=True)
class ModelSpec:
    """Everything resnmt builds a model from: each side's connection spec (kind,
    normalization, final norm, depth, the kind's flag values) and the FFN activations'."""

    encoder: ConnectionSpec
    decoder: ConnectionSpec
    activation: ActivationSpec

    def side(self, name: str) -> ConnectionSpec:
        return self.encoder if name == "encoder" else self.decoder


def resolve_model(args) -> ModelSpec:
    """The :class:`ModelSpec` of ``args`` (parsed flags, a ``TransformerConfig`` or a
    checkpoint's model config); raises a ValueError on any bad choice."""
    for key, flag in UNSUPPORTED_FAIRSEQ_FLAGS.items():
        if getattr(args, key, False):
            raise ConnectionConfigError(f"{flag} is not supported by resnmt_transformer models")
    depths = {side: depth(args, side) for side in SIDES}
    kinds = {side: side_kind(args, side) for side in SIDES}
    require_kinds(kinds.values(), CONNECTIONS.read(args))  # the user's kinds: their modules imported
    settings = dict(
        encoder_layers=depths["encoder"],
        decoder_layers=depths["decoder"],
        export=bool(getattr(args, "export", False)),
        fused=bool(FUSED_CONNECTIONS.read(args)),
        normalization=NORMALIZATION.read(args),
        dyt_alpha_init=DYT_ALPHA_INIT.read(args),
    )
    specs = {}
    for side, kind in kinds.items():
        own_flags = CONNECTION_CLASSES[kind].flags if kind in CONNECTION_CLASSES else ()
        specs[side] = ConnectionSpec(  # validates the side's own choices
            kind, side=side, no_final_norm=side == "decoder" and bool(getattr(args, "no_decoder_final_norm", False)),
            **settings, **{flag.dest: flag.read(args) for flag in own_flags},  # a side holds its own kind's flags
        )
        layerdrop = float(getattr(args, f"{side}_layerdrop", 0) or 0)
        if layerdrop > 0 and specs[side].crosses_layers:
            raise ConnectionConfigError(
                f"--{side}-layerdrop {layerdrop:g} is invalid for --residual {kind}: its residual stream "
                "combines the layers' outputs by their position in the stack (use 0)"
            )
    check_flags_used(list(kinds.values()), {dest: getattr(args, dest, None) for dest in CONNECTION_FLAGS})
    activation = ActivationSpec(  # validates in ActivationSpec.__post_init__
        **{field: flag.read(args) for field, flag in ACTIVATION_FLAGS.items()},
        encoder_layers=depths["encoder"],
        decoder_layers=depths["decoder"],
        checkpoint_activations=bool(getattr(args, "checkpoint_activations", False)),
        fused=settings["fused"],
    )
    if settings["fused"]:
        require_compile()
    return ModelSpec(specs["encoder"], specs["decoder"], activation)


def side_kind(args, side: str) -> str:
    """``side``'s connection kind: ``--{side}-residual``, else ``pre_ln`` with fairseq's
    ``--{side}-normalize-before``, else ``--residual``."""
    given = SIDE_RESIDUAL[side].read(args)
    if given is not None:
        return given
    return "pre_ln" if getattr(args, f"{side}_normalize_before", False) else RESIDUAL.read(args)


def depth(args, side: str) -> int:
    """``side``'s number of layers: those of ``--{side}-layers-to-keep`` if given (fairseq
    builds that many), else ``--{side}-layers`` (6 where unset, fairseq's base)."""
    keep = getattr(args, f"{side}_layers_to_keep", None)
    if keep:
        return len(keep.split(",") if isinstance(keep, str) else keep)
    return int(getattr(args, f"{side}_layers", None) or 6)


def record_connection_sources(args, kinds) -> None:
    """Keep in ``args.connections`` the modules (or files) of the user's kinds among ``kinds``
    (a model's), so that a checkpoint of the model loads them, or names them when they are missing."""
    sources = sources_of(kinds)
    if sources or getattr(args, "connections", None):
        setattr(args, "connections", sources)
