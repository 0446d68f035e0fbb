"""bf16 training from the user's command (resnmt/training/bf16.py).

fairseq 0.12 sets ``--tpu`` for ``--bf16``; ``resnmt-train`` keeps bf16 on this machine's
device. On the CPU (``--bf16 --cpu``), through resnmt-train's real entry point with the
probe of test_distributed (exact per-update losses, final state): the model trains in
bfloat16 with float32 master weights, its losses follow float32 training for the first
updates, its checkpoints reload, and a run resumed from a checkpoint continues exactly
(the master weights travel in the checkpoint; without them it would not, also checked).
Stock ``fairseq-train --bf16 --user-dir resnmt`` without torch_xla stops with one line.
"""
import argparse

import pytest
import torch

from conftest import built_once, run_cli
from model_utils import TINY
from resnmt.training.bf16 import (MASTER_WEIGHTS_KEY, bf16_needs_resnmt_train_message, torch_xla_installed,
                         untie_bf16_from_tpu)
from test_distributed import ARCHS, PROBE, USER_DIR, probe_train_args, read_losses, sas_two_epochs

STOCK_MAIN = "    sys.exit(train_cli.cli_main())\n"
RESNMT_TRAIN_MAIN = "    from resnmt.cli.train import main\n    sys.exit(main())\n"


def write_resnmt_train_probe(directory):
    """test_distributed's probe, entering through resnmt-train's main instead of fairseq-train's."""
    assert PROBE.count(STOCK_MAIN) == 1
    path = directory / "resnmt_train_probe.py"
    path.write_text(PROBE.replace(STOCK_MAIN, RESNMT_TRAIN_MAIN))
    return path


def train(probe, data, save_dir, out, *extra):
    return run_cli(probe_train_args(probe, data, save_dir, ARCHS["sas"], "--no-epoch-checkpoints", *extra),
                   PROBE_OUT=str(out))


@pytest.fixture(scope="module")
def bf16_two_epochs(tiny_bin, tmp_path_factory):
    """Two epochs of bf16 training straight through resnmt-train's probe, built once per test
    run and shared (tests only read it): its first updates are compared with float32's, a
    resumed run must reproduce it. ``run/`` its save dir, ``probe/`` the probe's output."""
    def two_epochs(root):
        train(write_resnmt_train_probe(root), tiny_bin, root / "run", root / "probe", "--max-epoch", "2", "--bf16")

    return built_once(tmp_path_factory, "bf16_two_epochs", two_epochs)


def test_untie_keeps_an_explicit_tpu():
    args = argparse.Namespace(bf16=True, tpu=True)
    if torch_xla_installed():
        assert not untie_bf16_from_tpu(args, ["--bf16"]) and args.tpu
        return
    assert untie_bf16_from_tpu(args, ["--bf16"]) and args.tpu is False
    explicit = argparse.Namespace(bf16=True, tpu=True)
    assert not untie_bf16_from_tpu(explicit, ["--bf16", "--tpu"]) and explicit.tpu
    plain = argparse.Namespace(bf16=False, tpu=False)
    assert not untie_bf16_from_tpu(plain, []) and plain.tpu is False


def test_bf16_on_the_cpu_trains_like_fp32_and_checkpoints_reload(tiny_bin, bf16_two_epochs, tmp_path_factory):
    # float32: the same model on the same batches, test_distributed's shared run of fairseq-train's probe
    fp32 = read_losses(sas_two_epochs(tiny_bin, tmp_path_factory) / "probe" / "loss.rank0.jsonl")
    bf16 = read_losses(bf16_two_epochs / "probe" / "loss.rank0.jsonl")
    updates = 5
    assert sorted(bf16) == sorted(fp32) and len(fp32) > updates
    fp32 = {update: fp32[update] for update in range(1, updates + 1)}  # the first updates
    for update in fp32:  # bf16 keeps 8 bits of mantissa: the same losses to about 1 %
        assert bf16[update] == pytest.approx(fp32[update], rel=0.01), update
    assert any(bf16[u] != fp32[u] for u in fp32)  # and it was not float32 after all

    state = torch.load(bf16_two_epochs / "probe" / "state.rank0.pt", weights_only=True)
    floats = [v for v in state["model"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.bfloat16 for v in floats)  # the model trained in bf16

    checkpoint = bf16_two_epochs / "run" / "checkpoint_last.pt"
    ckpt = torch.load(checkpoint, weights_only=True)
    assert ckpt["cfg"]["common"]["bf16"] and not ckpt["cfg"]["common"]["tpu"]
    master = ckpt["last_optimizer_state"][MASTER_WEIGHTS_KEY]
    assert master and all(t.dtype == torch.float32 for t in master)
    assert any(not torch.equal(m, m.bfloat16().float()) for m in master)  # finer than the bf16 model

    # the checkpoint reloads: its model holds the trained bf16 weights, and it decodes
    from fairseq import checkpoint_utils

    models, _ = checkpoint_utils.load_model_ensemble([str(checkpoint)],
                                                     arg_overrides={"data": str(tiny_bin)})
    reloaded = models[0].state_dict()
    for key, value in state["model"].items():
        assert torch.equal(reloaded[key].to(value.dtype), value), key
    gen = run_cli(["fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--path", checkpoint,
                   "--gen-subset", "test", "--beam", "2", "--max-len-b", "5", "--batch-size", "16", "--cpu",
                   "--num-workers", "0"]).stdout.splitlines()
    sources = sum(line.startswith("S-") for line in gen)
    assert sources > 0 and sum(line.startswith("H-") for line in gen) == sources


def test_bf16_resume_continues_exactly(tiny_bin, bf16_two_epochs, tmp_path):
    """Two epochs straight, against one epoch, a restart, and the second epoch; and the
    same restart from a checkpoint stripped of its master weights, which must differ."""
    probe = write_resnmt_train_probe(tmp_path)
    ref = read_losses(bf16_two_epochs / "probe" / "loss.rank0.jsonl")

    train(probe, tiny_bin, tmp_path / "run", tmp_path / "run_probe", "--max-epoch", "1", "--bf16")
    first_epoch = max(read_losses(tmp_path / "run_probe" / "loss.rank0.jsonl"))
    stripped = tmp_path / "stripped"
    stripped.mkdir()
    ckpt = torch.load(tmp_path / "run" / "checkpoint_last.pt", weights_only=True)
    del ckpt["last_optimizer_state"][MASTER_WEIGHTS_KEY]
    torch.save(ckpt, stripped / "checkpoint_last.pt")

    proc = train(probe, tiny_bin, tmp_path / "run", tmp_path / "run_probe", "--max-epoch", "2", "--bf16")
    assert f"Loaded checkpoint {tmp_path / 'run' / 'checkpoint_last.pt'} (epoch 2 @ {first_epoch} updates)" in proc.stdout + proc.stderr
    run = read_losses(tmp_path / "run_probe" / "loss.rank0.jsonl")
    assert sorted(run) == sorted(ref) and max(ref) > first_epoch
    assert run == ref  # every update's loss, exactly
    final = torch.load(tmp_path / "run_probe" / "state.rank0.pt", weights_only=True)["model"]
    ref_final = torch.load(bf16_two_epochs / "probe" / "state.rank0.pt", weights_only=True)["model"]
    for key, value in ref_final.items():
        assert torch.equal(final[key], value), key

    train(probe, tiny_bin, stripped, tmp_path / "stripped_probe", "--max-epoch", "2", "--bf16")
    without = read_losses(tmp_path / "stripped_probe" / "loss.rank0.jsonl")
    assert any(without[u] != ref[u] for u in without if u > first_epoch)


@pytest.mark.skipif(torch_xla_installed(), reason="torch_xla is installed: stock --bf16 can go to a TPU here")
def test_stock_fairseq_train_bf16_names_resnmt_train(tiny_bin, tmp_path):
    proc = run_cli(["fairseq-train", tiny_bin, "--user-dir", USER_DIR, "--arch", "transformer_postln_base", *TINY,
                    "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1", "--max-tokens", "500", "--cpu",
                    "--bf16", "--save-dir", tmp_path, "--num-workers", "0"], check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == f"fairseq-train: error: {bf16_needs_resnmt_train_message()}"
    assert not list(tmp_path.glob("*.pt"))
