"""resnmt-train: fairseq-train with the model's flags in --help and an absolute --user-dir."""
import re

import pytest
import torch

from conftest import REPO_ROOT, run_cli
from model_utils import TINY
from resnmt.connections import CONNECTION_FLAGS
from resnmt.models.model_spec import resolve_model

RESNMT_FLAGS = [*(flag.flag for flag in CONNECTION_FLAGS.values()),
    "--residual", "--encoder-residual", "--decoder-residual", "--skip-lambda", "--sas-gate", "--sas-gamma",
    "--sas-gate-dim", "--sas-alpha-bias-init", "--sas-beta-bias-init", "--sas-gamma-bias-init",
    "--highway-bias-init", "--normalized-activation", "--normalized-activation-stats",
    "--normalized-activation-momentum", "--encoder-unnormalized-top-layers", "--decoder-unnormalized-top-layers",
]


@pytest.fixture(scope="module")
def help_text(tiny_bin):
    """resnmt-train --help with an arch, a task and an optimizer given: the model's, the
    task's and the optimizer's flags in one usage (one process for the tests that read it)."""
    return run_cli(["resnmt-train", tiny_bin, "--arch", "transformer_sas_base", "--task", "resnmt_translation",
                    "--optimizer", "adam_fused", "--help"]).stdout


def test_help_lists_every_resnmt_flag_with_its_text(help_text):
    out = help_text
    help_body = out[out.index("Model-specific configuration"):]
    for flag in RESNMT_FLAGS:
        assert re.search(rf"^  {re.escape(flag)}(\s|$)", help_body, re.M), flag
    assert "SAS eq.3/4" in help_body and "--encoder-layers" in help_body
    assert "--skip-lambda-learned" in help_body and "arXiv:2203.00555" in help_body  # flags and --residual help from the classes


def test_trains_with_the_installed_package_as_user_dir(tiny_bin, tmp_path):
    """... and prints fairseq's log without its configuration and model dumps (--verbose: with)."""
    args = ["resnmt-train", tiny_bin, "--arch", "transformer_rskip_base", *TINY, "--optimizer", "adam", "--lr", "1e-3",
            "--max-update", "1", "--max-tokens", "500", "--save-dir", tmp_path, "--no-epoch-checkpoints",
            "--num-workers", "0"]
    out = run_cli(args, cwd=tmp_path).stdout
    cfg = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)["cfg"]
    assert cfg["common"]["user_dir"] == str(REPO_ROOT / "resnmt")
    assert resolve_model(cfg["model"]).encoder.kind == "rskip_ln"  # what loading the checkpoint builds
    assert "fairseq_cli.train | num. shared model params" in out and "done training" in out
    assert "{'_name': " not in out and "ResidualTransformerModel(" not in out and "pin_memory" not in out
    # fairseq's lines each time it batches a dataset (each epoch, each validation): not without --verbose
    for batching in ("can_reuse_epoch_itr = ", "reuse_dataloader = ", "rebuild_batches = ", "creating new batches"):
        assert batching not in out, batching
    verbose = run_cli([*args, "--verbose", "--max-update", "2"], cwd=tmp_path).stdout
    assert "fairseq_cli.train | {'_name': " in verbose and "fairseq_cli.train | ResidualTransformerModel(" in verbose
    assert "fairseq.tasks.fairseq_task | can_reuse_epoch_itr = " in verbose


def test_help_lists_the_flags_of_the_task_and_optimizer_given(help_text):
    out = help_text
    task_help = out[out.index("Task-specific configuration"):]
    assert re.search(r"^  --compile-layers\s+train with every encoder and decoder layer compiled", task_help, re.M)
    optimizer_help = out[out.index("Optimizer-specific configuration"):]
    assert re.search(r"^  --adam-kernel \{auto,fused,foreach\}\s", optimizer_help, re.M)
    assert "how adam_fused computes fairseq's adam update" in optimizer_help
