"""The contract's two-rank check: a kind trains on 2 data-parallel ranks and resumes exactly.

Two processes (ranks 0 and 1, gloo over 127.0.0.1, fairseq's default DDP backend) each
build fairseq's ``Trainer`` as fairseq-train builds it, from the case's flags and the same
seed, on the tiny corpus in batches of a few sentences (:data:`MAX_TOKENS`), and train
:data:`UPDATES` updates, saving the checkpoint after update :data:`SAVE_AT` as fairseq-train
saves it (rank 0 writes ``checkpoint_last.pt``). Each rank then builds a new trainer (a
model of another seed), resumes from that checkpoint as a re-run of the command does
(``checkpoint_utils.load_checkpoint``: every rank reads the file, the epoch continues at
its batch; resnmt/training/resume.py) and trains to :data:`UPDATES` again. The resumed
updates' losses and the final weights must equal the uninterrupted run's bit for bit, on
both ranks, and the ranks' weights each other's: whatever state the kind keeps is in its
checkpoint, identical on every rank, and reduced over the ranks without a parameter left
out of DDP's buckets.

The ranks are forked from the calling process where torch runs one thread (started
afresh otherwise); a check takes about a second.
"""
import functools
import os
import socket
import tempfile
import traceback
from typing import Sequence
from unittest import mock

import torch

from resnmt.testing import tiny

UPDATES = 4
SAVE_AT = 2
MAX_TOKENS = 40  # a few sentences per batch: 8 or more batches, 4 or more updates of 2 ranks, in an epoch
WORLD = 2
# fairseq-train's flags of the tiny runs (the contract's TRAINING, on fairseq's own path)
FLAGS = (*(f for f in tiny.TRAINING if f != "--fast-path"), "--max-tokens", str(MAX_TOKENS),
         "--required-batch-size-multiple", "1", "--distributed-world-size", str(WORLD),
         "--distributed-backend", "gloo", "--distributed-no-spawn", "--device-id", "0")


@functools.lru_cache(maxsize=None)
def base_config():
    """fairseq-train's configuration of :data:`FLAGS` (a tiny post-LN model), composed once
    per process (hydra takes seconds); :func:`config` puts each case's model in it."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(tiny.parse([*FLAGS, "--residual", "post_ln"], depth=(1, 1)))


def config(flags: Sequence[str], port: int, save_dir: str):
    """The run's configuration (rank 0's; each rank sets its own), the model of ``flags``."""
    cfg = tiny.with_model(base_config(), tiny.parse([*FLAGS, *flags], depth=(1, 1)))
    cfg.distributed_training.distributed_rank = 0
    cfg.distributed_training.distributed_init_method = f"tcp://127.0.0.1:{port}"
    cfg.checkpoint.save_dir = save_dir
    cfg.task.distributed_timeout = 60
    cfg.dataset.data_buffer_size = cfg.dataset.num_workers = 0  # no prefetching thread or process: tiny batches
    return cfg


def trainer_of(cfg, seed: int):
    from fairseq import tasks
    from fairseq.trainer import Trainer

    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def train(cfg, trainer, until: int, save_at=None) -> list:
    """fairseq-train's loop, from the checkpoint in the save dir if there is one, to update
    ``until``; the exact loss of each update (``[update, loss]``)."""
    from fairseq import checkpoint_utils
    from fairseq.data import iterators

    losses = []
    _, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    while trainer.get_num_updates() < until:
        trainer.begin_epoch(epoch_itr.epoch)
        itr = iterators.GroupedIterator(epoch_itr.next_epoch_itr(shuffle=True), 1)
        for samples in itr:
            trainer.train_step(samples)
            losses.append([trainer.get_num_updates(), trainer.contract_loss])
            if trainer.get_num_updates() == save_at:
                checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
            if trainer.get_num_updates() == until:
                break
    return losses


def rank_main(cfg, rank: int, folder: str) -> None:
    """One rank: the uninterrupted run, then the resumed one; the results to ``folder``."""
    try:
        import torch.distributed as dist
        from fairseq.distributed import utils as distributed_utils
        from fairseq.trainer import Trainer

        reduce = Trainer._reduce_and_log_stats

        def probe(self, logging_outputs, sample_size, grad_norm=None):  # the update's exact loss per token
            self.contract_loss = sum(float(log["loss"]) for log in logging_outputs) / float(sample_size)
            return reduce(self, logging_outputs, sample_size, grad_norm)

        with mock.patch.object(Trainer, "_reduce_and_log_stats", probe):
            cfg.distributed_training.distributed_rank = rank
            distributed_utils.distributed_init(cfg)
            first = trainer_of(cfg, seed=1)
            losses = train(cfg, first, UPDATES, save_at=SAVE_AT)
            again = trainer_of(cfg, seed=2)
            resumed = train(cfg, again, UPDATES)
            dist.barrier()
            dist.destroy_process_group()
        result = {"losses": losses, "resumed": resumed,
                  "weights": {k: v.detach().clone() for k, v in first.model.state_dict().items()},
                  "resumed_weights": {k: v.detach().clone() for k, v in again.model.state_dict().items()}}
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
        code = 0
    except BaseException:
        with open(os.path.join(folder, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        code = 1
    os._exit(code)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compare_resumed_two_ranks(flags: Sequence[str], timeout_s: float = 300) -> None:
    """Run both ranks (:func:`rank_main`) and check what the module docstring says."""
    import multiprocessing

    import torch._dynamo  # noqa: F401  (DDP imports it: once, before the ranks fork)

    tiny.tiny_data()  # made once, before the ranks fork
    context = multiprocessing.get_context("fork" if torch.get_num_threads() == 1 else "spawn")
    with tempfile.TemporaryDirectory(prefix="resnmt-two-ranks-") as folder:
        cfg = config(flags, free_port(), os.path.join(folder, "ckpt"))
        ranks = [context.Process(target=rank_main, args=(cfg, rank, folder)) for rank in range(WORLD)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(timeout_s)
        for p in ranks:
            if p.is_alive():
                p.kill()
        errors = [open(os.path.join(folder, f"rank{r}.err")).read() for r in range(WORLD)
                  if os.path.exists(os.path.join(folder, f"rank{r}.err"))]
        assert not errors, "a rank failed:\n" + "\n".join(e[-2000:] for e in errors)
        assert all(p.exitcode == 0 for p in ranks), f"ranks ended with {[p.exitcode for p in ranks]}"
        results = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=True) for r in range(WORLD)]
    ours = results[0]
    assert [u for u, _ in ours["losses"]] == list(range(1, UPDATES + 1)), ours["losses"]
    assert ours["resumed"] == ours["losses"][SAVE_AT:], (
        f"resumed from update {SAVE_AT}, the losses differ: {ours['resumed']} vs {ours['losses'][SAVE_AT:]}")
    for name, value in ours["weights"].items():  # rank 0's whole state: its checkpoint's
        assert torch.equal(ours["resumed_weights"][name], value), f"{name} differs once resumed"
    for rank, result in enumerate(results[1:], 1):
        assert result["losses"] == ours["losses"] and result["resumed"] == ours["resumed"], f"rank {rank}'s losses"
        for name, value in ours["weights"].items():
            if not value.is_floating_point() or name.split(".")[-1].startswith(("running_", "_float")):
                continue  # batch statistics are each rank's own, as BatchNorm's without SyncBatchNorm
            assert torch.equal(result["weights"][name], value), f"rank {rank}'s {name} differs from rank 0's"
            assert torch.equal(result["resumed_weights"][name], value), f"rank {rank}'s {name} differs once resumed"
