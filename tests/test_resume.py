"""Resuming an interrupted run.

A training run killed with SIGKILL (the whole process group) and restarted with the same
scripts/train.sh command continues from checkpoint_last.pt and reproduces the
uninterrupted run exactly: the same loss at every update (the unrounded values, from the
probe of test_distributed) and bit-identical final parameters and buffers, NSwish's
batch-mode running estimates and their update counter included.

Exactness past epoch 1 relies on resnmt_translation building the training batches as
at epoch 1 whatever epoch a run starts at (ve-fairseq 0.12.3 orders sentences under
``numpy_seed(seed + starting epoch)``; see resnmt/tasks/translation.py); the second test
checks that directly.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO_ROOT, cli_env, run_cli
from model_utils import TINY
from test_distributed import ARCHS, probe_train_args, read_losses, sas_two_epochs, write_probe

TRAIN_SH = REPO_ROOT / "scripts" / "train.sh"
MAX_EPOCH = 3
# SAS connections and batch-mode NSwish FFNs in one model: one run checks both
SAS_NSWISH_BATCH = ["--arch", "transformer_sas_base", "--normalized-activation", "nswish",
                    "--normalized-activation-stats", "batch"]


def train_command(data, save_dir, arch_args):
    arch, extra = arch_args[1], arch_args[2:]
    return [
        "bash", TRAIN_SH, "--preset", "cpu", "--data", data, "--save-dir", save_dir,
        "--max-epoch", str(MAX_EPOCH), "--max-tokens", "600", "--tokens-per-update", "600", "--seed", "3",
        "multi30k", arch, "--", *TINY, *extra, "--warmup-updates", "4",
        "--no-progress-bar", "--log-interval", "1", "--num-workers", "0",
    ]


def num_updates(checkpoint):
    return torch.load(checkpoint, weights_only=True)["optimizer_history"][-1]["num_updates"]


def kill_during_epoch_2(cmd, env, loss_file, per_epoch):
    """Start cmd in its own process group; SIGKILL the group once an update of epoch 2
    has been logged (epoch 1's checkpoint is then complete)."""
    proc = subprocess.Popen([str(a) for a in cmd], cwd=str(REPO_ROOT), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError("the run ended before it could be killed:\n" + proc.stderr.read()[-3000:])
            assert time.monotonic() < deadline, "no update of epoch 2 within 4 minutes"
            if loss_file.exists() and max(read_losses(loss_file), default=0) > per_epoch:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_killed_run_resumes_and_reproduces_the_uninterrupted_run(tiny_bin, tmp_path):
    probe = write_probe(tmp_path)
    env = {"RESNMT_FAIRSEQ_TRAIN": f"{sys.executable} {probe}"}

    # the uninterrupted run
    ref_dir, ref_out = tmp_path / "ref", tmp_path / "ref_probe"
    run_cli(train_command(tiny_bin, ref_dir, SAS_NSWISH_BATCH), PROBE_OUT=str(ref_out), **env)
    ref_losses = read_losses(ref_out / "loss.rank0.jsonl")
    per_epoch = num_updates(ref_dir / "checkpoint1.pt")
    assert per_epoch >= 3 and sorted(ref_losses) == list(range(1, MAX_EPOCH * per_epoch + 1))

    # the same command, killed during epoch 2, then run again
    run_dir, run_out = tmp_path / "run", tmp_path / "run_probe"
    cmd = train_command(tiny_bin, run_dir, SAS_NSWISH_BATCH)
    loss_file = run_out / "loss.rank0.jsonl"
    kill_during_epoch_2(cmd, cli_env(PROBE_OUT=str(run_out), **env), loss_file, per_epoch)
    killed_at = max(read_losses(loss_file))
    assert per_epoch < killed_at < MAX_EPOCH * per_epoch
    resumed_updates = num_updates(run_dir / "checkpoint_last.pt")
    assert resumed_updates % per_epoch == 0 and resumed_updates < killed_at

    again = run_cli(cmd, PROBE_OUT=str(run_out), **env)
    log = again.stderr + again.stdout
    assert f"[train] resuming from {run_dir}/checkpoint_last.pt" in log
    epoch = resumed_updates // per_epoch + 1
    assert f"checkpoint_last.pt (epoch {epoch} @ {resumed_updates} updates)" in log

    losses = read_losses(loss_file)  # records written after the restart replace the lost ones
    assert sorted(losses) == sorted(ref_losses)
    for update in sorted(ref_losses):
        assert losses[update] == pytest.approx(ref_losses[update], abs=1e-5, rel=0), update
    final = torch.load(run_out / "state.rank0.pt", weights_only=True)
    ref_final = torch.load(ref_out / "state.rank0.pt", weights_only=True)
    assert final["num_updates"] == ref_final["num_updates"] == MAX_EPOCH * per_epoch
    assert final["model"].keys() == ref_final["model"].keys()
    for key, value in ref_final["model"].items():
        assert torch.equal(final["model"][key], value), f"{key} differs from the uninterrupted run"
    counters = [k for k in final["model"] if k.endswith("ffn_activation.num_updates")]
    assert counters and all(int(final["model"][k]) == MAX_EPOCH * per_epoch for k in counters)
    assert any(k.endswith("ffn_activation.running_rho") for k in final["model"])
    assert any(".self_attn_connection.gates." in k for k in final["model"])  # SAS


def test_resume_at_epoch_2_sees_the_same_batches(tiny_bin, tmp_path, tmp_path_factory):
    """One epoch, a restart, and the second epoch, against two epochs straight (shared with
    test_bf16's float32 reference)."""
    probe = write_probe(tmp_path)
    args = lambda out, epochs: probe_train_args(  # noqa: E731
        probe, tiny_bin, out, ARCHS["sas"], "--max-epoch", str(epochs), "--dropout", "0")
    run_cli(args(tmp_path / "run", 1), PROBE_OUT=str(tmp_path / "run_probe"))
    run_cli(args(tmp_path / "run", 2), PROBE_OUT=str(tmp_path / "run_probe"))
    ref = read_losses(sas_two_epochs(tiny_bin, tmp_path_factory) / "probe" / "loss.rank0.jsonl")
    run = read_losses(tmp_path / "run_probe" / "loss.rank0.jsonl")
    assert sorted(run) == sorted(ref)
    for update in ref:
        assert run[update] == pytest.approx(ref[update], abs=1e-5, rel=0), update
