"""benchmarks/fast_path_job.py rehearsed on the CPU (its GPU run: benchmarks/fast_path_job.sh):
whole fairseq-train and resnmt-train --fast-path processes, fairseq's own wps read from
their logs, the fast path's buckets and graphs, ratios to stock round by round."""
import json
import sys

from conftest import REPO_ROOT, run_cli

SCRIPT = REPO_ROOT / "benchmarks" / "fast_path_job.py"


def test_smoke_rehearsal_on_the_cpu(tiny_bin, tmp_path):
    out = tmp_path / "fast_path.jsonl"
    proc = run_cli([sys.executable, SCRIPT, "--smoke", "--cpu", "--data", tiny_bin, "--out", out, "--runs",
                    "stock,fast", "--rounds", "1", "--updates", "5", "--interval", "1", "--skip", "1",
                    "--tokens", "600", "--num-workers", "0"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    env, stock, fast, summary = records
    assert env["kind"] == "environment" and env["device"] == "cpu"
    assert [r["run"] for r in (stock, fast)] == ["stock", "fast"] and all("error" not in r for r in (stock, fast))
    assert "fairseq_cli.train" in stock["argv"] and "--arch" in stock["argv"] and "transformer" in stock["argv"]
    assert "resnmt.cli.train" in fast["argv"] and "--fast-path" in fast["argv"]
    for rec in (stock, fast):
        assert [i["num_updates"] for i in rec["intervals"]] == [1, 2, 3, 4, 5] and rec["updates"] == 5
        assert rec["wps_first_epoch"]["n"] == 4 and rec["params"] > 0  # the first update left out (--skip 1)
    # the fast path's log: its buckets' padding, its steps (eager on the CPU: no graph recorded)
    assert 0 < fast["padding_fraction"] < 1 and fast["shapes"] >= 1
    assert fast["steps"] == "steps run eagerly" and fast["graphs"] == 0
    assert "padding_fraction" not in stock
    ratio = fast["wps_first_epoch"]["median"] / stock["wps_first_epoch"]["median"]
    assert summary["kind"] == "summary" and summary["runs"]["fast"]["ratio_rounds"] == [ratio]
    assert summary["runs"]["fast"]["resolved"] is False  # one round never resolves
    assert summary["noise_floor"] is None and "noise floor: not measured" in proc.stdout
    assert "| fast |" in proc.stdout


def test_an_unknown_run_is_refused_in_one_line(tiny_bin, tmp_path):
    proc = run_cli([sys.executable, SCRIPT, "--smoke", "--cpu", "--data", tiny_bin, "--out", tmp_path / "x.jsonl",
                    "--runs", "fast,nope"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "error: --runs nope: unknown; choose from stock, stock_again, fast, fast_eager, recipe")
    assert not (tmp_path / "x.jsonl").exists()
