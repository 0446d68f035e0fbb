"""Tiny models and data for the contract's checks: no corpus, no file to download.

A joined dictionary of 24 made-up words and 32 + 8 sentence pairs drawn from it, binarized
as fairseq-preprocess writes them (:func:`tiny_data`, made once per process in a temporary
directory); models of ``resnmt_transformer`` with d=16, 2 heads, FFN 32, built through
fairseq's own parsing (arch function included) from a case's flags (:func:`build`).
"""
import atexit
import copy
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Sequence, Tuple

import torch

WORDS = 24
SIZES = ("--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
         "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
         "--encoder-attention-heads", "2", "--decoder-attention-heads", "2")
ARCH = "resnmt_transformer"
MAX_TOKENS = 200
# how the tiny models train (the fast-path check; a checkpoint's configuration)
TRAINING = ("--task", "resnmt_translation", "--fast-path", "--cpu", "--share-all-embeddings", "--optimizer", "adam",
            "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--clip-norm", "0.5",
            "--max-tokens", str(MAX_TOKENS), "--seed", "3", "--dropout", "0.1")


def depth_flags(encoder: int, decoder: int) -> Tuple[str, ...]:
    return ("--encoder-layers", str(encoder), "--decoder-layers", str(decoder))


@functools.lru_cache(maxsize=None)
def tiny_data() -> Path:
    """A binarized EN-DE corpus of made-up words (train: 32 pairs, valid: 8), as fairseq's
    translation task reads it; removed when the process exits."""
    from fairseq.data import Dictionary, indexed_dataset

    root = Path(tempfile.mkdtemp(prefix="resnmt-contract-"))
    atexit.register(shutil.rmtree, root, True)
    vocab = Dictionary()
    for i in range(WORDS):
        vocab.add_symbol(f"w{i}", n=WORDS - i)
    for lang in ("en", "de"):
        vocab.save(str(root / f"dict.{lang}.txt"))
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 32), ("valid", 8)):
        pairs = []
        for _ in range(n):
            src = torch.randint(vocab.nspecial, len(vocab), (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
            pairs.append((src, src.flip(0)))  # the target: the source reversed
        for lang, side in (("en", 0), ("de", 1)):
            prefix = str(root / f"{split}.en-de.{lang}")
            builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(vocab))
            for pair in pairs:
                builder.add_item(torch.cat([pair[side], torch.tensor([vocab.eos()])]).int())
            builder.finalize(prefix + ".idx")
    return root


def parse(flags: Sequence[str], depth: Tuple[int, int] = (2, 2), parser=None):
    """fairseq-train's parsed flags for a tiny ``resnmt_transformer`` with ``flags``."""
    from fairseq import options

    import resnmt  # noqa: F401  (registers the model)

    argv = [str(tiny_data()), "--arch", ARCH, *SIZES, *depth_flags(*depth), *flags]
    return options.parse_args_and_arch(parser or options.get_training_parser(), input_args=argv)


def build(flags: Sequence[str], depth: Tuple[int, int] = (2, 2), seed: int = 1):
    """``(model, task, args)``: a tiny model with ``flags``, weights fixed by ``seed`` (a copy
    of the one built for these arguments first: the checks of a case build it once)."""
    model, task, args = _built(tuple(flags), tuple(depth), seed)
    return copy.deepcopy(model), task, copy.copy(args)


@functools.lru_cache(maxsize=None)
def _built(flags: Tuple[str, ...], depth: Tuple[int, int], seed: int):
    from fairseq import tasks

    args = parse(flags, depth)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    return task.build_model(args), task, args


def batch(task, n: int = 4, split: str = "valid") -> dict:
    """The first ``n`` pairs of ``split``, collated as fairseq batches them."""
    if task.datasets.get(split) is None:
        task.load_dataset(split)
    dataset = task.dataset(split)
    return dataset.collater([dataset[i] for i in range(n)])


def perturb_connections(model, seed: int = 0, scale: float = 0.3) -> None:
    """Move every parameter the connections and residual streams own off its initial value
    (ReZero's a = 0, zero-initialised dynamic weights, unit norm gains): a kind's equation
    and gradients are then tested where they are not special."""
    from resnmt.connections import SublayerConnection
    from resnmt.connections.streams import ResidualStream

    g = torch.Generator().manual_seed(seed)
    owners = [m for m in model.modules() if isinstance(m, (SublayerConnection, ResidualStream))]
    finals = [getattr(side, "layer_norm", None) for side in (model.encoder, model.decoder)]
    with torch.no_grad():
        for module in owners + [m for m in finals if m is not None]:
            for p in module.parameters(recurse=True):
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def with_model(cfg, args):
    """``cfg`` (fairseq's configuration of a tiny model's training) with the model of ``args``
    instead, as fairseq's ``convert_namespace_to_omegaconf`` puts a legacy model's flags
    there (composing a configuration takes hydra a second; the contract makes one)."""
    from argparse import Namespace

    from fairseq.dataclass.utils import _set_legacy_defaults, omegaconf_no_object_check
    from fairseq.models import ARCH_MODEL_REGISTRY
    from omegaconf import open_dict

    model = Namespace(**vars(args))
    _set_legacy_defaults(model, ARCH_MODEL_REGISTRY[args.arch])
    model._name = args.arch
    with omegaconf_no_object_check(), open_dict(cfg):
        cfg.model = model
    return cfg


@functools.lru_cache(maxsize=None)
def training_config():
    """fairseq-train's configuration of ``TRAINING`` for a tiny post-LN model, composed once
    (:func:`with_model` puts another model in it)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(parse([*TRAINING, "--residual", "post_ln"], depth=(1, 1)))
