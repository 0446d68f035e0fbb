"""Before anything trains, every command that takes a kind imports the user's kinds, builds
the model once at a tiny size and runs one forward and one incremental step
(resnmt.testing.preflight): each mistake a user makes ends in one line naming the kind, its
module and what is wrong, exit status 2, nothing left behind; the contract reports the
cause once."""
import sys

import pytest

from conftest import BIN_DIR, run_cli
from resnmt.testing.preflight import PreflightError, check_kinds

WRONG_SHAPE = """
import torch
from resnmt.connections import SublayerConnection, register_connection


@register_connection
class Doubled(SublayerConnection):
    kind, equation, source = "preflight_doubled", "cat(x, F): twice the width", "a test"

    def __init__(self, dim, spec):
        super().__init__()

    def forward(self, x, fx):
        return torch.cat([x, fx], -1)
"""
BROKEN_INIT = """
from resnmt.connections import SublayerConnection, register_connection


@register_connection
class Uneven(SublayerConnection):
    kind, equation, source = "preflight_uneven", "x + F", "a test"

    def __init__(self, dim, spec):
        super().__init__()
        raise ValueError(f"dim {dim} must be a multiple of 3\\nsee the paper")
"""
SHAPE_LINE = ("--residual preflight_doubled (module {path}): in the forward of a tiny model, the connection returns "
              "shape (9, 2, 32), expected (9, 2, 16) (the shape of its input x)")


@pytest.fixture(scope="module")
def kinds_dir(tmp_path_factory):
    """The user's files, one folder for the module (a kind registers once per process)."""
    root = tmp_path_factory.mktemp("kinds")
    (root / "wrong_shape.py").write_text(WRONG_SHAPE)
    (root / "syntax_error.py").write_text("def broken(:\n    pass\n")
    (root / "broken_init.py").write_text(BROKEN_INIT)
    dist = root / "site" / "ghostpkg-0.1.dist-info"  # an installed package whose entry point's module is gone
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ghostpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[resnmt.connections]\nghost = ghost_module_missing\n")
    return root


@pytest.fixture
def mistakes(kinds_dir, monkeypatch):
    """Each mistake as (the kind flags a command gets, the line it must end with)."""
    monkeypatch.delenv("RESNMT_CONNECTIONS", raising=False)
    monkeypatch.syspath_prepend(str(kinds_dir / "site"))
    tmp_path = kinds_dir
    return {
        "wrong shape": (["--residual", "preflight_doubled", "--connections", str(tmp_path / "wrong_shape.py")],
                        SHAPE_LINE.format(path=tmp_path / "wrong_shape.py")),
        "missing file": (["--residual", "gru_gate", "--connections", str(tmp_path / "missing.py")],
                         f"--residual gru_gate: connection module '{tmp_path / 'missing.py'}' cannot be imported: "
                         f"FileNotFoundError: no such file {tmp_path / 'missing.py'}"),
        "syntax error": (["--residual", "gru_gate", "--connections", str(tmp_path / "syntax_error.py")],
                         f"--residual gru_gate: connection module '{tmp_path / 'syntax_error.py'}' cannot be "
                         "imported: SyntaxError: invalid syntax (syntax_error.py, line 1)"),
        "a kind that cannot be built": (
            ["--residual", "preflight_uneven", "--connections", str(tmp_path / "broken_init.py")],
            f"--residual preflight_uneven (module {tmp_path / 'broken_init.py'}): the model cannot be built: "
            "ValueError: dim 16 must be a multiple of 3"),
        "mistyped kind": (["--residual", "rskip_lm"], "--residual rskip_lm: no such connection kind (closest: rskip_ln"),
        "entry point without its module": (["--residual", "ghost"], (
            "--residual ghost: its entry point ghost = ghost_module_missing (package ghostpkg) failed to load: "
            "ModuleNotFoundError: No module named 'ghost_module_missing'")),
    }


def test_each_mistake_is_one_line_naming_the_kind_its_module_and_what_is_wrong(mistakes):
    for name, (argv, line) in mistakes.items():
        with pytest.raises(PreflightError) as e:
            check_kinds(argv, environ={})
        assert str(e.value).startswith(line) and "\n" not in str(e.value), name
    assert "(closest: rskip_ln" in str(pytest.raises(PreflightError, check_kinds, ["--residual", "rskip_lm"], {}).value)
    check_kinds(["--residual", "rskip_ln", "--skip-lambda", "2"], environ={})  # a kind that works passes


def test_every_command_taking_a_kind_ends_each_mistake_in_that_line_leaving_nothing(mistakes, tmp_path, capsys,
                                                                                      monkeypatch):
    """resnmt-study verdict, resnmt-train and resnmt-experiment (in this process): exit
    status 2, the line last on stderr, nothing on stdout, no run directory, no lock."""
    from resnmt.cli import experiment, study_verdict, train

    data = tmp_path / "no-data-needed"  # the check comes before any data is read
    for name, (argv, line) in mistakes.items():
        kind, rest = argv[1], argv[2:]
        commands = {
            "resnmt-study verdict": lambda: study_verdict.main(
                [kind, "--tiny", "--workdir", str(tmp_path / "w"), *(["--connections", rest[1]] if rest else [])]),
            "resnmt-train": lambda: (monkeypatch.setattr(sys, "argv", [
                "resnmt-train", str(data), "--arch", "resnmt_transformer", *argv, "--save-dir", str(tmp_path / "s"),
                "--max-tokens", "100"]), train.main()),
            "resnmt-experiment": lambda: experiment.main([str(data), "resnmt_transformer", "--save-dir",
                                                          str(tmp_path / "e"), "--", *argv]),
        }
        for command, run in commands.items():
            capsys.readouterr()
            with pytest.raises(SystemExit) as stop:
                run()
            out, err = capsys.readouterr()
            assert stop.value.code == 2 and out == "", (name, command)
            assert line in err.strip().splitlines()[-1], (name, command, err)
            assert list(tmp_path.iterdir()) == []


def test_the_installed_command_ends_a_wrong_shape_in_one_line(kinds_dir, tmp_path):
    """The console script, as a user runs it: one line on stderr, exit 2, no run directory."""
    proc = run_cli([BIN_DIR / "resnmt-study", "verdict", "preflight_doubled", "--connections",
                    kinds_dir / "wrong_shape.py", "--tiny", "--workdir", tmp_path / "w"], check=False, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "resnmt-study verdict: error: " + SHAPE_LINE.format(path=kinds_dir / "wrong_shape.py") + " (see --help)"]
    assert not (tmp_path / "w").exists()


def test_the_contract_reports_the_cause_once(tmp_path):
    """The preflight check fails with the shape line; every other check of the case fails in
    one line saying it did not run, without running (nor a traceback of its own)."""
    from resnmt.connections import import_connections
    from resnmt.testing import Case, contract_items, run_check

    (tmp_path / "wrong_shape.py").write_text(WRONG_SHAPE.replace("preflight_doubled", "contract_doubled"))
    import_connections(str(tmp_path / "wrong_shape.py"))
    reports = []
    for case, check in contract_items([Case("contract_doubled", ("--residual", "contract_doubled"))]):
        with pytest.raises(BaseException) as failure:
            run_check(case, check)
        reports.append((check, str(failure.value)))
    assert reports[0][0] == "preflight" and "returns shape (9, 2, 32), expected (9, 2, 16)" in reports[0][1]
    assert all(text == f"contract_doubled: {check} not run: the preflight check failed (see contract_doubled-preflight)"
               for check, text in reports[1:]) and len(reports) >= 9
