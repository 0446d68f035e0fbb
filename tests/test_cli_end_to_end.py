"""The real fairseq CLIs with --user-dir resnmt on real data: train, resume, generate,
interactive, the hub interface, and checkpoints under torch's weights_only loading."""
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, built_once, run_cli
from model_utils import TINY
from resnmt.models.model_spec import resolve_model

FAMILIES = ["postln", "preln", "xskip", "rskip", "sas", "highway", "deepnorm", "rezero", "admin", "periln", "b2t",
            "resi_dual", "dlcl", "dlcl_post", "hyper", "mhc", "denseformer", "mix_ln", "ln_scaling", "hybrid_norm"]
# fairseq-generate for every family is in the slow suite; the default suite decodes these
# through the CLI (dlcl: a residual stream through stock fairseq-train and beam search;
# hyper: n streams (T, B, n, C) through both), and every kind's decoding in-process
# (test_model, test_old_checkpoints)
DEFAULT_SUITE_FAMILIES = ("postln", "rskip", "sas", "dlcl", "hyper")
USER_DIR = str(REPO_ROOT / "resnmt")
# a model of one epoch (a few updates) repeats a word to the default length limit (200 tokens):
# decoding stops at 1.2 x source + 10 tokens, a tenth of the work, the same search
SHORT = ["--max-len-a", "1.2", "--max-len-b", "10"]


def train_args(data, arch, save_dir, *extra):
    return [
        "fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, *TINY,
        "--share-all-embeddings", "--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "800",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--save-dir", save_dir, "--no-progress-bar", "--log-interval", "1", "--seed", "1",
        "--num-workers", "0", *extra,
    ]


@pytest.fixture(scope="module")
def trained(tiny_bin, tmp_path_factory):
    """``trained(family)``: the save dir of a one-epoch training run of that arch family,
    trained on first use (so that the default suite trains only the families it decodes), once
    per test run."""
    def save_dir_of(family):
        return built_once(tmp_path_factory, f"ckpt_{family}", lambda save_dir: run_cli(
            train_args(tiny_bin, f"transformer_{family}_base", save_dir, "--max-epoch", "1")))

    return save_dir_of


@pytest.mark.parametrize("family", [f if f in DEFAULT_SUITE_FAMILIES else pytest.param(f, marks=pytest.mark.slow)
                                    for f in FAMILIES])
def test_generate_from_checkpoint(tiny_bin, trained, family):
    out = run_cli([
        "fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--path", trained(family) / "checkpoint_last.pt",
        "--gen-subset", "valid", "--beam", "4", "--batch-size", "32",
        # fairseq main drops a last batch smaller than this multiple (default 8): keep every sentence
        "--required-batch-size-multiple", "1", *SHORT,
    ])
    hyps = [line for line in out.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 60
    assert "BLEU" in out.stdout


@pytest.mark.parametrize("family", ["sas", "rskip"])
def test_interactive_from_checkpoint(tiny_bin, trained, family):
    proc = subprocess.run(
        ["fairseq-interactive", str(tiny_bin), "--user-dir", USER_DIR, "--path",
         str(trained(family) / "checkpoint_last.pt"), "--beam", "4", "--source-lang", "en", "--target-lang", "de",
         *SHORT],
        input="a man is walking .\ntwo dogs play in the grass .\n", capture_output=True, text=True,
        env=__import__("conftest").cli_env(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len([line for line in proc.stdout.splitlines() if line.startswith("H-")]) == 2


def test_training_only_flags_at_decode_time_are_named_as_ignored(tiny_bin, trained):
    """resnmt_translation's --fast-path, --shape-buckets and --no-step-capture only change
    training: fairseq-generate given them decodes as without them, and one line says so. Its
    log lines are in fairseq-train's format, not the logging module's default."""
    proc = run_cli(["fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--task", "resnmt_translation",
                    "--path", trained("sas") / "checkpoint_last.pt", "--gen-subset", "valid", "--beam", "2",
                    "--max-len-b", "5", "--fast-path", "--shape-buckets", "4", "--no-step-capture"])
    named = [line for line in proc.stderr.splitlines() if "fast-path" in line]
    assert len(named) == 1 and re.fullmatch(  # in fairseq-train's log format, as every line of fairseq-generate's
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| WARNING \| resnmt\.tasks\.translation \| --fast-path --shape-buckets 4 "
        r"--no-step-capture: training-only, ignored when decoding", named[0]), proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith(("INFO:", "WARNING:"))]
    assert len([line for line in proc.stdout.splitlines() if line.startswith("H-")]) == 60


def test_hub_interface_from_another_directory(tiny_bin, trained, tmp_path):
    code = f"""
import resnmt
from resnmt.models import ResidualTransformerModel
hub = ResidualTransformerModel.from_pretrained(
    {str(trained('sas'))!r}, checkpoint_file="checkpoint_last.pt", data_name_or_path={str(tiny_bin)!r},
    user_dir={USER_DIR!r})
print("ARCH", hub.models[0].encoder.layers[0].self_attn_connection.__class__.__name__)
print("OUT", hub.translate("a man is walking .", beam=4, max_len_a=1.2, max_len_b=10))
"""
    out = run_cli([sys.executable, "-c", code], cwd=tmp_path)
    assert "ARCH SASConnection" in out.stdout
    assert re.search(r"^OUT ", out.stdout, re.M)


def test_checkpoints_need_the_allow_list_and_load_with_it(trained):
    """torch.load(weights_only=True) refuses a fairseq checkpoint until resnmt is imported."""
    ckpt = trained("postln") / "checkpoint_last.pt"
    bare = run_cli([sys.executable, "-c", f"import torch; torch.load({str(ckpt)!r}, weights_only=True)"], check=False)
    assert bare.returncode != 0 and "argparse.Namespace" in bare.stderr
    run_cli([sys.executable, "-c", f"import resnmt, torch; torch.load({str(ckpt)!r}, weights_only=True)"])


@pytest.mark.parametrize("family", ["sas", pytest.param("rskip", marks=pytest.mark.slow)])
def test_training_resumes_from_checkpoint_last(tiny_bin, trained, tmp_path, family):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()  # the first epoch: the shared run's, trained with the same flags
    shutil.copyfile(trained(family) / "checkpoint_last.pt", save_dir / "checkpoint_last.pt")
    first = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    updates_after_epoch_1 = first["optimizer_history"][-1]["num_updates"]
    out = run_cli(train_args(tiny_bin, f"transformer_{family}_base", save_dir, "--max-epoch", "2"))
    log = out.stdout + out.stderr
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt \(epoch 2 @ {updates_after_epoch_1} updates\)", log)
    second = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert second["extra_state"]["train_iterator"]["epoch"] == first["extra_state"]["train_iterator"]["epoch"] + 1
    assert second["optimizer_history"][-1]["num_updates"] == 2 * updates_after_epoch_1


BAD_FLAGS = [
    ("rskip", ["--skip-lambda", "2.5"], "--skip-lambda 2.5 is invalid for --residual rskip_ln: it must be an integer >= 1"),
    ("rskip", ["--skip-lambda", "0"], "argument --skip-lambda: invalid value '0': must be a real number > 0"),
    ("admin", ["--admin-output-change-scale", "O(n2)"],
     "argument --admin-output-change-scale: invalid choice: 'O(n2)' (closest: O(n) O(logn) O(1); choose from "
     "'O(logn)', 'O(n)', 'O(1)')"),
    ("rezero", ["--skip-lambda-learned"],
     "--skip-lambda-learned is invalid for --residual rezero: it applies only to xskip, xskip_ln"),
]


def assert_stopped_before_anything_is_written(returncode, stderr, save_dir, message):
    assert returncode == 2
    last_line = stderr.strip().splitlines()[-1]
    assert message in last_line
    assert "Traceback" not in stderr
    assert not save_dir.exists()


def test_bad_flag_stops_fairseq_train_before_anything_is_written(tiny_bin, tmp_path):
    """The command itself, once; every bad flag through its entry point in this process below."""
    arch, extra, message = BAD_FLAGS[0]
    save_dir = tmp_path / "ckpt"
    proc = run_cli(train_args(tiny_bin, f"transformer_{arch}_base", save_dir, "--max-update", "2", *extra), check=False)
    assert_stopped_before_anything_is_written(proc.returncode, proc.stderr, save_dir, message)


@pytest.mark.parametrize("arch, extra, message", BAD_FLAGS)
def test_bad_flag_stops_fairseq_trains_entry_point_before_anything_is_written(tiny_bin, tmp_path, monkeypatch, capsys,
                                                                             arch, extra, message):
    """fairseq-train's cli_main, as the command runs it, without a new interpreter's imports."""
    from fairseq_cli.train import cli_main

    save_dir = tmp_path / "ckpt"
    argv = train_args(tiny_bin, f"transformer_{arch}_base", save_dir, "--max-update", "2", *extra)
    monkeypatch.setattr(sys, "argv", [str(a) for a in argv])
    with pytest.raises(SystemExit) as stopped:
        cli_main()
    assert_stopped_before_anything_is_written(stopped.value.code, capsys.readouterr().err, save_dir, message)


def test_deepnorm_with_nswish_trains_and_decodes(tiny_bin, tmp_path):
    """The ANAct paper's translation setting: NSwish FFNs in a DeepNorm Transformer
    (docs/normalized-activations.md has the full-size command)."""
    save_dir = tmp_path / "ckpt"
    run_cli(train_args(tiny_bin, "transformer_deepnorm_base", save_dir, "--normalized-activation", "nswish",
                       "--max-update", "3", "--task", "resnmt_translation"))
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert state["cfg"]["model"].normalized_activation == "nswish"
    assert resolve_model(state["cfg"]["model"]).encoder.kind == "deepnorm"  # what loading the checkpoint builds
    out = run_cli([
        "fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--task", "resnmt_translation",
        "--path", save_dir / "checkpoint_last.pt", "--gen-subset", "valid", "--beam", "4", "--batch-size", "32",
        *SHORT,
    ])
    assert len([line for line in out.stdout.splitlines() if line.startswith("H-")]) == 60


class Crafted:
    """Pickled as a call of os.system, as a crafted checkpoint would be."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_is_refused_as_unsafe_everywhere(tiny_bin, tmp_path, capsys):
    """A checkpoint whose pickle calls posix.system: fairseq-generate (through the plugin), the
    hub and resnmt-analyze each refuse it in one line naming the global and calling the file
    unsafe, without torch's advice to load it with weights_only=False; the command never runs."""
    import resnmt
    from resnmt.checkpoints.compat import UnsafeCheckpointError
    from resnmt.cli import analyze

    marker, ckpt = tmp_path / "ran", tmp_path / "checkpoint_best.pt"
    torch.save({"model": {}, "cfg": Crafted(marker)}, ckpt)
    message = (f"{ckpt} is an unsafe file, not loaded: its pickle asks for posix.system, which no fairseq checkpoint "
               "holds (only tensors, plain containers and argparse.Namespace); nothing in it was run")
    proc = run_cli(["fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--task", "resnmt_translation",
                    "--path", ckpt, "--source-lang", "en", "--target-lang", "de"], check=False)
    assert proc.returncode == 1 and proc.stderr.splitlines()[-1] == f"fairseq-generate: error: {message}", proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(UnsafeCheckpointError) as refused:
        resnmt.from_pretrained(tmp_path, checkpoint_file=ckpt.name, data_name_or_path=str(tiny_bin))
    assert str(refused.value) == message.replace(str(ckpt), f"{tmp_path}/{ckpt.name}")
    capsys.readouterr()
    assert analyze.main([str(ckpt), "--data", str(tiny_bin), "--out", str(tmp_path / "an"), "--cpu"]) == 1
    assert capsys.readouterr().err.splitlines() == [f"resnmt-analyze: error: {message}"]
    assert not marker.exists()
