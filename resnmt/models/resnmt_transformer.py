"""The ``resnmt_transformer`` model: fairseq's Transformer with selectable sublayer
connections (``--residual``) and FFN activations (``--normalized-activation``)."""
import sys

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, TransformerModelBase

from resnmt.analysis.training_log import LOG_CONNECTION_STATS
from resnmt.connections.plugins import command_line_sources, load_user_kinds
from resnmt.models.encoder_decoder import ResidualTransformerDecoder, ResidualTransformerEncoder
from resnmt.models.flags import add_model_args
from resnmt.models.model_spec import record_connection_sources, resolve_model
from resnmt.options import OptionError
from resnmt.training.bf16 import check_bf16_device


class ResolvedChoices(TransformerModelBase):
    """The step of the build that resolves the model's choices, once per model.

    fairseq's ``TransformerModel.build_model`` turns the flags into the model's
    ``TransformerConfig`` and hands it to ``TransformerModelBase.build_model``, which builds
    the embeddings and then the stacks through ``build_encoder``/``build_decoder``. Placed
    between the two (``ResidualTransformerModel``'s bases), this resolves the configuration
    into a :class:`~resnmt.models.model_spec.ModelSpec` and adds it to that configuration as
    ``cfg.model_spec``, which fairseq hands to both stacks' builders. The flags themselves
    (what checkpoints keep) are not touched.
    """

    @classmethod
    def build_model(cls, cfg, task):
        cfg.model_spec = resolve_model(cfg)
        return super().build_model(cfg, task)


@register_model("resnmt_transformer")
class ResidualTransformerModel(TransformerModel, ResolvedChoices):
    """fairseq's Transformer (all its flags apply) whose sublayer connections and FFN
    activations are chosen with resnmt's flags. With ``--residual post_ln`` it computes
    exactly fairseq's ``transformer`` and loads its checkpoints."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_model_args(parser)
        LOG_CONNECTION_STATS.add_to(parser)  # a model flag: no default (fairseq SUPPRESSes them)

    @classmethod
    def build_model(cls, args, task):
        check_bf16_device(args)  # stock fairseq-train --bf16 without torch_xla: one line naming resnmt-train
        model = super().build_model(args, task)  # no hooks: the task attaches them in training
        # the modules of the user's kinds, in the flags a checkpoint keeps
        record_connection_sources(args, [model.encoder.connection_spec.kind, model.decoder.connection_spec.kind])
        return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return ResidualTransformerEncoder(cfg, src_dict, embed_tokens, spec=cfg.model_spec)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return ResidualTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention,
                                          spec=cfg.model_spec)


def refuse_bad_args(check, args) -> None:
    """Run ``check(args)``; its ValueError as an OptionError (the same one-line message).

    Used by the arch functions, which fairseq calls while parsing the command line (where
    :func:`load_user_kinds_when_parsing` makes it one ``PROG: error:`` line, exit status 2,
    before any data is loaded or file written) and when it builds a model (from Python, the
    hub, a checkpoint: the exception)."""
    try:
        check(args)
    except OptionError:
        raise
    except ValueError as err:
        raise OptionError(str(err)) from None


def load_user_kinds_when_parsing() -> None:
    """fairseq's ``options.parse_args_and_arch`` (every fairseq command's parsing) first imports
    the user's connection modules its arguments name with ``--connections`` (and those of
    ``RESNMT_CONNECTIONS``: :func:`resnmt.connections.plugins.load_user_kinds`), so that
    ``--residual`` offers their kinds and the kinds' flags are on the parser; a module that
    fails, and an OptionError of the arch functions' checks, end the command with one line
    ``PROG: error: MESSAGE`` and exit status 2, as argparse's errors do. Arguments without
    them parse as fairseq's own. The ``user-kinds-when-parsing`` patch (resnmt.fairseq_patches)."""
    from fairseq import options

    parse = options.parse_args_and_arch

    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        try:
            load_user_kinds(command_line_sources(sys.argv[1:] if input_args is None else input_args))
            return parse(parser, input_args, *args, **kwargs)
        except OptionError as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")

    parse_args_and_arch.__doc__ = parse.__doc__
    options.parse_args_and_arch = parse_args_and_arch
