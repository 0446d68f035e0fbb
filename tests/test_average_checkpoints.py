"""resnmt-average: exact averages, which files get picked, refusals, and a real fairseq run."""
import argparse
import os
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch

import resnmt  # noqa: F401  (allow-lists fairseq's checkpoint types for weights_only loading)
from conftest import REPO_ROOT, built_once, run_cli
from resnmt.cli.average_checkpoints import main, select_checkpoints

TINY_TRANSFORMER = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000", "--seed", "1",
    "--no-progress-bar", "--num-workers", "0",
]


def train_tiny_transformer(tmp_path_factory, data_bin: Path) -> Path:
    """fairseq's own transformer, 1+1 layers, 8 updates on tiny_bin; trained once per test run.

    With ~3 updates per epoch this leaves checkpoint1.pt, checkpoint2.pt (epochs) and
    checkpoint_1_2.pt, checkpoint_2_4.pt, checkpoint_3_8.pt (every 2 updates, except
    where an epoch ends) plus checkpoint_last/best.
    """
    return built_once(tmp_path_factory, "tiny_transformer_ckpts", lambda save_dir: run_cli([
        "fairseq-train", data_bin, *TINY_TRANSFORMER, "--max-update", "8", "--save-interval-updates", "2",
        "--keep-interval-updates", "10", "--save-dir", save_dir]))


@pytest.fixture(scope="module")
def tiny_ckpts(tmp_path_factory, tiny_bin):
    return train_tiny_transformer(tmp_path_factory, tiny_bin)


def fake_checkpoint(path: Path, w, half, count, *, epoch, extra_model=None, shape_w=None):
    """A file laid out like fairseq's: model state dict, cfg (with a Namespace), extra_state..."""
    model = {
        "encoder.w": torch.tensor(w, dtype=torch.float32) if shape_w is None else torch.zeros(shape_w),
        "decoder.h": torch.tensor(half, dtype=torch.float16),
        "decoder.num_updates": torch.tensor(count, dtype=torch.int64),  # an integer buffer
        "decoder.mask": torch.tensor([epoch % 2 == 0, True]),  # a bool buffer
    }
    model.update(extra_model or {})
    state = {
        "args": None,
        "cfg": {"model": argparse.Namespace(arch="transformer", epoch_marker=epoch), "task": {"_name": "translation"}},
        "model": model,
        "optimizer_history": [{"criterion_name": "x", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {}, "num_updates": count}],
        "extra_state": {"epoch": epoch, "train_iterator": {"epoch": epoch}},
        "last_optimizer_state": {"state": {0: {"exp_avg": torch.ones(1000)}}},
    }
    torch.save(state, path)
    return path


def three_fakes(tmp_path):
    return [
        fake_checkpoint(tmp_path / "checkpoint1.pt", [1e8, 1.0], [1.0, 2.0], 100, epoch=1),
        fake_checkpoint(tmp_path / "checkpoint2.pt", [1.0, 2.0], [2.0, 4.0], 200, epoch=2),
        fake_checkpoint(tmp_path / "checkpoint3.pt", [-1e8, 4.0], [4.0, 8.0], 300, epoch=3),
    ]


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_average_of_three_is_the_float64_mean_and_keeps_newest_metadata(tmp_path):
    paths = three_fakes(tmp_path)
    out = tmp_path / "avg.pt"
    assert main(["--inputs", *map(str, paths), "--output", str(out)]) == 0
    avg = load(out)
    # (1e8 + 1 - 1e8) / 3 is 1/3 only when accumulated in float64 (float32 loses the 1).
    expected_w = torch.tensor([(1e8 + 1.0 - 1e8) / 3, (1.0 + 2.0 + 4.0) / 3], dtype=torch.float64).float()
    assert avg["model"]["encoder.w"].dtype == torch.float32
    assert torch.equal(avg["model"]["encoder.w"], expected_w)
    assert float(avg["model"]["encoder.w"][0]) != 0.0
    assert avg["model"]["decoder.h"].dtype == torch.float16
    assert torch.equal(avg["model"]["decoder.h"], torch.tensor([7 / 3, 14 / 3], dtype=torch.float16))
    # integer and bool buffers come from the newest (last) checkpoint, not averaged
    assert avg["model"]["decoder.num_updates"].dtype == torch.int64
    assert int(avg["model"]["decoder.num_updates"]) == 300
    assert avg["model"]["decoder.mask"].tolist() == [False, True]
    # everything else is the newest checkpoint's, minus the optimizer state
    assert avg["cfg"]["model"].epoch_marker == 3
    assert avg["extra_state"]["epoch"] == 3
    assert avg["optimizer_history"][-1]["num_updates"] == 300
    assert "last_optimizer_state" not in avg
    assert avg["resnmt_averaged_from"] == [str(p) for p in paths]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_epoch_and_update_selection_by_number_not_name(tmp_path):
    # encoder.w holds the checkpoint's number so the average reveals which files were used
    for e in (1, 2, 9, 10, 11):
        fake_checkpoint(tmp_path / f"checkpoint{e}.pt", [float(e), 0.0], [0.0, 0.0], e, epoch=e)
    for e, u in ((1, 500), (2, 1000), (5, 9000), (6, 10000)):
        fake_checkpoint(tmp_path / f"checkpoint_{e}_{u}.pt", [float(u), 0.0], [0.0, 0.0], u, epoch=e)
    for name in ("checkpoint_best.pt", "checkpoint_last.pt", "checkpoint.avg10.pt"):
        fake_checkpoint(tmp_path / name, [-1.0, 0.0], [0.0, 0.0], 0, epoch=0)

    assert [p.name for p in select_checkpoints(tmp_path, 3, "epoch").paths] == [
        "checkpoint9.pt", "checkpoint10.pt", "checkpoint11.pt"]
    assert [p.name for p in select_checkpoints(tmp_path, 2, "epoch", upper_bound=9).paths] == [
        "checkpoint2.pt", "checkpoint9.pt"]
    assert [p.name for p in select_checkpoints(tmp_path, 2, "update").paths] == [
        "checkpoint_5_9000.pt", "checkpoint_6_10000.pt"]
    assert [p.name for p in select_checkpoints(tmp_path, 3, "update", upper_bound=9000).paths] == [
        "checkpoint_1_500.pt", "checkpoint_2_1000.pt", "checkpoint_5_9000.pt"]
    assert select_checkpoints(tmp_path, 2, "update").updates == [9000, 10000]  # read from the files

    out = tmp_path / "out" / "avg.pt"  # parent directory is created
    assert main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "3", "--output", str(out)]) == 0
    avg = load(out)
    assert float(avg["model"]["encoder.w"][0]) == pytest.approx(10.0)  # (9 + 10 + 11) / 3
    assert int(avg["model"]["decoder.num_updates"]) == 11  # newest = highest epoch
    assert main(["--inputs", str(tmp_path), "--num-update-checkpoints", "2", "--output", str(out)]) == 0
    assert float(load(out)["model"]["encoder.w"][0]) == pytest.approx(9500.0)


def _refusal(capsys, argv, out: Path, *needles):
    rc = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert not out.exists(), "a refused run must not write the output"
    # progress lines may come first; the error is one line, the last
    err = [line for line in lines if "error" in line]
    assert len(err) == 1 and lines[-1] == err[0] and err[0].startswith("resnmt-average: error: "), lines
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    return err[0]


def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys):
    paths = three_fakes(tmp_path)
    out = tmp_path / "avg.pt"
    odd_key = fake_checkpoint(tmp_path / "odd_key.pt", [1.0, 2.0], [1.0, 1.0], 1, epoch=4,
                              extra_model={"decoder.extra.weight": torch.zeros(2)})
    odd_shape = fake_checkpoint(tmp_path / "odd_shape.pt", None, [1.0, 1.0], 1, epoch=4, shape_w=(3,))
    int_for_float = tmp_path / "int_for_float.pt"
    state = load(paths[0])
    state["model"]["encoder.w"] = torch.tensor([1, 2])
    torch.save(state, int_for_float)
    empty = tmp_path / "empty_dir"
    empty.mkdir()

    _refusal(capsys, ["--inputs", str(paths[0]), str(odd_key), "--output", str(out)], out,
             "odd_key.pt", "'decoder.extra.weight'", "checkpoint1.pt")
    _refusal(capsys, ["--inputs", str(odd_key), str(paths[0]), "--output", str(out)], out,
             "checkpoint1.pt has no model key 'decoder.extra.weight'")
    _refusal(capsys, ["--inputs", str(paths[0]), str(odd_shape), "--output", str(out)], out,
             "odd_shape.pt", "'encoder.w'", "shape (3,)", "expected (2,)")
    _refusal(capsys, ["--inputs", str(paths[0]), str(int_for_float), "--output", str(out)], out,
             "'encoder.w'", "int64", "floating-point")
    _refusal(capsys, ["--inputs", str(paths[0]), str(tmp_path / "missing.pt"), "--output", str(out)], out,
             "no such checkpoint file", "missing.pt")
    _refusal(capsys, ["--inputs", str(empty), "--num-epoch-checkpoints", "2", "--output", str(out)], out,
             "no checkpointE.pt checkpoints in", "empty_dir")
    assert _refusal(capsys, ["--inputs", str(tmp_path), "--num-update-checkpoints", "1", "--output", str(out)],
                    out).endswith(f"no checkpoint_E_U.pt checkpoints in {tmp_path} (it holds 3 checkpointE.pt "
                                  "file(s): --num-epoch-checkpoints averages those)")
    for n in ("0", "-2"):
        _refusal(capsys, ["--inputs", str(tmp_path), "--num-epoch-checkpoints", n, "--output", str(out)], out,
                 "--num-epoch-checkpoints must be a positive number", f"got {n}")
    _refusal(capsys, ["--inputs", str(tmp_path), "--output", str(out)], out,
             "is a directory", "--num-epoch-checkpoints")
    _refusal(capsys, ["--inputs", str(paths[0]), str(paths[0]), "--output", str(out)], out, "given twice")
    _refusal(capsys, ["--inputs", *map(str, paths), "--output", str(paths[2])], out, "is one of the inputs")
    assert torch.equal(load(paths[2])["model"]["encoder.w"], torch.tensor([-1e8, 4.0]))  # untouched

    with pytest.raises(SystemExit) as exc:  # argparse's own errors: one line too, exit 2
        main(["--inputs", str(paths[0]), "--output", str(out), "--num-epochs", "3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments: --num-epochs 3" in err[0]


def test_real_fairseq_checkpoints_average_and_decode(tmp_path, tiny_ckpts, tiny_bin, monkeypatch):
    names = ["checkpoint_1_2.pt", "checkpoint_2_4.pt", "checkpoint_3_8.pt"]
    assert all((tiny_ckpts / n).is_file() for n in names), sorted(p.name for p in tiny_ckpts.iterdir())
    out = tmp_path / "checkpoint.avg3.pt"
    # the console script, as a user runs it
    proc = run_cli(["resnmt-average", "--inputs", tiny_ckpts, "--num-update-checkpoints", "3", "--output", out])
    progress = [line for line in proc.stderr.splitlines() if "] loaded " in line]
    assert len(progress) == 3 and all(n in line for n, line in zip(names, progress))

    states = [load(tiny_ckpts / n) for n in names]
    avg = load(out)
    assert set(avg["model"]) == set(states[-1]["model"])
    for key, value in avg["model"].items():
        expected = sum(s["model"][key].double() for s in states) / 3
        assert value.dtype == states[-1]["model"][key].dtype
        assert torch.allclose(value.double(), expected, rtol=0, atol=1e-6), key
    assert not torch.equal(avg["model"]["decoder.layers.0.fc1.weight"], states[-1]["model"]["decoder.layers.0.fc1.weight"])
    assert "last_optimizer_state" not in avg and avg["cfg"] == states[-1]["cfg"]
    assert out.stat().st_size < (tiny_ckpts / names[-1]).stat().st_size  # no Adam moments

    # scripts/average_checkpoints.py (run in-process: a subprocess would re-import torch)
    wrap_out = tmp_path / "wrapped.pt"
    monkeypatch.setattr(sys, "argv", ["average_checkpoints.py", "--inputs", str(tiny_ckpts),
                                      "--num-epoch-checkpoints", "2", "--output", str(wrap_out)])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO_ROOT / "scripts" / "average_checkpoints.py"), run_name="__main__")
    assert exc.value.code == 0
    wrapped = load(wrap_out)
    e1, e2 = load(tiny_ckpts / "checkpoint1.pt"), load(tiny_ckpts / "checkpoint2.pt")
    w = "encoder.layers.0.fc1.weight"
    assert torch.allclose(wrapped["model"][w], ((e1["model"][w].double() + e2["model"][w].double()) / 2).float())

    gen = run_cli(["fairseq-generate", tiny_bin, "--user-dir", REPO_ROOT / "resnmt", "--path", out,
                   "--beam", "4", "--batch-size", "32", "--gen-subset", "valid", "--max-len-b", "20",
                   "--required-batch-size-multiple", "1"])  # fairseq's default 8 drops sentences
    hyps = [line for line in gen.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 60  # every sentence of the valid split decoded
    assert "Generate valid with beam=4" in gen.stdout


def test_a_run_stopped_mid_epoch_averages_its_last_update(tmp_path, tiny_ckpts, tiny_bin, capsys):
    """8 updates of ~3 per epoch: the epoch checkpoints stop at epoch 2, the last update
    is in checkpoint_last.pt only; --include-last averages it as the newest, and the update
    count of every checkpoint is read from the files (epoch length as fairseq batches it)."""
    from resnmt.checkpoints.averaging import checkpoint_updates
    from resnmt.experiment.schedule import epoch_updates

    per_epoch = epoch_updates(tiny_bin, "en", "de", max_tokens=2000, per_update=1)
    assert checkpoint_updates(tiny_ckpts / "checkpoint1.pt") == per_epoch
    assert checkpoint_updates(tiny_ckpts / "checkpoint2.pt") == 2 * per_epoch < 8
    assert checkpoint_updates(tiny_ckpts / "checkpoint_last.pt") == 8
    picked = select_checkpoints(tiny_ckpts, 2, "epoch", include_last=True)
    assert [p.name for p in picked.paths] == ["checkpoint2.pt", "checkpoint_last.pt"]
    assert picked.updates == [2 * per_epoch, 8] and picked.kind == "epoch+last" and picked.notes("-n", "--il") == []
    left_out = select_checkpoints(tiny_ckpts, 2, "epoch")
    assert [p.name for p in left_out.paths] == ["checkpoint1.pt", "checkpoint2.pt"] and left_out.newer_last == 8
    # update checkpoints reach update 8 themselves: checkpoint_last.pt is not newer, not added
    assert [p.name for p in select_checkpoints(tiny_ckpts, 1, "update", include_last=True).paths] == [
        "checkpoint_3_8.pt"]
    out = tmp_path / "avg.pt"
    assert main(["--inputs", str(tiny_ckpts), "--num-epoch-checkpoints", "3", "--include-last", "--output", str(out)]) == 0
    assert load(out)["resnmt_averaged_from"] == [str(tiny_ckpts / n) for n in
                                                 ("checkpoint1.pt", "checkpoint2.pt", "checkpoint_last.pt")]
    capsys.readouterr()
    assert main(["--inputs", str(tiny_ckpts / "checkpoint1.pt"), "--include-last", "--output", str(out)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "resnmt-average: error: --include-last needs --num-epoch-checkpoints or --num-update-checkpoints"]


def test_a_file_that_is_not_a_checkpoint_is_one_line_naming_it(tmp_path, tiny_ckpts, capsys):
    """An empty file, a text file, a checkpoint cut short, a zip archive, random bytes, a
    pickle and torch files that hold no state dict: each refused before any checkpoint is
    loaded, on one line (the last) naming the file and what is wrong; exit status 1,
    nothing written. The empty file through the console script, as the user ran it."""
    import fractions
    import pickle
    import zipfile

    good = tiny_ckpts / "checkpoint1.pt"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.pt").write_bytes(b"")
    (bad / "text.pt").write_text("model: checkpoint2.pt\n")
    (bad / "cut.pt").write_bytes(good.read_bytes()[:20000])
    with zipfile.ZipFile(bad / "zip.pt", "w") as z:
        z.writestr("notes.txt", "not a checkpoint")
    (bad / "random.pt").write_bytes(bytes(range(7, 256)) * 4)
    (bad / "pickle.pt").write_bytes(pickle.dumps({"model": {"w": bytearray(b"x")}}, protocol=4))
    torch.save({"model": {"w": fractions.Fraction(1, 3)}}, bad / "fraction.pt")  # a type fairseq never saves
    torch.save({"model": {}, "extra": Crafted(bad / "ran")}, bad / "crafted.pt")  # would run a command
    torch.save([torch.zeros(2)], bad / "list.pt")
    torch.save({"state_dict": {"w": torch.zeros(2)}}, bad / "no_model.pt")
    torch.save({"model": torch.zeros(2)}, bad / "tensor_model.pt")
    expected = {
        "empty.pt": "is not a checkpoint: the file is empty (0 bytes)",
        "text.pt": "is not a checkpoint: it is a text file (starting 'model: checkpoint2.pt'), not one torch.save "
                   "wrote",
        "cut.pt": "is not a checkpoint: its zip archive is incomplete (cut short while it was saved or copied)",
        "zip.pt": "is not a checkpoint: it is a zip archive without data.pkl, not one torch.save wrote",
        "random.pt": "is not a checkpoint: it is neither a zip archive (torch.save's format) nor a pickle",
        "pickle.pt": "is not a checkpoint: torch.load(weights_only=True) refused it: Unsupported operand",
        "fraction.pt": "is an unsafe file, not loaded: its pickle asks for fractions.Fraction, which no fairseq "
                       "checkpoint holds (only tensors, plain containers and argparse.Namespace); nothing in it was run",
        "crafted.pt": "is an unsafe file, not loaded: its pickle asks for posix.system, which no fairseq checkpoint "
                      "holds",
        "list.pt": "is not a fairseq checkpoint: it holds a list, not a dict with a 'model' state dict",
        "no_model.pt": "is not a fairseq checkpoint: it has no 'model', not a state dict",
        "tensor_model.pt": "is not a fairseq checkpoint: its 'model' is of type Tensor, not a state dict",
    }
    out = tmp_path / "avg.pt"
    for name, message in expected.items():
        # the bad file last: refused before the good one is loaded
        assert main(["--inputs", str(good), str(bad / name), "--output", str(out)]) == 1
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"resnmt-average: error: {bad / name} {message}"), err
        assert "weights_only=False" not in err[0]
    proc = run_cli(["resnmt-average", "--inputs", good, bad / "empty.pt", "--output", out], check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"resnmt-average: error: {bad / 'empty.pt'} {expected['empty.pt']}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no output, no temporary file
    assert not (bad / "ran").exists()  # the crafted file's command never ran


class Crafted:
    """Pickled as a call of os.system, as a crafted checkpoint would be."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_it_prints_every_update_and_what_it_could_not_average(tmp_path, tiny_ckpts, tiny_bin, capsys):
    """A run stopped at update 8, mid-epoch 3: asked for the last 10 epoch checkpoints, it
    averages the 2 there are (as resnmt-experiment does) and its last lines say so, and
    that checkpoint_last.pt (update 8) is newer and was left out; each checkpoint's update
    is printed. --include-last takes it, and the notes go. Its main() in this process (the
    console script's own output is checked above, without a second interpreter's imports)."""
    from resnmt.experiment.schedule import epoch_updates

    per_epoch = epoch_updates(tiny_bin, "en", "de", max_tokens=2000, per_update=1)
    out = tmp_path / "avg.pt"
    capsys.readouterr()
    assert main(["--inputs", str(tiny_ckpts), "--num-epoch-checkpoints", "10", "--output", str(out)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"resnmt-average: averaging 2 checkpoint(s): checkpoint1.pt (update {per_epoch}), "
                        f"checkpoint2.pt (update {2 * per_epoch})")
    assert lines[1].startswith(f"resnmt-average: [1/2] loaded {tiny_ckpts / 'checkpoint1.pt'}: update {per_epoch}, ")
    assert lines[-2:] == [
        f"resnmt-average: note: --num-epoch-checkpoints 10: {tiny_ckpts} holds 2 checkpointE.pt file(s), fewer than "
        "asked: all 2 are averaged",
        f"resnmt-average: note: {tiny_ckpts / 'checkpoint_last.pt'} (update 8) is newer than the newest checkpoint "
        f"averaged, checkpoint2.pt (update {2 * per_epoch}), and was left out: --include-last averages it as the "
        "newest"]
    avg = load(out)
    assert avg["resnmt_averaged_updates"] == [per_epoch, 2 * per_epoch]
    e1, e2 = load(tiny_ckpts / "checkpoint1.pt"), load(tiny_ckpts / "checkpoint2.pt")
    w = "encoder.layers.0.fc1.weight"
    assert torch.allclose(avg["model"][w], ((e1["model"][w].double() + e2["model"][w].double()) / 2).float())

    assert main(["--inputs", str(tiny_ckpts), "--num-epoch-checkpoints", "3", "--include-last", "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note:" not in err and err.splitlines()[-1].startswith(f"resnmt-average: wrote {out}: ")
    assert load(out)["resnmt_averaged_updates"] == [per_epoch, 2 * per_epoch, 8]


def test_resnmt_experiment_chooses_with_the_same_selection(tmp_path, tiny_ckpts, tiny_bin):
    """resnmt-experiment's average step (Experiment.average) on the same files: the epoch
    checkpoints and, by default, the newer checkpoint_last.pt (label avgN-last); with
    --exclude-last the numbered ones only, and its note on fewer than --average is the
    Selection's; checkpoint_last.pt alone where training saved no numbered one."""
    from types import SimpleNamespace

    from resnmt.experiment.pipeline import Experiment
    from resnmt.experiment.schedule import epoch_updates

    per_epoch = epoch_updates(tiny_bin, "en", "de", max_tokens=2000, per_update=1)

    def average(names, exclude_last=False):
        save_dir = tmp_path / f"{'-'.join(names)}{'-x' if exclude_last else ''}"
        save_dir.mkdir()
        for name in names:
            (save_dir / name).symlink_to(tiny_ckpts / name)
        messages = []
        fake = SimpleNamespace(save_dir=save_dir, req=SimpleNamespace(average=5, exclude_last=exclude_last),
                               step=lambda n, message: messages.append(message), log=messages.append)
        checkpoint, updates, kind, label = Experiment.average(fake)
        return checkpoint.relative_to(save_dir).name, updates, kind, label, messages

    epochs = ["checkpoint1.pt", "checkpoint2.pt", "checkpoint_last.pt"]
    name, updates, kind, label, messages = average(epochs)
    assert (name, updates, kind, label) == ("checkpoint.avg3-last.pt", [per_epoch, 2 * per_epoch, 8], "epoch+last",
                                            "avg3-last")
    assert messages[-1].endswith("holds 2 checkpointE.pt file(s) and a newer checkpoint_last.pt, fewer than asked: "
                                   "all 3 are averaged")
    name, updates, kind, label, messages = average(epochs, exclude_last=True)
    assert (name, updates, kind, label) == ("checkpoint.avg2.pt", [per_epoch, 2 * per_epoch], "epoch", "avg2")
    assert messages[-1].startswith("note: --average 5: ") and "newer" not in " ".join(messages)
    assert average(["checkpoint_last.pt"], exclude_last=True)[:4] == ("checkpoint_last.pt", [8], "last", "last")


def readme_average_command() -> list:
    """The README's resnmt-average line (in its "Train, average, decode, score" block), as words."""
    import re
    import shlex

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Train, average, decode, score\n\n```bash\n(.*?)```", readme, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.startswith("resnmt-average ")][0]


def test_the_readmes_averaging_command_works_after_a_short_run(tmp_path, tiny_ckpts, tiny_bin):
    """The README's averaging line after a short run that stopped in the middle of epoch 1
    (2 of ~3 updates per epoch), whose only checkpoint is checkpoint_last.pt: it averages
    that one, says so last, and the output decodes. The short run's save dir is the shared
    run's checkpoint of update 2 (fairseq wrote the same state as checkpoint_last.pt then)."""
    command = readme_average_command()
    save_dir = Path(command[command.index("--inputs") + 1])
    output = tmp_path / command[command.index("--output") + 1]
    (tmp_path / save_dir).mkdir(parents=True)
    shutil.copyfile(tiny_ckpts / "checkpoint_1_2.pt", tmp_path / save_dir / "checkpoint_last.pt")
    iterator = load(tmp_path / save_dir / "checkpoint_last.pt")["extra_state"]["train_iterator"]
    assert (iterator["epoch"], iterator["iterations_in_epoch"]) == (1, 2)  # stopped in the middle of epoch 1
    proc = run_cli(command, cwd=tmp_path)
    assert proc.stderr.splitlines()[0] == "resnmt-average: averaging 1 checkpoint(s): checkpoint_last.pt (update 2)"
    assert proc.stderr.splitlines()[-1] == (
        f"resnmt-average: note: --num-epoch-checkpoints 10: {save_dir} holds 0 checkpointE.pt file(s) and a newer "
        "checkpoint_last.pt, fewer than asked: all 1 are averaged")
    assert load(output)["resnmt_averaged_updates"] == [2]
    gen = run_cli(["fairseq-generate", tiny_bin, "--user-dir", REPO_ROOT / "resnmt", "--path", output, "--beam", "2",
                   "--gen-subset", "valid", "--max-len-b", "5", "--batch-size", "64"], cwd=tmp_path)
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) > 0
