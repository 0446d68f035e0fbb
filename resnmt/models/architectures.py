"""Named architectures of ``resnmt_transformer``.

Sizes are fairseq's: ``*_base`` = ``transformer_wmt_en_de`` (6+6 layers, d=512, FFN 2048,
8 heads, dropout 0.1), ``*_big`` = ``transformer_vaswani_wmt_en_de_big`` (d=1024, FFN 4096,
16 heads, dropout 0.3). Each arch only chooses the connection; any flag given on the
command line overrides the arch's choice (fairseq leaves unset flags absent, and every
default below is a ``getattr`` fallback).
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture as fairseq_base_sizes,
    transformer_vaswani_wmt_en_de_big as fairseq_big_sizes,
)

from resnmt.analysis.training_log import check_log_connection_stats_task
from resnmt.models.options import activation_defaults, check_model_args, connection_defaults
from resnmt.modules.connections import CONNECTION_CLASSES
from resnmt.models.resnmt_transformer import exit_on_bad_args

MODEL = "resnmt_transformer"

# arch family -> (connection kind, the flag values the arch chooses), read from the kinds
FAMILIES = {
    cls.arch_family: (kind, dict(cls.arch_options)) for kind, cls in CONNECTION_CLASSES.items() if cls.arch_family
}
SIZES = {"base": fairseq_base_sizes, "big": fairseq_big_sizes}


def resnmt_defaults(args) -> None:
    """Fill in resnmt's flags, then stop with one clear line on a bad value."""
    connection_defaults(args)
    activation_defaults(args)
    exit_on_bad_args(check_model_args, args)
    exit_on_bad_args(check_log_connection_stats_task, args)


@register_model_architecture(MODEL, MODEL)
def resnmt_transformer(args):
    """Transformer base sizes with post-LN unless flags say otherwise."""
    # fairseq's pre-LN flags are read before the size defaults set them to False
    connection_defaults(args)
    fairseq_base_sizes(args)
    resnmt_defaults(args)


def make_arch(family: str, size: str):
    kind, options = FAMILIES[family]
    sizes = SIZES[size]

    def arch(args):
        args.residual = getattr(args, "residual", None) or kind
        for dest, value in options.items():
            if getattr(args, dest, None) is None:
                setattr(args, dest, value)
        connection_defaults(args)
        sizes(args)
        resnmt_defaults(args)

    arch.__name__ = arch.__qualname__ = f"transformer_{family}_{size}"
    arch.__doc__ = f"{size} sizes, every sublayer connection {kind}" + "".join(
        f", {dest} {value}" for dest, value in options.items()
    )
    return register_model_architecture(MODEL, arch.__name__)(arch)


ARCHS = {f"transformer_{family}_{size}": make_arch(family, size) for family in FAMILIES for size in SIZES}
