"""resnmt's console scripts: a bad flag is one error line on stderr (the last, naming the bad
value and what is allowed), never buried under a usage block (fairseq's training parser
prints ~185 lines of it); exit status 2. resnmt-train through its installed entry point
(fairseq's parser, as a user runs it); the others' main(argv) in-process."""
import importlib

import pytest

from conftest import REPO_ROOT, run_cli

USER_DIR = str(REPO_ROOT / "resnmt")


@pytest.mark.parametrize("args, error", [
    (["--arch", "transformer_sas_base", "--residual", "bogus"],
     "resnmt-train: error: --residual bogus: no such connection kind; choose from post_ln, pre_ln, "),
    ([],  # fairseq itself stops with a bare RuntimeError() here
     "resnmt-train: error: the following arguments are required: --arch (e.g. --arch transformer_sas_base) "
     "(see --help)"),
    (["--arch", "transformer_rskip"],  # not fairseq's 181 choices, resnmt's last
     "resnmt-train: error: argument --arch/-a: invalid choice: 'transformer_rskip' (closest: transformer_rskip_big "
     "transformer_rskip_base transformer_xskip_big; resnmt's archs: python -m resnmt.cli.arch_table; all: "
     "fairseq-train --help) (see --help)"),
])
def test_a_bad_flag_of_resnmt_train_is_one_line_not_fairseqs_usage(args, error, tiny_bin, tmp_path):
    proc = run_cli(["resnmt-train", tiny_bin, *args], cwd=tmp_path, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(error), proc.stderr[-3000:]
    assert proc.stdout == ""  # not even fairseq's INFO line that the --user-dir is imported already


def test_fairseq_trains_unknown_arch_with_the_plugin_is_one_line_naming_the_closest(tiny_bin, tmp_path):
    """fairseq-train --user-dir resnmt: the plugin shortens fairseq's own parser's error for a
    mistyped --arch (114 lines of usage and ~4,700 characters of choices) to one line."""
    proc = run_cli(["fairseq-train", tiny_bin, "--user-dir", USER_DIR, "--arch", "transformer_sas_bas"],
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "fairseq-train: error: argument --arch/-a: invalid choice: 'transformer_sas_bas' (closest: transformer_sas_base "
        "transformer_sas_big transformer_xskip_base; resnmt's archs: python -m resnmt.cli.arch_table; all: "
        "fairseq-train --help)"]
    from resnmt.options import short_choice_error  # any long list (fairseq's 38 tasks), the closest names alone

    tasks = ", ".join(f"'{t}'" for t in ["translation", "resnmt_translation", *(f"task{i}" for i in range(36))])
    assert short_choice_error(f"argument --task: invalid choice: 'resnmt_translatoin' (choose from {tasks})") == \
        "argument --task: invalid choice: 'resnmt_translatoin' (closest: resnmt_translation translation; all 38: see --help)"


def test_what_fairseq_train_finds_late_is_one_line_before_anything_runs(tiny_bin, tmp_path):
    """A data directory that is not there, a prepared directory given instead of its bin/
    (named), a directory without binarized data, no batch size: fairseq-train stops on each
    with a traceback (FileNotFoundError, Exception, AssertionError), after making the save
    dir; resnmt-train with one line, exit status 2, nothing made."""
    import os

    prepared = tmp_path / "data" / "m30k"
    prepared.mkdir(parents=True)
    os.symlink(tiny_bin, prepared / "bin")
    text = tiny_bin.parent / "text"
    cases = [
        (tmp_path / "nowhere", ["--max-tokens", "1000"], f"data directory {tmp_path / 'nowhere'} not found"),
        (prepared, ["--max-tokens", "1000"],
         f"{prepared} is a directory prepared by resnmt-prepare: its binarized data is {prepared / 'bin'}"),
        (text, ["--max-tokens", "1000"],
         f"{text} holds no binarized data (no dict.*.txt; resnmt-prepare or fairseq-preprocess writes it)"),
        (tiny_bin, [], "no batch size: pass --max-tokens N (tokens per batch, e.g. --max-tokens 4096) or "
                       "--batch-size N (sentences per batch)"),
    ]
    for data, extra, error in cases:
        save_dir = tmp_path / "ckpt"
        proc = run_cli(["resnmt-train", data, "--arch", "transformer_sas_base", "--max-update", "1",
                        "--save-dir", save_dir, *extra], cwd=tmp_path, check=False)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
        assert proc.stderr.splitlines() == [f"resnmt-train: error: {error} (see --help)"]
        assert not save_dir.exists()


@pytest.mark.parametrize("module, args, error", [
    ("evaluate", ["--hyp", "h", "--ref", "r", "--detok", "bogus"],
     "resnmt-evaluate: error: argument --detok: invalid choice: 'bogus' (choose from 'none', 'moses') (see --help)"),
    ("average_checkpoints", ["--inputs", "a", "--output", "b", "--num-epoch-checkpoints", "x"],
     "resnmt-average: error: argument --num-epoch-checkpoints: invalid value 'x': must be an integer (see --help)"),
    ("analyze", ["checkpoint.pt", "--num-sentences", "all"],
     "resnmt-analyze: error: argument --num-sentences: invalid value 'all': must be an integer >= 1 (see --help)"),
    ("experiment", ["--beam", "zero", "multi30k", "transformer"],
     "[resnmt-experiment] error: --beam 'zero': must be an integer >= 1 (see resnmt-experiment --help)"),
    # a mistyped flag: the closest ones named
    ("experiment", ["--averag", "3", "multi30k", "transformer"],
     "[resnmt-experiment] error: unrecognized arguments: --averag (--averag: closest --average) "
     "(see resnmt-experiment --help)"),
    ("average_checkpoints", ["--inputs", "a", "--output", "b", "--include-lst"],
     "resnmt-average: error: unrecognized arguments: --include-lst (--include-lst: closest --include-last) "
     "(see --help)"),
])
def test_a_bad_flag_of_the_other_commands_is_one_line(module, args, error, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"resnmt.cli.{module}").main
    with pytest.raises(SystemExit) as stop:
        main(args)
    out = capsys.readouterr()
    assert stop.value.code == 2 and out.out == ""
    assert out.err.splitlines() == [error]


def test_the_installed_modules_usage_names_the_module(tmp_path):
    """python -m resnmt.cli.experiment train, as a pip user runs it (no scripts/train.sh there)."""
    import sys

    out = run_cli([sys.executable, "-m", "resnmt.cli.experiment", "train", "--help"], cwd=tmp_path).stdout
    assert out.startswith("Usage: python -m resnmt.cli.experiment train [options] DATASET ARCH")
    bad = run_cli([sys.executable, "-m", "resnmt.cli.experiment", "run", "--beam", "0", "multi30k", "transformer"],
                  cwd=tmp_path, check=False)
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "[run] error: --beam '0': must be an integer >= 1 (see python -m resnmt.cli.experiment run --help)"]
