"""Command-line flags of resnmt's connections and FFN activations, their defaults and their checks.

The flags themselves are declared by the connection classes
(``resnmt.modules.connections``: each kind's ``flags``); this module puts them on
fairseq's parser, fills in defaults and builds each side's ``ConnectionSpec``. fairseq
parses model flags with ``argparse.SUPPRESS`` as the default, so the flags are declared
without defaults and ``connection_defaults`` fills in what the command line left out
(arch functions call it after setting their own choices).
"""
import dataclasses

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
from resnmt.modules.fused import require_compile
from resnmt.modules.norms import DEFAULT_DYT_ALPHA, DEFAULT_NORMALIZATION, NORMALIZATIONS
from resnmt.modules.normalized_activation import KINDS, PAPER, SIDES, STATS_MODES, ActivationSpec

# every connection flag's default, read from the registered kinds
DEFAULTS = {
    "residual": "post_ln",
    "normalization": DEFAULT_NORMALIZATION,
    "dyt_alpha_init": DEFAULT_DYT_ALPHA,
    **{dest: flag.default for dest, flag in CONNECTION_FLAGS.items()},
}

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
    parser.add_argument(
        "--normalization", choices=NORMALIZATIONS, metavar="NORM",
        help="every normalization the connections and the stacks own: layer_norm (fairseq's LayerNorm), "
        "rms_norm (x/sqrt(mean(x^2)+eps)*g, Zhang and Sennrich 2019) or dyt (g*tanh(a*x)+b, a a learned "
        "scalar, Zhu et al. 2025); kinds without a normalization (xskip, highway, rezero) refuse a change "
        f"(default: {DEFAULT_NORMALIZATION})",
    )
    parser.add_argument(
        "--dyt-alpha-init", type=positive_float, metavar="A",
        help=f"initial alpha of every DyT with --normalization dyt (default: {DEFAULT_DYT_ALPHA:g}, the DyT paper's)",
    )
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
        fused=bool(getattr(cfg, "fused_connections", None) or False),
        normalization=get("normalization"),
        dyt_alpha_init=get("dyt_alpha_init"),
        **{flag.dest: get(flag.dest) for flag in own_flags},  # a side holds its own kind's flags
    )


def check_model_args(args) -> None:
    """Raise ConnectionConfigError (a ValueError) for any connection option out of range,
    or a fairseq option the resnmt layers do not implement."""
    specs = [side_connection_spec(args, side) for side in ("encoder", "decoder")]  # each validates itself
    for spec in specs:
        layerdrop = float(getattr(args, f"{spec.side}_layerdrop", 0) or 0)
        if layerdrop > 0 and CONNECTION_CLASSES[spec.kind].crosses_layers():
            raise ConnectionConfigError(
                f"--{spec.side}-layerdrop {layerdrop:g} is invalid for --residual {spec.kind}: its residual stream "
                "combines the layers' outputs by their position in the stack (use 0)"
            )
    check_flags_used([spec.kind for spec in specs], {dest: getattr(args, dest, None) for dest in CONNECTION_FLAGS})
    for key, flag in UNSUPPORTED_FAIRSEQ_FLAGS.items():
        if getattr(args, key, False):
            raise ConnectionConfigError(f"{flag} is not supported by resnmt_transformer models")
    spec = activation_spec(args)  # validates in ActivationSpec.__post_init__
    if spec.fused:
        require_compile()


# --------------------------------------------------------------------------- FFN activation

# flag (as an args attribute) -> ActivationSpec field; the defaults are the spec's
ACTIVATION_FLAGS = {
    "normalized_activation": "kind",
    "normalized_activation_stats": "stats",
    "normalized_activation_momentum": "momentum",
    "normalized_activation_clamp_min": "clamp_min",
    "normalized_activation_clamp_max": "clamp_max",
    "encoder_unnormalized_top_layers": "encoder_unnormalized_top_layers",
    "decoder_unnormalized_top_layers": "decoder_unnormalized_top_layers",
}
ACTIVATION_DEFAULTS = {
    flag: field.default for field in dataclasses.fields(ActivationSpec)
    for flag, name in ACTIVATION_FLAGS.items() if name == field.name
}


def add_activation_args(parser) -> None:
    """Add the ``--normalized-activation*`` and ``--*-unnormalized-top-layers`` flags.

    No defaults here (fairseq parses model flags with ``argparse.SUPPRESS``): the arch
    functions call :func:`activation_defaults`, which takes them from ActivationSpec.
    """
    d = ACTIVATION_DEFAULTS
    parser.add_argument(
        "--normalized-activation", choices=KINDS, metavar="{nrelu,nswish}",
        help=f"FFN activation normalized as in {PAPER}: 2*sigmoid(omega)*lambda*(f(h)-E[f(h)]) "
        "with f = ReLU (nrelu) or Swish (nswish), lambda**2 = (1/rho + 1/rho')/2, "
        "rho = Var[f(h)]/Var[h], rho' = fraction of positive h. Replaces --activation-fn "
        "in every FFN (see --encoder/decoder-unnormalized-top-layers). "
        "Unset: the plain --activation-fn",
    )
    parser.add_argument(
        "--normalized-activation-stats", choices=STATS_MODES, metavar="{instance,batch}",
        help="where mu, rho, rho' come from: 'instance' = per token over the FFN hidden "
        "features, no running state (the paper's Transformer setting); "
        "'batch' = over all real (non-padding) tokens of the mini-batch, kept as "
        f"momentum estimates used at evaluation (default: {d['normalized_activation_stats']})",
    )
    parser.add_argument(
        "--normalized-activation-momentum", type=float, metavar="M",
        help=f"batch stats only: r <- m_n*r + (1-m_n)*r_batch with m_n = min(M, 1-1/n) at "
        f"the n-th update ({PAPER}, eq. 16-18); in [0, 1); default "
        f"{d['normalized_activation_momentum']}. Note: M weights the history (PyTorch "
        "BatchNorm's momentum is 1-M)",
    )
    parser.add_argument(
        "--normalized-activation-clamp-min", type=float, metavar="LO",
        help=f"lower bound for rho and rho' (the paper's bounds against abnormal values): "
        f"bounds lambda <= 1/sqrt(LO); > 0; default {d['normalized_activation_clamp_min']}",
    )
    parser.add_argument(
        "--normalized-activation-clamp-max", type=float, metavar="HI",
        help="upper bound for rho and rho' (rho' <= 1; rho <= 1 for ReLU, <= 1.21 for "
        f"Swish, so the default {d['normalized_activation_clamp_max']} only catches numerical "
        "garbage); > LO",
    )
    for side in SIDES:
        parser.add_argument(
            f"--{side}-unnormalized-top-layers", type=int, metavar="K",
            help=f"the top K {side} FFNs keep the unnormalized activation (ReLU for nrelu, "
            f"Swish for nswish): the paper's 'NSwish+kSwish' (NSwish in every FFN "
            f"collapsed at FFN size 2048); 0 <= K <= layers; default "
            f"{d[f'{side}_unnormalized_top_layers']}",
        )


def add_fused_args(parser) -> None:
    """Add ``--fused-connections`` (resnmt.modules.fused)."""
    parser.add_argument(
        "--fused-connections", action="store_true",
        help="compile SAS's combination (gate sigmoids, LN(x+F), alpha*x+beta*F+gamma*LN(x+F)) and "
        "NReLU/NSwish (statistics, normalization, output) with torch.compile (dynamic shapes: "
        "no recompilation per batch shape); same results as the eager path within float "
        "tolerance; the first batches pay the compilation (see docs/benchmarks.md). Needs "
        "torch.compile (a C++ compiler on CPU, Triton on GPU): where it is missing, the model "
        "build stops with one line saying why (no silent fallback). Off by default",
    )


def activation_defaults(args) -> None:
    """Fill in the activation flags the command line and the arch left unset."""
    for key, value in ACTIVATION_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def activation_spec(cfg) -> ActivationSpec:
    """The (validated) ActivationSpec of flat model args or a TransformerConfig; flags
    missing from ``cfg`` (checkpoints older than a flag) read as the spec's defaults."""
    values = {
        name: getattr(cfg, flag) for flag, name in ACTIVATION_FLAGS.items() if getattr(cfg, flag, None) is not None
    }
    for side in SIDES:
        layers = getattr(cfg, f"{side}_layers", None)
        if layers is not None:
            values[f"{side}_layers"] = int(layers)
    return ActivationSpec(
        **values,
        checkpoint_activations=bool(getattr(cfg, "checkpoint_activations", False)),
        fused=bool(getattr(cfg, "fused_connections", False)),
    )
