"""Stop a data-parallel run anywhere, continue it anywhere: fairseq 0.12.3's resumption with
several ranks, each patch below one place of fairseq (applied once by ``import resnmt``,
from the inventory in ``resnmt.fairseq_patches``).

* :func:`each_rank_reads_the_checkpoint`: a run of several ranks resumes without a flag.
  fairseq loads the checkpoint on rank 0 and broadcasts it through ``torch.save`` and
  ``torch.load``, which torch now does weights-only: the receiving ranks refuse the
  omegaconf ``DictConfig`` rank 0 made of the configuration, and the run dies. Every rank
  reads the file itself instead, with the same safe loader (nothing in it but tensors,
  plain containers and ``argparse.Namespace``, ``resnmt.checkpoints.compat``).
* :func:`record_the_data_parallel_layout`, :func:`iterators_resume_at_any_world_size`,
  :func:`say_when_the_global_batch_changes`: a checkpoint records the ranks, ``--update-freq``
  and batch size it was trained with and how many of the epoch's batches all ranks took
  together; a run of another number of ranks continues the epoch at that batch, so each
  remaining batch is seen once (fairseq counts batches per rank and repeats or skips
  some). Where the batch of an update changes, one line says so before the first update.
* :func:`bounded_process_group_timeout`: the process group's timeout is
  ``--distributed-timeout`` seconds (:data:`DEFAULT_TIMEOUT_S`), not torch's 30 minutes,
  so a hung or vanished rank stops the others within that time.
* :func:`name_a_lost_rank`: a rank whose collective fails because another rank died ends
  with one line naming the lost rank(s) and the checkpoint a re-run resumes from.
* :func:`atomic_checkpoint_copies`: fairseq writes a checkpoint atomically (a ``.tmp`` file
  renamed) but copies it to ``checkpoint_last.pt`` (and the epoch or best checkpoints) in
  place; a rank killed during that copy left a truncated ``checkpoint_last.pt``. The copy is
  written beside it and renamed over it.

The matching tests: tests/test_resume_ranks.py; docs/training.md, "Resuming".
"""
import functools
import logging
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300  # --distributed-timeout's default (torch's own: 30 minutes for gloo, 10 for NCCL)
CENSUS_S = 3.0  # how long a rank whose collective failed waits for the others to answer
LAYOUT_KEY = "data_parallel"  # extra_state: the ranks, --update-freq and batch size of the run that saved it


# ------------------------------------------------------------------ loading a checkpoint


def each_rank_reads_the_checkpoint() -> None:
    """``Trainer.load_checkpoint`` with several data-parallel ranks: every rank loads the file
    (fairseq's ``--load-checkpoint-on-all-dp-ranks``), always.

    fairseq 0.12.3 (``fairseq/trainer.py``) loads the checkpoint on rank 0 and sends it to the
    others with ``distributed_utils.broadcast_object``, which pickles it with ``torch.save``
    and unpickles it with ``torch.load``: weights-only since torch 2.6, it refuses the
    ``DictConfig`` that ``load_checkpoint_to_cpu`` made of the configuration (and fairseq's own
    tensor placeholders), so every resumed run of 2 or more ranks crashed. Reading the file on
    every rank uses the same safe loader as a single process, and unpickles nothing else; the
    run then equals the uninterrupted one exactly. (fairseq already needs every rank to see
    the save dir: each checks that the checkpoint exists.)"""
    from fairseq.trainer import Trainer

    load = Trainer.load_checkpoint

    @functools.wraps(load)
    def load_checkpoint(self, *args, **kwargs):
        cfg = self.cfg.checkpoint
        if self.data_parallel_world_size == 1 or cfg.load_checkpoint_on_all_dp_ranks:
            return load(self, *args, **kwargs)
        cfg.load_checkpoint_on_all_dp_ranks = True
        try:
            return load(self, *args, **kwargs)
        finally:
            cfg.load_checkpoint_on_all_dp_ranks = False

    Trainer.load_checkpoint = load_checkpoint


# ------------------------------------------------------------------ another number of ranks


def epoch_update_freq(update_freq, epoch: int) -> int:
    """``--update-freq`` of ``epoch`` as fairseq-train reads it (one value per epoch, the last repeated)."""
    update_freq = list(update_freq)
    return int(update_freq[epoch - 1] if epoch <= len(update_freq) else update_freq[-1])


def data_parallel_layout(trainer) -> dict:
    """The ranks, ``--update-freq`` (per epoch) and batch size of ``trainer``'s run."""
    cfg = trainer.cfg
    return {"world_size": int(trainer.data_parallel_world_size),
            "update_freq": [int(f) for f in cfg.optimization.update_freq],
            "max_tokens": cfg.dataset.max_tokens, "batch_size": cfg.dataset.batch_size}


def record_the_data_parallel_layout() -> None:
    """``Trainer.state_dict``'s ``extra_state`` gains ``data_parallel``
    (:func:`data_parallel_layout`): what a resumed run compares its own with. fairseq 0.12.3
    records none of it (only the configuration, whose world size is not the data-parallel one
    under model parallelism); stock fairseq ignores the key."""
    from fairseq.trainer import Trainer

    state_dict = Trainer.state_dict

    @functools.wraps(state_dict)
    def with_layout(self, *args, **kwargs):
        state = state_dict(self, *args, **kwargs)
        state.setdefault("extra_state", {})[LAYOUT_KEY] = data_parallel_layout(self)
        return state

    Trainer.state_dict = with_layout


def resume_point(state: dict, num_shards: int, num_batches: int):
    """Where a run of ``num_shards`` ranks continues an epoch whose iterator state is
    ``state`` (``EpochBatchIterator.state_dict`` with this module's keys), the epoch having
    ``num_batches`` batches now: ``(iterations, shift, note)``. Each rank skips ``iterations``
    of its batches after the first ``shift`` of the epoch's batches are left out (0 but where
    the batches taken so far are not a multiple of the ranks); ``note`` says, where the
    epoch's batches are other than the checkpoint's, how the place was found (else None)."""
    done = state.get("batches_done", state["iterations_in_epoch"] * state["num_shards"])
    before, note = state.get("batches_in_epoch", num_batches), None
    if before != num_batches:  # other --max-tokens, --batch-size or data: other batches
        done_now = min(num_batches - 1, round(done * num_batches / before))
        note = (f"epoch {state['epoch']} now has {num_batches} batches, the checkpoint's run had {before} (other "
                f"--max-tokens, --batch-size or data): the run skips the first {done_now}, the share of the epoch "
                f"done ({done} of {before}); sentences of the epoch may be seen twice or not at all")
        done = done_now
    iterations, shift = divmod(done, num_shards)
    return iterations, shift, note


def iterators_resume_at_any_world_size() -> None:
    """fairseq's ``EpochBatchIterator`` resumes an epoch on any number of ranks.

    Every rank shuffles the epoch's batches alike and takes every W-th (W ranks), so an
    update of W ranks x ``--update-freq`` F takes the next W x F batches of that one order,
    and the checkpoint's ``iterations_in_epoch`` counts one rank's batches. fairseq 0.12.3
    (``fairseq/data/iterators.py``) skips that many batches on each rank of the resumed run
    whatever its number of ranks: 2 ranks resumed on 1 saw half the remaining batches twice.

    The state gains ``num_shards``, ``batches_done`` (the batches all ranks took) and
    ``batches_in_epoch``; on load, a run of W' ranks continues at the same batch of the
    order (:func:`resume_point`): with W' dividing the batches done, fairseq's own offset of
    ``batches_done / W'``; otherwise the epoch's order without its first ``batches_done mod
    W'`` batches is dealt to the ranks (for that epoch only). Every remaining batch is seen
    once; a state without these keys (stock fairseq's) loads as before."""
    from fairseq.data import iterators

    cls = iterators.EpochBatchIterator
    state_dict, load_state_dict, ordered_batches = cls.state_dict, cls.load_state_dict, cls.ordered_batches

    def shift_of(self, epoch) -> int:
        return getattr(self, "resnmt_shift", {}).get(epoch, 0)

    @functools.wraps(state_dict)
    def state_dict_(self):
        state = state_dict(self)
        state["num_shards"] = self.num_shards
        if state["iterations_in_epoch"] > 0:
            state["batches_done"] = shift_of(self, state["epoch"]) + state["iterations_in_epoch"] * self.num_shards
            state["batches_in_epoch"] = len(self.frozen_batches)
        return state

    @functools.wraps(load_state_dict)
    def load_state_dict_(self, state):
        self.resnmt_shift = {}
        if state.get("num_shards") is None or state.get("iterations_in_epoch", 0) <= 0:
            return load_state_dict(self, state)
        self.epoch = state["epoch"]  # the epoch's batches (rebuilt per epoch with --rebuild-batches)
        iterations, shift, note = resume_point(state, self.num_shards, len(self.frozen_batches))
        if note is not None and self.shard_id == 0:
            logger.warning(note)
        if state["num_shards"] != self.num_shards and self.shard_id == 0:
            logger.info(f"epoch {state['epoch']}: {state.get('batches_done')} of its batches were taken by "
                        f"{state['num_shards']} rank(s); {self.num_shards} rank(s) take the rest, each batch once")
        if shift:
            self.resnmt_shift = {state["epoch"]: shift}
        return load_state_dict(self, dict(state, iterations_in_epoch=iterations))

    @functools.wraps(ordered_batches)
    def ordered_batches_(self, epoch, fix_batches_to_gpus, shuffle):
        shift = shift_of(self, epoch)
        if not shift:
            return ordered_batches(self, epoch, fix_batches_to_gpus, shuffle)
        shards, shard = self.num_shards, self.shard_id
        self.num_shards, self.shard_id = 1, 0  # the epoch's whole order, shuffled as fairseq does
        try:
            batches = ordered_batches(self, epoch, fix_batches_to_gpus, shuffle)
        finally:
            self.num_shards, self.shard_id = shards, shard
        return list(iterators.ShardedIterator(batches[shift:], shards, shard, fill_value=[]))

    cls.state_dict, cls.load_state_dict, cls.ordered_batches = state_dict_, load_state_dict_, ordered_batches_


def global_batch(layout: dict, epoch: int) -> tuple:
    """``(ranks, update-freq, max-tokens, batch-size)`` of ``layout`` in ``epoch``."""
    return (layout["world_size"], epoch_update_freq(layout["update_freq"], epoch), layout["max_tokens"],
            layout["batch_size"])


def describe(batch: tuple) -> str:
    ranks, freq, tokens, sentences = batch
    words = [f"{ranks} rank{'s' if ranks != 1 else ''}", f"--update-freq {freq}"]
    words += [f"--max-tokens {tokens}"] if tokens else []
    words += [f"--batch-size {sentences}"] if sentences else []
    return " x ".join(words)


def global_batch_change(before: dict, now: dict, epoch: int):
    """One line saying what a run of layout ``now`` resuming a checkpoint of layout ``before``
    in ``epoch`` does, where an update's batch changes; None where it is the same."""
    old, new = global_batch(before, epoch), global_batch(now, epoch)
    if old[2:] == new[2:] and old[0] * old[1] == new[0] * new[1]:
        return None
    per_update = ""
    if old[2:] == new[2:]:
        per_update = (f": each update takes {new[0] * new[1]} batches of the epoch's order instead of "
                      f"{old[0] * old[1]}")
    return (f"resuming a run of {describe(old)} on {describe(new)}{per_update}; the rest of epoch {epoch} is "
            f"seen once and the learning-rate schedule goes on by updates, so the losses will differ from "
            f"the run's had it gone on unchanged")


def say_when_the_global_batch_changes() -> None:
    """After ``Trainer.load_checkpoint``, rank 0 logs one line where the checkpoint's
    ranks x ``--update-freq`` x ``--max-tokens`` (or ``--batch-size``) differ from the
    resumed run's (:func:`global_batch_change`), before any update; where only their split
    changes (2 ranks x 1 -> 1 rank x 2) the updates are the same and an info line says so."""
    from fairseq.trainer import Trainer

    load = Trainer.load_checkpoint

    @functools.wraps(load)
    def load_checkpoint(self, *args, **kwargs):
        extra_state = load(self, *args, **kwargs)
        before = (extra_state or {}).get(LAYOUT_KEY)
        if before is None or "train_iterator" not in extra_state or self.data_parallel_rank != 0:
            return extra_state
        now, epoch = data_parallel_layout(self), int(extra_state["train_iterator"]["epoch"])
        change = global_batch_change(before, now, epoch)
        if change is not None:
            logger.warning(change)
        elif before["world_size"] != now["world_size"]:
            logger.info(f"resuming a run of {describe(global_batch(before, epoch))} on "
                        f"{describe(global_batch(now, epoch))}: the same batches per update")
        return extra_state

    Trainer.load_checkpoint = load_checkpoint


# ------------------------------------------------------------------ a lost rank


def bounded_process_group_timeout() -> None:
    """fairseq's ``distributed_init`` creates the process group, and every group made after it
    in the process (fairseq's global and data-parallel groups), with a timeout of
    ``--distributed-timeout`` seconds (resnmt_translation's; :data:`DEFAULT_TIMEOUT_S` with
    another task): a collective that waits longer for a rank that hangs or vanished raises
    instead of blocking. fairseq 0.12.3 passes none, so torch's default applies: 30 minutes
    of every other rank's time for gloo, 10 for NCCL. Everything else is fairseq's."""
    from fairseq.distributed import utils as distributed_utils

    init = distributed_utils.distributed_init

    @functools.wraps(init)
    def distributed_init(cfg):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        timeout = timedelta(seconds=timeout_of(cfg))
        # the groups fairseq makes later (its global and data-parallel groups: dist.new_group)
        # take torch's default, not the default group's timeout
        distributed_c10d.default_pg_timeout = distributed_c10d.default_pg_nccl_timeout = timeout
        create = dist.init_process_group
        dist.init_process_group = functools.partial(init_process_group, create, timeout)
        try:
            return init(cfg)
        finally:
            dist.init_process_group = create

    distributed_utils.distributed_init = distributed_init


def init_process_group(create, timeout, backend=None, init_method=None, world_size=-1, rank=-1, **kwargs):
    """torch's ``init_process_group`` (``create``) with ``timeout``; under torchrun
    (``env://`` with the agent's store) in a store of this attempt's own.

    torchrun's static rendezvous (``--master-addr``/``--master-port``) keeps one store over
    its restarts, and torch's ``env://`` joins it without a prefix per attempt: the ranks of
    a restarted run read the addresses the previous attempt's ranks left there and fail to
    connect (gloo: ``connectFullMesh failed ... Connection refused``), so ``--max-restarts``
    could never resume a run. The ranks meet under ``resnmt/attempt_N`` instead
    (``TORCHELASTIC_RESTART_COUNT``)."""
    if init_method == "env://" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        from torch.distributed import PrefixStore, TCPStore

        agent = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, False,
                         timeout=timeout)
        store = PrefixStore(f"resnmt/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)
        return create(backend=backend, store=store, world_size=world_size, rank=rank, timeout=timeout, **kwargs)
    return create(backend=backend, init_method=init_method, world_size=world_size, rank=rank, timeout=timeout,
                  **kwargs)


def timeout_of(cfg) -> float:
    """``--distributed-timeout`` of ``cfg`` (:data:`DEFAULT_TIMEOUT_S` where its task has
    none); a value not above 0 stops the rank in one line (``LaunchError``)."""
    task = getattr(cfg, "task", None)
    seconds = getattr(task, "distributed_timeout", None) if task is not None else None
    seconds = float(seconds if seconds is not None else DEFAULT_TIMEOUT_S)
    if not seconds > 0:
        from resnmt.training.launch import LaunchError

        raise LaunchError(f"--distributed-timeout {seconds:g}: must be a number of seconds > 0")
    return seconds


# what torch's collectives say when a peer is gone or silent (gloo's pair.cc, NCCL's watchdog)
COMMUNICATION_ERRORS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out waiting",
                        "gloo", "nccl", "processgroup", "watchdog")


def communication_failed(error: BaseException) -> bool:
    """Whether ``error`` is what a collective raises when a peer is gone or silent."""
    import torch.distributed as dist

    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in COMMUNICATION_ERRORS)


def silent_ranks(wait_s: float = CENSUS_S) -> list:
    """The ranks that do not answer within ``wait_s`` seconds, asked through the process
    group's store (every rank whose collective failed answers, then waits for the others);
    ``[0]`` where the store itself is gone (rank 0 hosts it under ``tcp://`` and ``env://``
    init), None where there is no store to ask."""
    import torch.distributed as dist

    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store, rank, world = _get_default_store(), dist.get_rank(), dist.get_world_size()
    except Exception:
        return None
    prefix = "resnmt/alive/"
    try:
        store.set_timeout(timedelta(seconds=max(1.0, wait_s)))
        store.set(prefix + str(rank), "1")
        keys = [prefix + str(r) for r in range(world)]
        deadline = time.monotonic() + wait_s
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.1)
        silent = [r for r, key in enumerate(keys) if not store.check([key])]
        if rank == 0 and silent:  # the store lives in this process: let the others finish asking
            time.sleep(1.0)
        return silent
    except Exception:
        return [0] if rank != 0 else None


def resume_checkpoint(cfg) -> str:
    """The checkpoint a re-run of ``cfg``'s command resumes from, as fairseq's
    ``checkpoint_utils.load_checkpoint`` chooses it, with its epoch and update."""
    ckpt = cfg.checkpoint
    suffix = ckpt.checkpoint_suffix or ""
    if ckpt.restore_file == "checkpoint_last.pt":
        path = os.path.join(ckpt.save_dir, f"checkpoint_last{suffix}.pt")
    else:
        path = ckpt.restore_file.replace(".pt", suffix + ".pt")
    if not os.path.isfile(path):
        return f"the beginning ({path} does not exist yet)"
    try:
        import torch

        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        updates = state["optimizer_history"][-1]["num_updates"]
        itr = state["extra_state"]["train_iterator"]
        return f"{path} (epoch {itr['epoch']}, {updates} updates)"
    except Exception:
        return path


def name_a_lost_rank() -> None:
    """fairseq's ``distributed_main`` (each rank's training, whatever the launcher) ends with
    one line, ``fairseq-train: error: rank R of W lost (...); training stopped, and a re-run
    of the same command resumes from CHECKPOINT (epoch E, U updates)``, exit status 1, where
    a collective failed because another rank
    died or stopped answering within ``--distributed-timeout`` (the ranks still alive are
    found through the process group's store, :func:`silent_ranks`). Any other error is
    raised as before (its rank dies; the others then say it was lost)."""
    from fairseq.distributed import utils as distributed_utils

    main = distributed_utils.distributed_main
    if getattr(main, "resnmt_lost_rank", False):
        return
    distributed_main.resnmt_wrapped = main
    distributed_main.resnmt_lost_rank = True
    distributed_utils.distributed_main = distributed_main


def distributed_main(i, main, cfg, kwargs):
    """fairseq's ``distributed_main`` (module-level, so that ``torch.multiprocessing.spawn``
    finds it in the processes it starts): see :func:`name_a_lost_rank`."""
    import torch.distributed as dist

    wrapped = getattr(distributed_main, "resnmt_wrapped", None)
    if wrapped is None:  # a process started by spawn imports resnmt afresh
        name_a_lost_rank()
        wrapped = distributed_main.resnmt_wrapped
    try:
        return wrapped(i, main, cfg, kwargs)
    except Exception as error:
        if not (dist.is_available() and dist.is_initialized()) or not communication_failed(error):
            raise
        silent = silent_ranks()
        if not silent:  # every rank answered (or none could be asked): not a lost rank
            raise
        print(lost_rank_message(silent, dist.get_world_size(), timeout_of(cfg), resume_checkpoint(cfg)),
              file=sys.stderr, flush=True)
        sys.exit(1)


def lost_rank_message(silent, world: int, timeout_s: float, checkpoint: str) -> str:
    ranks = f"rank {silent[0]}" if len(silent) == 1 else "ranks " + ", ".join(map(str, silent))
    return (f"{os.path.basename(sys.argv[0]) or 'fairseq-train'}: error: {ranks} of {world} lost (its connection "
            f"closed, or no answer within --distributed-timeout {timeout_s:g} s); training stopped, and a re-run "
            f"of the same command resumes from {checkpoint}")


# ------------------------------------------------------------------ writing checkpoints


def atomic_checkpoint_copies() -> None:
    """fairseq's ``PathManager.copy`` of a local file (``checkpoint_utils.save_checkpoint``
    copies the checkpoint it wrote to ``checkpoint_last.pt``, ``checkpointN.pt``,
    ``checkpoint_best.pt``) writes a temporary file beside the destination and renames it
    over it, so a process killed while copying leaves the previous file whole. fairseq
    0.12.3 (``fairseq/file_io.py``) copies onto the destination itself (``shutil.copyfile``
    without iopath), and a rank killed meanwhile left a truncated ``checkpoint_last.pt``
    that the re-run could not load. Remote paths (iopath's handlers) are copied as before."""
    from fairseq.file_io import PathManager

    copy = PathManager.copy

    def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
            return copy(src_path, dst_path, overwrite=overwrite)
        folder = os.path.dirname(os.path.abspath(dst_path))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(dst_path)}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(src_path, tmp)
            shutil.copymode(src_path, tmp)
            os.replace(tmp, dst_path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return True

    PathManager.copy = staticmethod(atomic_copy)
