"""The ``resnmt_transformer`` model: fairseq's Transformer with selectable sublayer
connections (``--residual``) and FFN activations (``--normalized-activation``)."""
import sys

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig, TransformerModel

from resnmt.analysis.training_log import add_log_connection_stats_args
from resnmt.models.encoder_decoder import ResidualTransformerDecoder, ResidualTransformerEncoder
from resnmt.models.model_spec import resolve_model
from resnmt.models.options import add_model_args
from resnmt.training.bf16 import check_bf16_device


@register_model("resnmt_transformer")
class ResidualTransformerModel(TransformerModel):
    """fairseq's Transformer (all its flags apply) whose sublayer connections and FFN
    activations are chosen with resnmt's flags. With ``--residual post_ln`` it computes
    exactly fairseq's ``transformer`` and loads its checkpoints."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_model_args(parser)
        add_log_connection_stats_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_bf16_device(args)  # stock fairseq-train --bf16 without torch_xla: one line naming resnmt-train
        return super().build_model(args, task)  # no hooks: the task attaches them in training

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return ResidualTransformerEncoder(cfg, src_dict, embed_tokens, spec=resolve_model(cfg))

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return ResidualTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention,
                                          spec=resolve_model(cfg))


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
