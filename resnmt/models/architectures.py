"""Named architectures of ``resnmt_transformer``.

Sizes are fairseq's: ``*_base`` = ``transformer_wmt_en_de`` (6+6 layers, d=512, FFN 2048,
8 heads, dropout 0.1), ``*_big`` = ``transformer_vaswani_wmt_en_de_big`` (d=1024, FFN 4096,
16 heads, dropout 0.3). An arch function sets defaults only: its connection kind as
``--residual``'s and the flag values its family chooses, then fairseq's sizes; any flag
given on the command line overrides them (fairseq leaves unset flags absent, and every
default below is a ``getattr`` fallback). Everything else is decided from the flags by
:func:`~resnmt.models.model_spec.resolve_model`, which fairseq's parsing runs here so
that a bad choice stops the command before any data is read.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture as fairseq_base_sizes,
    transformer_vaswani_wmt_en_de_big as fairseq_big_sizes,
)

from resnmt.analysis.training_log import check_log_connection_stats_task
from resnmt.connections import CONNECTION_CLASSES
from resnmt.models.model_spec import resolve_model
from resnmt.models.resnmt_transformer import refuse_bad_args

MODEL = "resnmt_transformer"

# arch family -> (connection kind, the flag values the arch chooses), read from the kinds
FAMILIES = {
    cls.arch_family: (kind, dict(cls.arch_options)) for kind, cls in CONNECTION_CLASSES.items() if cls.arch_family
}
SIZES = {"base": fairseq_base_sizes, "big": fairseq_big_sizes}


def stop_on_bad_choices(args) -> None:
    """Resolve the model's choices once, at parsing, to stop with one clear line on a bad
    value (an OptionError; the model resolves them again from the same flags when it is built)."""
    refuse_bad_args(resolve_model, args)
    refuse_bad_args(check_log_connection_stats_task, args)


@register_model_architecture(MODEL, MODEL)
def resnmt_transformer(args):
    """Transformer base sizes with post-LN unless flags say otherwise."""
    fairseq_base_sizes(args)
    stop_on_bad_choices(args)


def make_arch(family: str, size: str):
    kind, options = FAMILIES[family]
    sizes = SIZES[size]

    def arch(args):
        args.residual = getattr(args, "residual", None) or kind
        for dest, value in options.items():
            if getattr(args, dest, None) is None:
                setattr(args, dest, value)
        sizes(args)
        stop_on_bad_choices(args)

    arch.__name__ = arch.__qualname__ = f"transformer_{family}_{size}"
    arch.__doc__ = f"{size} sizes, every sublayer connection {kind}" + "".join(
        f", {dest} {value}" for dest, value in options.items()
    )
    return register_model_architecture(MODEL, arch.__name__)(arch)


ARCHS = {f"transformer_{family}_{size}": make_arch(family, size) for family in FAMILIES for size in SIZES}
