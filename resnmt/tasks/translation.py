"""``resnmt_translation``: fairseq's translation task with a choice of length penalty.

    fairseq-generate DATA --user-dir resnmt --task resnmt_translation \\
        --path checkpoint.avg10.pt --beam 4 --lenpen-form gnmt --lenpen 0.6

``--lenpen-form gnmt`` ranks finished hypotheses by the GNMT/tensor2tensor penalty
``log P / ((5 + |Y|) / 6) ** lenpen`` that the papers used; ``fairseq`` (the default)
keeps fairseq's ``log P / |Y| ** lenpen``. Everything else is fairseq's
``translation`` task. The choice applies wherever the task builds a generator:
``fairseq-generate``, ``fairseq-interactive`` and ``fairseq-train --eval-bleu``
(with ``--eval-bleu-args '{"beam": 4, "lenpen": 0.6}'``).
See ``resnmt/decoding/sequence_generator.py`` and docs/decoding-and-evaluation.md.

One more difference from ``translation``: batches of any split other than the
training one are built with ``required_batch_size_multiple=1``. fairseq 0.12's
``batch_by_size`` drops a last batch whose size is not a multiple of
``--required-batch-size-multiple`` (default 8; fairseq issue #5036), so
``fairseq-generate --task translation`` silently leaves up to 7 test sentences
untranslated (and validation skips them). Training batches are unchanged.

And one for exact resumption: fairseq builds the training batches once, ordering
sentences of equal length under ``numpy_seed(seed + epoch)`` of the epoch at which the
iterator is created. A fresh run builds them at epoch 1; a run resumed at epoch E built
them at epoch E, so it trained on other batches than the uninterrupted run. This task
builds them as at epoch 1 whatever the starting epoch (the per-epoch shuffling of the
batches is fairseq's, unchanged), so a killed and restarted run reproduces the
uninterrupted one update for update (tests/test_resume.py).

``--fast-path`` trains on resnmt's fast path (resnmt/training/fast/): the training split's
batches in ``--shape-buckets`` static shapes, and fairseq-train's Trainer replaced by one
whose update never waits for the device (captured as CUDA graphs on a GPU).
"""
import logging
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from resnmt.analysis.training_log import attach_training_logger, training_level
from resnmt.decoding.fast_beam import BEAM_SEARCHES, FastSequenceGenerator, unsupported_options
from resnmt.decoding.sequence_generator import LENPEN_FORMS, with_gnmt_penalty
from resnmt.training.attention import use_sdpa_backends
from resnmt.training.bf16 import check_bf16_device
from resnmt.training.compile import COMPILE_BACKENDS, COMPILE_MODES, CUDA_GRAPH_MODES, compile_layers_for_training
from resnmt.training import fast
from resnmt.training.master_sync import install as fuse_master_weights


@dataclass
class ResNMTTranslationConfig(TranslationConfig):
    lenpen_form: ChoiceEnum(list(LENPEN_FORMS)) = field(
        default="fairseq",
        metadata={
            "help": "how --lenpen normalizes a finished hypothesis's log-probability "
            "log P for ranking, with |Y| its length in tokens including EOS: "
            "'fairseq' = log P / |Y|^lenpen (fairseq's default); "
            "'gnmt' = log P / ((5 + |Y|) / 6)^lenpen, the GNMT penalty tensor2tensor and "
            "the papers used (with --lenpen 0.6 --beam 4). The beam search itself is "
            "fairseq's in both cases; --unnormalized turns either off"
        },
    )
    beam_search: ChoiceEnum(list(BEAM_SEARCHES)) = field(
        default="fast",
        metadata={
            "help": "which beam search decodes (fairseq-generate, fairseq-interactive, the hub, --eval-bleu): "
            "'fast', resnmt's, the same hypotheses and scores as fairseq's, faster (resnmt/decoding/fast_beam.py; "
            "options it does not implement, such as --sampling or --prefix-size, decode with fairseq's, and a "
            "line says so); 'fairseq', fairseq's own SequenceGenerator"
        },
    )
    compile_layers: bool = field(
        default=False,
        metadata={
            "help": "train with every encoder and decoder layer compiled by torch.compile(dynamic=True) "
            "(fewer, fused kernels per update on a GPU; the first updates compile); validation and "
            "decoding stay eager (resnmt/training/compile.py)"
        },
    )
    compile_backend: ChoiceEnum(list(COMPILE_BACKENDS)) = field(
        default="inductor",
        metadata={"help": "torch.compile backend of --compile-layers (default: inductor; aot_eager and eager "
                          "trace without generating code, for checks)"},
    )
    compile_mode: ChoiceEnum(list(COMPILE_MODES)) = field(
        default="default",
        metadata={"help": "torch.compile mode of --compile-layers; reduce-overhead also replays each layer as a "
                          "CUDA graph (fewer launches; one graph per batch shape: bucket shapes with "
                          "--required-seq-len-multiple; needs --compile-backend inductor)"},
    )
    sdpa_backends: str = field(
        default="",
        metadata={"help": "comma-separated attention kernels torch may use, of flash, efficient, cudnn, math "
                          "(process-wide: training, validation, decoding); on Hopper GPUs torch prefers cudnn, "
                          "which plans every new batch shape first: 'flash,efficient,math' avoids that "
                          "(resnmt/training/attention.py). Default: torch's own choice"},
    )
    fused_master_weights: bool = field(
        default=False,
        metadata={"help": "with --fp16/--bf16, copy gradients to the float32 master weights and the weights back, "
                          "and zero the master gradients, in multi-tensor kernels instead of one per parameter "
                          "(exact); and compute the gradient norm with torch's multi-tensor norm where apex is "
                          "missing (process-wide; resnmt/training/master_sync.py)"},
    )
    fast_path: bool = field(
        default=False,
        metadata={"help": "train on the fast path: batches in --shape-buckets static shapes, an update that never "
                          "waits for the device (losses, gradient norm and the NaN/Inf check read at --log-interval), "
                          "and on CUDA each step captured once per shape as a CUDA graph; float32 or --bf16, "
                          "--optimizer adam or adam_fused (resnmt/training/fast/, docs/training.md)"},
    )
    shape_buckets: int = field(
        default=8,
        metadata={"help": "with --fast-path, how many batch shapes: sentence pairs bucketed by length at the "
                          "training set's quantiles, each bucket's batches padded to one shape"},
    )
    no_step_capture: bool = field(
        default=False,
        metadata={"help": "with --fast-path on CUDA, run the steps eagerly instead of as captured CUDA graphs"},
    )


# the options that only training reads, with their defaults
TRAINING_ONLY = {"fast_path": False, "shape_buckets": 8, "no_step_capture": False}


def training_only_flags(cfg) -> list:
    """The training-only flags of ``cfg`` set to other than their defaults, as typed (``--shape-buckets 4``)."""
    return [f"--{name.replace('_', '-')}" + ("" if isinstance(default, bool) else f" {getattr(cfg, name)}")
            for name, default in TRAINING_ONLY.items() if getattr(cfg, name, default) != default]


@register_task("resnmt_translation", dataclass=ResNMTTranslationConfig)
class ResNMTTranslationTask(TranslationTask):
    """fairseq's TranslationTask whose generators use the ``--lenpen-form`` penalty."""

    cfg: ResNMTTranslationConfig
    connection_stats = None  # the --log-connection-stats hooks, attached when training begins

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        if cfg.sdpa_backends:
            use_sdpa_backends(cfg.sdpa_backends.split(","))
        if cfg.fused_master_weights:
            fuse_master_weights()
        if cfg.fast_path:
            if cfg.shape_buckets < 1:
                raise ValueError(f"--shape-buckets {cfg.shape_buckets}: give at least 1")
            fast.install()

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        """fairseq's; with --fast-path the training split's batches come in --shape-buckets
        static shapes (resnmt/training/fast/buckets.py)."""
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if self.cfg.fast_path and split == getattr(self.cfg, "train_subset", "train"):
            from resnmt.training.fast.buckets import BucketedPairDataset

            self.datasets[split] = BucketedPairDataset(self.datasets[split], self.cfg.shape_buckets)

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq's; first, stock fairseq-train's --bf16 without torch_xla stops with one
        line naming resnmt-train (resnmt/training/bf16.py), whatever the --arch; a model loaded
        from a checkpoint (to decode) names the training-only flags given, as ignored; with
        --compile-layers the layers are compiled for training (resnmt/training/compile.py)."""
        check_bf16_device(cfg)
        ignored = training_only_flags(self.cfg) if from_checkpoint else []
        if ignored:  # a model loaded to decode (fairseq-generate, fairseq-interactive, the hub)
            logging.getLogger(__name__).warning(f"{' '.join(ignored)}: training-only, ignored when decoding")
        if self.cfg.compile_layers and not from_checkpoint and getattr(cfg, "log_connection_stats", None):
            raise ValueError("--compile-layers with --log-connection-stats: the statistics hooks are not "
                             "compiled; train with one of them")
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.compile_layers and not from_checkpoint:  # training builds; loading for decoding does not
            compile_layers_for_training(model, backend=str(self.cfg.compile_backend), mode=str(self.cfg.compile_mode))
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """fairseq's; with --compile-mode's CUDA graphs each forward and backward (each
        micro-batch of --update-freq) first starts a new step of the graphs, so that a replay
        never overwrites outputs the step still holds (the last step's backward is done)."""
        if self.cfg.compile_layers and str(self.cfg.compile_mode) in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad=ignore_grad)

    def begin_epoch(self, epoch, model):
        """Attach the ``--log-connection-stats`` hooks once, at the first training epoch
        (only training calls this; models built for decoding or analysis get none)."""
        super().begin_epoch(epoch, model)
        if self.connection_stats is None:
            self.connection_stats = attach_training_logger(model, training_level(model))

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's, but never dropping sentences of evaluation splits, and with training
        batches that do not depend on the starting epoch (see module docstring)."""
        if args:  # positional call: leave fairseq's behaviour alone
            return super().get_batch_iterator(dataset, *args, **kwargs)
        if dataset is not self.datasets.get(getattr(self.cfg, "train_subset", "train")):
            kwargs["required_batch_size_multiple"] = 1
            return super().get_batch_iterator(dataset, **kwargs)
        start_epoch = max(kwargs.pop("epoch", 1), 1)
        already_built = dataset in self.dataset_to_epoch_iter
        itr = super().get_batch_iterator(dataset, epoch=1, **kwargs)
        if not already_built:
            itr.epoch = start_epoch
        return itr

    def build_generator(
        self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None
    ):
        """fairseq's generator, its beam search resnmt's fast one (``--beam-search fast``) where
        the options allow it, and ranked by ``--lenpen-form``."""
        if seq_gen_cls is None and not getattr(args, "score_reference", False):
            refused = unsupported_options(args) + (["prefix_allowed_tokens_fn"] if prefix_allowed_tokens_fn else [])
            if self.cfg.beam_search != "fast":
                logging.getLogger(__name__).info("beam search: fairseq's (--beam-search fairseq)")
            elif refused:
                logging.getLogger(__name__).info(f"beam search: fairseq's ({' '.join(refused)}: not in the fast "
                                                 f"beam search)")
            else:
                seq_gen_cls = FastSequenceGenerator
        if self.cfg.lenpen_form == "gnmt" and not getattr(args, "score_reference", False):
            if seq_gen_cls is None:  # fairseq's own default (FairseqTask.build_generator), made here to rank it
                seq_gen_cls = SequenceGenerator
                if getattr(args, "print_alignment", False):
                    seq_gen_cls = SequenceGeneratorWithAlignment
                    extra_gen_cls_kwargs = {**(extra_gen_cls_kwargs or {}), "print_alignment": args.print_alignment}
            seq_gen_cls = with_gnmt_penalty(seq_gen_cls)
        return super().build_generator(
            models,
            args,
            seq_gen_cls=seq_gen_cls,
            extra_gen_cls_kwargs=extra_gen_cls_kwargs,
            prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        )
