"""The ``resnmt_transformer`` model: fairseq's Transformer with selectable sublayer
connections (``--residual``) and FFN activations (``--normalized-activation``)."""
import sys

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, TransformerModelBase

from resnmt.analysis.training_log import LOG_CONNECTION_STATS
from resnmt.models.encoder_decoder import ResidualTransformerDecoder, ResidualTransformerEncoder
from resnmt.models.flags import add_model_args
from resnmt.models.model_spec import record_connection_sources, resolve_model
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


def exit_on_bad_args(check, args) -> None:
    """Run ``check(args)``; on a ValueError stop the program with one argparse-style line.

    Used by the arch functions, which fairseq calls while parsing the command line, so
    a bad value stops ``fairseq-train`` before any data is loaded or file written.
    """
    try:
        check(args)
    except ValueError as err:
        prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "fairseq"
        sys.stderr.write(f"{prog}: error: {err}\n")
        raise SystemExit(2)
