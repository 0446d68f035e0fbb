"""tests/never_executed.py, the report of `make coverage`, on a made-up coverage report."""
import json

import never_executed


def report(functions):
    return {"files": {"/x/resnmt/a.py": {"functions": {
        name: {"summary": {"num_statements": 2, "covered_lines": covered}} for name, covered in functions.items()}}}}


def test_it_names_what_runs_nowhere_and_entries_that_are_stale(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(never_executed, "ELSEWHERE", {"resnmt/a.py:gpu_only": "on a GPU", "resnmt/a.py:ran": "x"})
    path = tmp_path / "coverage.json"
    path.write_text(json.dumps(report({"gpu_only": 0, "ran": 2, "dead": 0, "": 0})))
    assert never_executed.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "resnmt/a.py:dead: NEVER EXECUTED: test it or delete it" in out
    assert "resnmt/a.py:gpu_only: on a GPU" in out
    assert "resnmt/a.py:ran: executed by the suite now, or gone: drop it from ELSEWHERE" in out
    assert out.rstrip().endswith("3 functions in resnmt/; the default suite never executes 2: "
                                 "1 run elsewhere (listed), 1 nowhere; 1 stale entries")
    path.write_text(json.dumps(report({"gpu_only": 0, "ran": 2})))
    monkeypatch.setattr(never_executed, "ELSEWHERE", {"resnmt/a.py:gpu_only": "on a GPU"})
    assert never_executed.main([str(path)]) == 0
