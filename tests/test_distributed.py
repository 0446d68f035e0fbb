"""Data-parallel training on the CPU: 2 ranks over gloo, through fairseq-train's own
entry point (``fairseq_cli.train.cli_main``) with ``--user-dir resnmt``.

fairseq saves checkpoints on rank 0 only, so each rank runs a small driver (PROBE below)
that calls the real fairseq-train entry point with two read-only hooks:

* ``Trainer._reduce_and_log_stats`` (called once per update with the logging outputs
  already summed over the ranks) appends the exact loss of the update, ``loss_sum /
  sample_size`` in nats, to ``PROBE_OUT/loss.rankR.jsonl`` (fairseq's own log rounds
  to 3 decimals);
* ``checkpoint_utils.save_checkpoint`` (called on every rank) first writes the rank's
  model state_dict to ``PROBE_OUT/state.rankR.pt``;
* ``Trainer.train_step`` notes the sentence ids of the update's batches on this rank
  and ``Trainer.begin_epoch`` the epoch (``ids`` and ``epoch`` in the loss record);
* ``PROBE_STOP=RANKS@UPDATE:HOW`` (tests/test_resume_ranks.py) stops the listed ranks
  (``0,1``) right after update UPDATE: ``KILL`` (SIGKILL), ``STOP`` (SIGSTOP: a hung
  rank), or ``COPY``: killed (SIGKILL) half-way through copying the checkpoint saved at
  that update to ``checkpoint_last.pt`` (the copy primitive, ``shutil.copyfile``); in the
  first attempt of a torchrun run only.

Checks: both ranks end with bit-identical parameters; for SAS the per-update losses and
the final parameters match a single process that accumulates the same two batches per
update (``--update-freq 2``), which is what all-reduced gradients must give.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, built_once, cli_env, run_cli
from model_utils import TINY

USER_DIR = str(REPO_ROOT / "resnmt")

PROBE = r'''
"""fairseq-train with probes (exact per-update loss, per-rank final state). Test-only."""
import json
import os
import shutil
import signal
import sys

import torch
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer
from fairseq_cli import train as train_cli

OUT = os.environ["PROBE_OUT"]
os.makedirs(OUT, exist_ok=True)

_reduce = Trainer._reduce_and_log_stats


def _reduce_and_log_stats(self, logging_outputs, sample_size, grad_norm=None):
    if grad_norm is not None and logging_outputs:  # a training update, not validation
        loss = sum(float(log.get("loss", 0.0)) for log in logging_outputs)
        nll = sum(float(log.get("nll_loss", 0.0)) for log in logging_outputs)
        size = float(sample_size)
        record = {"update": self.get_num_updates(), "loss": loss / size, "nll_loss": nll / size,
                  "sample_size": size, "pid": os.getpid(), "ids": getattr(self, "probe_ids", None),
                  "epoch": getattr(self, "probe_epoch", None)}
        with open(os.path.join(OUT, "loss.rank%d.jsonl" % self.data_parallel_rank), "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
    return _reduce(self, logging_outputs, sample_size, grad_norm)


Trainer._reduce_and_log_stats = _reduce_and_log_stats
_save = checkpoint_utils.save_checkpoint
# RANKS@UPDATE:HOW, in a run's first attempt only (torchrun's restarts do not stop again)
STOP = os.environ.get("PROBE_STOP") if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" else None
STOP_RANKS, STOP_AT, STOP_HOW = None, None, None
if STOP:
    where, STOP_HOW = STOP.split(":")
    ranks, update = where.split("@")
    STOP_RANKS, STOP_AT = {int(r) for r in ranks.split(",")}, int(update)
saving = {"updates": None, "rank": None}


def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    path = os.path.join(OUT, "state.rank%d.pt" % trainer.data_parallel_rank)
    state = {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()}
    torch.save({"model": state, "num_updates": trainer.get_num_updates()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    saving.update(updates=trainer.get_num_updates(), rank=trainer.data_parallel_rank)
    return _save(cfg, trainer, epoch_itr, val_loss)


checkpoint_utils.save_checkpoint = save_checkpoint
_train_step = Trainer.train_step


def train_step(self, samples, *args, **kwargs):
    self.probe_ids = sorted(int(i) for s in samples if s for i in s["id"])
    result = _train_step(self, samples, *args, **kwargs)
    if STOP_HOW in ("KILL", "STOP") and self.data_parallel_rank in STOP_RANKS and self.get_num_updates() == STOP_AT:
        sys.stdout.flush(); sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL if STOP_HOW == "KILL" else signal.SIGSTOP)
    return result


Trainer.train_step = train_step
_begin_epoch = Trainer.begin_epoch


def begin_epoch(self, epoch):
    self.probe_epoch = epoch
    return _begin_epoch(self, epoch)


Trainer.begin_epoch = begin_epoch
_copyfile = shutil.copyfile


def copyfile(src, dst, *args, **kwargs):
    """Killed half-way through copying the checkpoint of update STOP_AT to checkpoint_last.pt."""
    if (STOP_HOW == "COPY" and saving["rank"] in STOP_RANKS and saving["updates"] == STOP_AT
            and "checkpoint_last" in os.path.basename(dst)):
        with open(src, "rb") as f:
            data = f.read()
        with open(dst, "wb") as f:
            f.write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return _copyfile(src, dst, *args, **kwargs)


shutil.copyfile = copyfile


if __name__ == "__main__":
    sys.argv = ["fairseq-train"] + sys.argv[1:]
    sys.exit(train_cli.cli_main())
'''

ARCHS = {
    "sas": ["--arch", "transformer_sas_base"],
    "nswish_batch": ["--arch", "transformer_postln_base", "--normalized-activation", "nswish",
                     "--normalized-activation-stats", "batch"],
}


def write_probe(directory: Path) -> Path:
    path = directory / "fairseq_train_probe.py"
    path.write_text(PROBE)
    return path


def probe_train_args(probe, data, save_dir, arch_args, *extra, cpu=True):
    """Tiny model, no dropout (so ranks and a single process see the same masks); on
    the CPU unless ``cpu`` is False (then on the CUDA device)."""
    return [
        sys.executable, probe, data, "--user-dir", USER_DIR, "--task", "resnmt_translation",
        *arch_args, *TINY, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
        "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", "600", "--save-dir", save_dir, "--no-progress-bar", "--log-format", "json",
        "--log-interval", "1", "--seed", "3", "--num-workers", "0", *(["--cpu"] if cpu else []), *extra,
    ]


def sas_two_epochs(tiny_bin, tmp_path_factory) -> Path:
    """Two epochs of the tiny SAS model through fairseq-train's probe on the CPU, built once
    per test run and shared (tests only read it): ``run/`` its save dir, ``probe/`` the
    probe's output."""
    def two_epochs(root):
        run_cli(probe_train_args(write_probe(root), tiny_bin, root / "run", ARCHS["sas"], "--max-epoch", "2"),
                PROBE_OUT=str(root / "probe"))

    return built_once(tmp_path_factory, "sas_two_epochs", two_epochs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_losses(path: Path) -> dict:
    """{update: loss}; a later record of the same update (after a restart) wins."""
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["update"]] = rec["loss"]
    return out


def run_two_ranks(probe, data, save_dir, out, arch_args, max_update, *extra, cpu=True):
    """Two ranks over gloo, each its own process (``--device-id 0`` for both: on a GPU
    they share it)."""
    port = free_port()
    procs = []
    for rank in range(2):
        args = probe_train_args(
            probe, data, save_dir, arch_args, "--max-update", str(max_update),
            "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo",
            "--distributed-world-size", "2", "--distributed-num-procs", "1", "--distributed-rank", str(rank),
            "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn", "--device-id", "0",
            *extra, cpu=cpu,
        )
        procs.append(subprocess.Popen(
            [str(a) for a in args], cwd=str(REPO_ROOT), env=cli_env(PROBE_OUT=str(out)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
    return logs


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_two_cpu_ranks_train_in_lockstep(tiny_bin, tmp_path, name):
    probe = write_probe(tmp_path)
    arch_args = ARCHS[name]
    max_update = 6
    dist_out, dist_ckpt = tmp_path / "dist", tmp_path / "dist_ckpt"
    run_two_ranks(probe, tiny_bin, dist_ckpt, dist_out, arch_args, max_update)

    states = [torch.load(dist_out / f"state.rank{r}.pt", weights_only=True) for r in range(2)]
    assert states[0]["num_updates"] == states[1]["num_updates"] == max_update
    params = [dict(s["model"]) for s in states]
    assert params[0].keys() == params[1].keys()
    trained = {n for n, _ in _named_parameters(params[0])}
    for name_ in trained:
        assert torch.equal(params[0][name_], params[1][name_]), f"{name_} differs between the ranks"
    # the training moved every weight tensor away from its initial value (fairseq-train's,
    # rebuilt from the same flags and seed): Adam's first update alone moves each weight that
    # gets a gradient by that update's lr, 2.5e-4 (1e-3 after 4 warm-up updates), and 6 updates
    # by at most about the lrs' sum, 4.2e-3 (a rebuild with other weights would be far off).
    # Not the key projections' biases, whose gradient is zero but for rounding (softmax ignores
    # a shift of a row's scores), nor fairseq's version buffers.
    initial = initial_state(probe_train_args(probe, tiny_bin, dist_ckpt, arch_args)[2:])
    moved = {n: float((params[0][n] - initial[n]).abs().max()) for n in trained
             if not n.endswith(("k_proj.bias", ".version"))}
    assert len(moved) > 20 and all(2e-4 <= m <= 1e-2 for m in moved.values()), moved

    # rank 0 saved the checkpoint, holding exactly rank 0's state
    ckpt = torch.load(dist_ckpt / "checkpoint_last.pt", weights_only=True)
    assert ckpt["optimizer_history"][-1]["num_updates"] == max_update
    for key, value in params[0].items():
        assert torch.equal(ckpt["model"][key], value), key

    # the loss statistics of every update were summed over both ranks: each rank logs the same
    dist_losses = read_losses(dist_out / "loss.rank0.jsonl")
    assert sorted(dist_losses) == list(range(1, max_update + 1))
    assert read_losses(dist_out / "loss.rank1.jsonl") == dist_losses

    if name == "sas":
        # One process, the same two batches per update: same losses and parameters.
        single_out = tmp_path / "single"
        run_cli(probe_train_args(probe, tiny_bin, tmp_path / "single_ckpt", arch_args,
                                 "--max-update", str(max_update), "--update-freq", "2"),
                PROBE_OUT=str(single_out))
        single_losses = read_losses(single_out / "loss.rank0.jsonl")
        assert sorted(single_losses) == sorted(dist_losses)
        for update, loss in dist_losses.items():
            assert loss == pytest.approx(single_losses[update], rel=1e-5, abs=1e-5), update
        single = torch.load(single_out / "state.rank0.pt", weights_only=True)["model"]
        for key in trained:
            torch.testing.assert_close(params[0][key], single[key], rtol=1e-4, atol=1e-5, msg=key)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_job.sh runs it)")


@pytest.mark.parametrize("device, mode", [
    ("cpu", "bf16"), pytest.param("cuda", "fp32", marks=CUDA), pytest.param("cuda", "bf16", marks=CUDA)])
def test_two_ranks_on_one_device_train_in_lockstep(tiny_bin, tmp_path, device, mode):
    """Two processes on one device (the CPU, or one GPU shared over gloo) with the user-dir
    plugin: fp32 through fairseq-train, or bf16 with --optimizer adam_fused through
    resnmt-train (its bf16 kept off the TPU in every rank). Both ranks end identical."""
    from test_bf16 import write_resnmt_train_probe

    max_update = 4
    if mode == "bf16":
        probe, extra = write_resnmt_train_probe(tmp_path), ("--bf16", "--optimizer", "adam_fused")
    else:
        probe, extra = write_probe(tmp_path), ()
    out = tmp_path / "out"
    logs = run_two_ranks(probe, tiny_bin, tmp_path / "ckpt", out, ARCHS["sas"], max_update, *extra,
                         cpu=device == "cpu")
    assert all(("distributed init (rank %d)" % r) in log for r, log in enumerate(logs))
    states = [torch.load(out / f"state.rank{r}.pt", weights_only=True) for r in range(2)]
    assert states[0]["num_updates"] == states[1]["num_updates"] == max_update
    trained = [k for k, _ in _named_parameters(states[0]["model"])]
    assert trained
    for key in trained:
        value = states[0]["model"][key]
        assert value.dtype == (torch.bfloat16 if mode == "bf16" else torch.float32), key
        assert torch.equal(value, states[1]["model"][key]), f"{key} differs between the ranks"
    assert read_losses(out / "loss.rank0.jsonl") == read_losses(out / "loss.rank1.jsonl")


def initial_state(train_args) -> dict:
    """The weights fairseq-train starts from for ``train_args`` (its data directory and
    flags): the seed set, the task set up and the model built, as ``fairseq_cli.train`` does."""
    from fairseq import options, tasks, utils

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[str(a) for a in train_args])
    utils.set_torch_seed(args.seed)
    return tasks.setup_task(args).build_model(args).state_dict()


def _named_parameters(state):
    """Floating-point state that is a parameter. Buffers are not compared across ranks:
    NSwish's batch-mode running estimates are updated from each rank's own batches and
    are not synchronized (like BatchNorm without SyncBatchNorm); the checkpoint holds
    rank 0's (checked above)."""
    for key, value in state.items():
        if value.is_floating_point() and not key.split(".")[-1].startswith(("running_", "_float")):
            yield key, value
