"""The model flags of ``resnmt_transformer``, each declared once as a :class:`~resnmt.options.Option`.

The connection kinds declare their own flags on their classes
(:mod:`resnmt.connections`); this module declares the rest (the kind of each
side, the FFN activation, the fused path; the normalization's, ``--normalization`` and
``--dyt-alpha-init``, beside the norms in :mod:`resnmt.connections.norms`) in the same way, and puts
them all on fairseq's parser. No flag gets an argparse default (fairseq parses model
flags with ``argparse.SUPPRESS``): :func:`resnmt.models.model_spec.resolve_model` reads
each one with :meth:`Option.read`, so a configuration without a flag (a checkpoint older
than it) gets the flag's default.
"""
from dataclasses import replace

from resnmt.activations.normalized import KINDS, PAPER, SIDES, STATS_MODES, ActivationSpec
from resnmt.connections import CONNECTION_CLASSES, CONNECTION_FLAGS, CONNECTION_KINDS
from resnmt.connections.plugins import ENTRY_POINT_GROUP, ENVIRONMENT
from resnmt.connections.norms import DYT_ALPHA_INIT, NORMALIZATION
from resnmt.options import Option


def residual_help() -> str:
    """``--residual``'s help: each registered kind with its equation and source."""
    kinds = "; ".join(f"{kind}: {cls.equation} [{cls.source}]" for kind, cls in CONNECTION_CLASSES.items())
    return f"connection of every sublayer: {kinds} (default: the arch's, post_ln)"


RESIDUAL = Option("residual", "post_ln", kind="choice", choices=CONNECTION_KINDS, metavar="KIND", help=residual_help())
SIDE_RESIDUAL = {
    side: Option(f"{side}_residual", None, kind="choice", choices=CONNECTION_KINDS, metavar="KIND",
                 help=f"connection of the {side}'s sublayers (default: --residual; pre_ln with "
                 f"fairseq's --{side}-normalize-before)")
    for side in SIDES
}
CONNECTIONS = Option(
    "connections", None, metavar="MODULE_OR_FILE",
    help="connection kinds of your own: Python modules or .py files, comma-separated, imported before "
    f"--residual is read (as is {ENVIRONMENT}; an installed package registers its kinds through the "
    f"entry-point group {ENTRY_POINT_GROUP}). A model keeps the modules of the kinds it uses here, so "
    "that its checkpoint loads them",
)
FUSED_CONNECTIONS = Option(
    "fused_connections", False, kind="switch",
    help="compile SAS's combination (gate sigmoids, LN(x+F), alpha*x+beta*F+gamma*LN(x+F)) and "
    "NReLU/NSwish (statistics, normalization, output) with torch.compile (dynamic shapes: "
    "no recompilation per batch shape); same results as the eager path within float "
    "tolerance; the first batches pay the compilation (see docs/benchmarks.md). Needs "
    "torch.compile (a C++ compiler on CPU, Triton on GPU): where it is missing, the model "
    "build stops with one line saying why (no silent fallback). Off by default",
)

# ActivationSpec field -> its flag; the defaults are the spec's own
_spec = ActivationSpec
ACTIVATION_FLAGS = {
    "kind": Option(
        "normalized_activation", _spec.kind, kind="choice", choices=KINDS, metavar="{nrelu,nswish}",
        help=f"FFN activation normalized as in {PAPER}: 2*sigmoid(omega)*lambda*(f(h)-E[f(h)]) "
        "with f = ReLU (nrelu) or Swish (nswish), lambda**2 = (1/rho + 1/rho')/2, "
        "rho = Var[f(h)]/Var[h], rho' = fraction of positive h. Replaces --activation-fn "
        "in every FFN (see --encoder/decoder-unnormalized-top-layers). "
        "Unset: the plain --activation-fn",
    ),
    "stats": Option(
        "normalized_activation_stats", _spec.stats, kind="choice", choices=STATS_MODES, metavar="{instance,batch}",
        help="where mu, rho, rho' come from: 'instance' = per token over the FFN hidden "
        "features, no running state (the paper's Transformer setting); "
        "'batch' = over all real (non-padding) tokens of the mini-batch, kept as "
        f"momentum estimates used at evaluation (default: {_spec.stats})",
    ),
    "momentum": Option(
        "normalized_activation_momentum", _spec.momentum, kind="number", metavar="M",
        help=f"batch stats only: r <- m_n*r + (1-m_n)*r_batch with m_n = min(M, 1-1/n) at "
        f"the n-th update ({PAPER}, eq. 16-18); in [0, 1); default {_spec.momentum}. Note: M "
        "weights the history (PyTorch BatchNorm's momentum is 1-M)",
    ),
    "clamp_min": Option(
        "normalized_activation_clamp_min", _spec.clamp_min, kind="number", metavar="LO",
        help=f"lower bound for rho and rho' (the paper's bounds against abnormal values): "
        f"bounds lambda <= 1/sqrt(LO); > 0; default {_spec.clamp_min}",
    ),
    "clamp_max": Option(
        "normalized_activation_clamp_max", _spec.clamp_max, kind="number", metavar="HI",
        help="upper bound for rho and rho' (rho' <= 1; rho <= 1 for ReLU, <= 1.21 for "
        f"Swish, so the default {_spec.clamp_max} only catches numerical garbage); > LO",
    ),
    **{
        f"{side}_unnormalized_top_layers": Option(
            f"{side}_unnormalized_top_layers", getattr(_spec, f"{side}_unnormalized_top_layers"), kind="int",
            metavar="K",
            help=f"the top K {side} FFNs keep the unnormalized activation (ReLU for nrelu, "
            f"Swish for nswish): the paper's 'NSwish+kSwish' (NSwish in every FFN "
            f"collapsed at FFN size 2048); 0 <= K <= layers; default "
            f"{getattr(_spec, f'{side}_unnormalized_top_layers')}",
        )
        for side in SIDES
    },
}

def model_flags():
    """Every model flag, in --help's order, over the kinds registered now (the user's kinds,
    loaded after this module, included: their names and flags)."""
    kinds = tuple(CONNECTION_CLASSES)
    residual = (replace(RESIDUAL, choices=kinds, help=residual_help()),
                *(replace(flag, choices=kinds) for flag in SIDE_RESIDUAL.values()))
    return (*residual, CONNECTIONS, NORMALIZATION, DYT_ALPHA_INIT, *CONNECTION_FLAGS.values(),
            *ACTIVATION_FLAGS.values(), FUSED_CONNECTIONS)


def add_model_args(parser) -> None:
    """Add every resnmt model flag to ``parser`` (fairseq passes its model-specific
    argument group; no nested group, which argparse would leave out of --help)."""
    for flag in model_flags():
        flag.add_to(parser)


def add_activation_args(parser) -> None:
    """Add the ``--normalized-activation*`` and ``--*-unnormalized-top-layers`` flags alone."""
    for flag in ACTIVATION_FLAGS.values():
        flag.add_to(parser)
