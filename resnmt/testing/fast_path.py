"""The contract's fast-path check: ``--fast-path``'s update against fairseq's own step.

Two trainers are built as fairseq-train builds them, from the same flags and seed: fairseq's
``Trainer`` and resnmt's ``FastPathTrainer`` (resnmt/training/fast). They take the same
batches of the tiny corpus, with dropout and gradient clipping on; each update's loss
(fairseq's read where it reduces its logging outputs) and the weights afterwards must agree.
fairseq's model attends through the fast path's SDPA calls too, so that the update is what is
compared: the attention is compared on its own (tests/test_fast_attention.py), and Adam
would turn the rounding noise of a gradient that is zero by the math (a key projection's
bias: softmax ignores a shift of every score in a row) into a difference of a whole step.
"""
import math
from typing import List, Sequence
from unittest import mock

import torch

from resnmt.testing import tiny

UPDATES = 3
MAX_TOKENS = tiny.MAX_TOKENS


def config(flags: Sequence[str]):
    """fairseq-train's configuration of ``TRAINING`` with the model of ``flags``."""
    return tiny.with_model(tiny.training_config(), tiny.parse([*tiny.TRAINING, *flags], depth=(1, 1)))


def build_trainer(trainer_cls, cfg):
    from fairseq import tasks, utils

    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return trainer_cls(cfg, task, model, task.build_criterion(cfg.criterion)), task


def batches(task) -> List[dict]:
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=MAX_TOKENS, seed=3, epoch=1,
                                  required_batch_size_multiple=8, max_positions=(1024, 1024))
    return list(itr.next_epoch_itr(shuffle=True))


def compare_with_fairseq(flags: Sequence[str]) -> None:
    """``UPDATES`` updates of both trainers on the same batches: equal losses and weights."""
    from fairseq.trainer import Trainer

    from resnmt import fairseq_patches
    from resnmt.training.fast.attention import use_sdpa_attention
    from resnmt.training.fast.step import FastPathTrainer

    reduce = Trainer._reduce_and_log_stats

    def probe(self, logging_outputs, sample_size, grad_norm=None):  # the update's exact loss per token
        self.contract_loss = sum(float(log["loss"]) for log in logging_outputs) / float(sample_size)
        return reduce(self, logging_outputs, sample_size, grad_norm)

    try:
        with mock.patch.object(Trainer, "_reduce_and_log_stats", probe):
            cfg = config(flags)
            ref, task = build_trainer(Trainer, cfg)
            use_sdpa_attention(ref.model)
            ours, _ = build_trainer(FastPathTrainer, cfg)
            data = batches(task)
            for i in range(UPDATES):
                ref.train_step([data[i % len(data)]])
                out = ours.train_step([data[i % len(data)]])
                loss = float(out["loss"]) / out["sample_size"]
                assert math.isclose(loss, ref.contract_loss, rel_tol=1e-6), (i, loss, ref.contract_loss)
    finally:
        fairseq_patches.remove("fast-path-trainer")  # a --fast-path task makes fairseq's Trainer the fast one, process-wide
    for (name, p), q in zip(ref.model.named_parameters(), ours.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=name)
