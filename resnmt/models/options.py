"""Command-line flags of resnmt's connections and FFN activations, their defaults and their checks.

fairseq parses model flags with ``argparse.SUPPRESS`` as the default, so the flags are
declared here without defaults and ``connection_defaults`` fills in what the command
line left out (arch functions call it after setting their own choices).
"""
import argparse
import dataclasses
from typing import Optional

from resnmt.modules.connections import (
    CONNECTION_KINDS,
    SAS_GAMMA_FORMS,
    SAS_GATE_FORMS,
    ConnectionConfigError,
    ConnectionSpec,
)
from resnmt.modules.fused import require_compile
from resnmt.modules.normalized_activation import KINDS, PAPER, SIDES, STATS_MODES, ActivationSpec

DEFAULTS = {
    "residual": "post_ln",
    "skip_lambda": 2.0,
    "sas_gate": "two_layer",
    "sas_gamma": "product",
    "sas_gate_dim": None,
    "sas_alpha_bias_init": 0.0,
    "sas_beta_bias_init": 0.0,
    "sas_gamma_bias_init": 0.0,
    "highway_bias_init": -2.0,
}

# fairseq options whose code paths the resnmt layers do not implement
UNSUPPORTED_FAIRSEQ_FLAGS = {
    "cross_self_attention": "--cross-self-attention",
    "scale_attn": "--scale-attn",
    "scale_fc": "--scale-fc",
    "scale_heads": "--scale-heads",
    "scale_resids": "--scale-resids",
}


def positive(cast, allowed: str):
    """An argparse ``type``: ``cast(text)`` if that is > 0, else one error naming the value."""

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {allowed}")
        return value

    return parse


positive_float = positive(float, "a real number > 0")
positive_int = positive(int, "an integer > 0")


def add_connection_args(parser) -> None:
    """Add resnmt's connection flags to ``parser`` (fairseq passes its model-specific
    argument group; no nested group, which argparse would leave out of --help)."""
    kinds = ", ".join(CONNECTION_KINDS)
    group = parser
    group.add_argument(
        "--residual", choices=CONNECTION_KINDS, metavar="KIND",
        help=f"connection of every sublayer ({kinds}); post_ln: LN(x+F) [Vaswani 2017]; "
        "pre_ln: x+F(LN(x)) and a final LN [He 2016]; xskip: lambda*x+F [rSkip eq.2]; "
        "xskip_ln: LN(lambda*x+F) [rSkip eq.3]; rskip_ln: y1=LN1(x+F), yk=LNk(x+y_{k-1}) "
        "[rSkip eq.4]; sas: alpha*x+beta*F+gamma*LN(x+F) [SAS eq.3/4]; highway: t*F+(1-t)*x, "
        "t=sigmoid(x W_T+b_T) [Srivastava 2015] (default: the arch's, post_ln)",
    )
    group.add_argument("--encoder-residual", choices=CONNECTION_KINDS, metavar="KIND",
                       help="connection of the encoder's sublayers (default: --residual)")
    group.add_argument("--decoder-residual", choices=CONNECTION_KINDS, metavar="KIND",
                       help="connection of the decoder's sublayers (default: --residual)")
    group.add_argument(
        "--skip-lambda", type=positive_float, metavar="LAMBDA",
        help="skip scale: the real lambda > 0 of xskip/xskip_ln (lambda*x), or the integer "
        "lambda >= 1 of rskip_ln (number of LNs; 1 is post_ln) (default: 2, the rSkip paper's best)",
    )
    group.add_argument(
        "--sas-gate", choices=SAS_GATE_FORMS,
        help="SAS gate S(x,F): two_layer = tanh([x;F] W_f + b_f) W_ff + b_ff (paper); "
        "single_layer = [x;F] W + b (paper's ablation) (default: two_layer)",
    )
    group.add_argument(
        "--sas-gamma", choices=SAS_GAMMA_FORMS,
        help="SAS weight of LN(x+F): product = (1-alpha)(1-beta) (paper eq. 4, default) or "
        "gate = a third gate sigmoid(S_gamma) (paper eq. 3)",
    )
    group.add_argument(
        "--sas-gate-dim", type=positive_int, metavar="N",
        help="hidden size of the two-layer SAS gates (default: the model dimension h, as in the paper; "
        "e.g. 64 cuts the gates' cost ~8x at d=512)",
    )
    group.add_argument("--sas-alpha-bias-init", type=float, metavar="B",
                       help="initial output bias b_ff of the alpha (skip) gate (default: 0; the paper's image models used +3)")
    group.add_argument("--sas-beta-bias-init", type=float, metavar="B",
                       help="initial output bias b_ff of the beta (residual) gate (default: 0; the paper's image models used -3)")
    group.add_argument("--sas-gamma-bias-init", type=float, metavar="B",
                       help="initial output bias of the gamma gate with --sas-gamma gate (default: 0)")
    group.add_argument(
        "--highway-bias-init", type=float, metavar="B",
        help="initial bias b_T of the highway transform gate; negative favours the skip x at the "
        "start (default: -2)",
    )


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
        setattr(args, f"{side}_normalize_before", getattr(args, kind_key) == "pre_ln")


def side_connection_spec(cfg, side: str) -> ConnectionSpec:
    """The ConnectionSpec of ``side`` ("encoder"/"decoder") from flat model args or config."""

    def get(key: str, default=None):
        value = getattr(cfg, key, None)
        return DEFAULTS.get(key, default) if value is None else value

    gate_dim: Optional[int] = get("sas_gate_dim")
    return ConnectionSpec(
        kind=get(f"{side}_residual") or get("residual"),
        skip_lambda=float(get("skip_lambda")),
        sas_gate=get("sas_gate"),
        sas_gamma=get("sas_gamma"),
        sas_gate_dim=None if gate_dim is None else int(gate_dim),
        sas_alpha_bias_init=float(get("sas_alpha_bias_init")),
        sas_beta_bias_init=float(get("sas_beta_bias_init")),
        sas_gamma_bias_init=float(get("sas_gamma_bias_init")),
        highway_bias_init=float(get("highway_bias_init")),
        export=bool(get("export", False)),
        fused=bool(get("fused_connections", False)),
    )


def check_model_args(args) -> None:
    """Raise ConnectionConfigError (a ValueError) for any connection option out of range,
    or a fairseq option the resnmt layers do not implement."""
    for side in ("encoder", "decoder"):
        side_connection_spec(args, side)  # validates in ConnectionSpec.__post_init__
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
