"""Command-line flags of resnmt's connections, their defaults and their checks.

The flags themselves are declared by the connection classes
(``resnmt.modules.connections``: each kind's ``flags``); this module puts them on
fairseq's parser, fills in defaults and builds each side's ``ConnectionSpec``. fairseq
parses model flags with ``argparse.SUPPRESS`` as the default, so the flags are declared
without defaults and ``connection_defaults`` fills in what the command line left out
(arch functions call it after setting their own choices).
"""
from resnmt.modules.connections import (  # noqa: F401  (positive_*: argparse types other flags reuse)
    CONNECTION_CLASSES,
    CONNECTION_FLAGS,
    CONNECTION_KINDS,
    ConnectionConfigError,
    ConnectionSpec,
    check_flags_used,
    positive_float,
    positive_int,
)

# every connection flag's default, read from the registered kinds
DEFAULTS = {"residual": "post_ln", **{dest: flag.default for dest, flag in CONNECTION_FLAGS.items()}}

# fairseq options whose code paths the resnmt layers do not implement
UNSUPPORTED_FAIRSEQ_FLAGS = {
    "cross_self_attention": "--cross-self-attention",
    "scale_attn": "--scale-attn",
    "scale_fc": "--scale-fc",
    "scale_heads": "--scale-heads",
    "scale_resids": "--scale-resids",
}


def residual_help() -> str:
    """``--residual``'s help: each registered kind with its equation and source."""
    kinds = "; ".join(f"{kind}: {cls.equation} [{cls.source}]" for kind, cls in CONNECTION_CLASSES.items())
    return f"connection of every sublayer: {kinds} (default: the arch's, post_ln)"


def add_connection_args(parser) -> None:
    """Add resnmt's connection flags to ``parser`` (fairseq passes its model-specific
    argument group; no nested group, which argparse would leave out of --help): the
    kind flags, then each registered kind's own flags."""
    parser.add_argument("--residual", choices=CONNECTION_KINDS, metavar="KIND", help=residual_help())
    for side in ("encoder", "decoder"):
        parser.add_argument(f"--{side}-residual", choices=CONNECTION_KINDS, metavar="KIND",
                            help=f"connection of the {side}'s sublayers (default: --residual)")
    for flag in CONNECTION_FLAGS.values():
        flag.add_to(parser)


def connection_defaults(args) -> None:
    """Fill in every connection flag the command line and the arch left unset.

    ``--encoder-normalize-before`` / ``--decoder-normalize-before`` (fairseq's pre-LN
    flags) select pre_ln on their side when that side's kind is not given.
    """
    for key, value in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for side in ("encoder", "decoder"):
        kind_key = f"{side}_residual"
        if getattr(args, kind_key, None) is None:
            asked_pre_ln = getattr(args, f"{side}_normalize_before", False)
            setattr(args, kind_key, "pre_ln" if asked_pre_ln else args.residual)
        # keep fairseq's own flag consistent: it decides the stack-final LayerNorm
        setattr(args, f"{side}_normalize_before", CONNECTION_CLASSES[getattr(args, kind_key)].final_norm)


def num_layers(cfg, side: str) -> int:
    """``side``'s depth from a TransformerConfig (``cfg.encoder.layers``) or flat args."""
    sub = getattr(cfg, side, None)
    if sub is not None and getattr(sub, "layers", None) is not None:
        return int(sub.layers)
    return int(getattr(cfg, f"{side}_layers", None) or 6)


def side_connection_spec(cfg, side: str) -> ConnectionSpec:
    """The ConnectionSpec of ``side`` ("encoder"/"decoder") from flat model args or config
    (a checkpoint from before a flag existed gets the flag's default)."""

    def get(key: str):
        value = getattr(cfg, key, None)
        return DEFAULTS.get(key) if value is None else value

    kind = get(f"{side}_residual") or get("residual")
    own_flags = CONNECTION_CLASSES[kind].flags if kind in CONNECTION_CLASSES else ()
    return ConnectionSpec(
        kind,
        side=side,
        encoder_layers=num_layers(cfg, "encoder"),
        decoder_layers=num_layers(cfg, "decoder"),
        export=bool(get("export") or False),
        **{flag.dest: get(flag.dest) for flag in own_flags},  # a side holds its own kind's flags
    )


def check_model_args(args) -> None:
    """Raise ConnectionConfigError (a ValueError) for any connection option out of range,
    or a fairseq option the resnmt layers do not implement."""
    specs = [side_connection_spec(args, side) for side in ("encoder", "decoder")]  # each validates itself
    check_flags_used([spec.kind for spec in specs], {dest: getattr(args, dest, None) for dest in CONNECTION_FLAGS})
    for key, flag in UNSUPPORTED_FAIRSEQ_FLAGS.items():
        if getattr(args, key, False):
            raise ConnectionConfigError(f"{flag} is not supported by resnmt_transformer models")
    from resnmt.modules.normalized_activation import validate_normalized_activation_args

    validate_normalized_activation_args(args)
