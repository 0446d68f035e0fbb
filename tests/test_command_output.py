"""resnmt's console scripts: a bad flag is one error line on stderr (the last, naming the bad
value and what is allowed), never buried under a usage block (fairseq's training parser
prints ~185 lines of it); exit status 2. resnmt-train through its installed entry point
(fairseq's parser, as a user runs it); the others' main(argv) in-process."""
import importlib

import pytest

from conftest import run_cli


@pytest.mark.parametrize("args, error", [
    (["--arch", "transformer_sas_base", "--residual", "bogus"],
     "resnmt-train: error: argument --residual: invalid choice: 'bogus' (choose from 'post_ln', 'pre_ln', "),
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


@pytest.mark.parametrize("module, args, error", [
    ("evaluate", ["--hyp", "h", "--ref", "r", "--detok", "bogus"],
     "resnmt-evaluate: error: argument --detok: invalid choice: 'bogus' (choose from 'none', 'moses') (see --help)"),
    ("average_checkpoints", ["--inputs", "a", "--output", "b", "--num-epoch-checkpoints", "x"],
     "resnmt-average: error: argument --num-epoch-checkpoints: invalid int value: 'x' (see --help)"),
    ("analyze", ["checkpoint.pt", "--num-sentences", "all"],
     "resnmt-analyze: error: argument --num-sentences: invalid int value: 'all' (see --help)"),
    ("experiment", ["--beam", "zero", "multi30k", "transformer"],
     "[resnmt-experiment] error: --beam 'zero': must be an integer >= 1 (see resnmt-experiment --help)"),
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
