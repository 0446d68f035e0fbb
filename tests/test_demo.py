"""scripts/demo.sh end to end with a tiny budget (slow: make test-slow).

Real Multi30k preparation from ../shared/data/multi30k, two small models for 40 updates,
decoding of test2016, the table; then a second run that reuses everything."""
import json
import os

import pytest

from conftest import REPO_ROOT, run_cli, shared_data_dir

DEMO = ["bash", str(REPO_ROOT / "scripts" / "demo.sh")]


@pytest.mark.slow
def test_demo_with_a_tiny_budget_then_rerun(tmp_path):
    shared_data_dir("multi30k")  # the mirror the demo prepares from: missing is an error
    out, data = tmp_path / "demo", tmp_path / "multi30k"
    cmd = [*DEMO, "--budget", "tiny", "--out", out, "--data-root", data]
    proc = run_cli(cmd, timeout=1800)
    err = proc.stderr
    assert "[prepare-multi30k] step 5/5" in err  # really prepared, from the mirror
    assert "sha256 OK" in err
    archs = ["transformer_postln_base", "transformer_rskip_base"]
    for arch in archs:
        rec = json.loads((out / arch / "result.json").read_text())
        assert rec["n_sentences"] == 1000 and rec["num_updates"] == 40 and rec["arch"] == arch
        assert rec["params"] > 1_000_000 and 0 <= rec["bleu"] < 100
        assert rec["ref"] == str(data / "raw" / "test.de")
    table = (out / "table.md").read_text()
    lines = table.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "arch", "parameters", "BLEU", "training time", "updates", "averaged"]
    assert [line.split("|")[1].strip() for line in lines[2:4]] == [f"{a} (2+2 layers, d=128, not base)" for a in archs]
    assert "sacreBLEU on Multi30k test2016" in table and "nrefs:1|case:mixed" in table
    assert table.strip() in proc.stdout
    assert ("analysis of transformer_rskip_base" in err or "resnmt-analyze is not available" in err
            or "resnmt-analyze failed" in err)
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    if (os.cpu_count() or 1) >= 2:  # on the CPU the two models train side by side, their output labelled
        assert f"side by side, {os.cpu_count() // 2} thread(s) each" in err
        assert all(f"[{arch}] " in proc.stdout and f"[train {arch}] running: " in err for arch in archs)

    again = run_cli(cmd, timeout=900)
    assert "nothing to do" in again.stderr or "prepare: " in again.stderr
    assert again.stderr.count("train: ") == 2 and "] running: " not in again.stderr
    assert "decoded" not in again.stderr
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert table.strip() in again.stdout


def test_demo_table_names_the_size_each_arch_trained():
    """A named arch the preset shrinks is named with the size it trained, in every row."""
    from resnmt.cli.demo import demo_table

    record = {"arch": "transformer_rskip_base", "size": "2+2 layers, d=128, not base", "params": 1234567, "bleu": 30.5,
              "train_seconds": 75, "num_updates": 40, "averaged": 5, "averaged_kind": "update checkpoints",
              "signature": "nrefs:1|case:mixed"}
    rows = demo_table([record, {**record, "arch": "transformer", "size": "base"}]).splitlines()
    cells = [[c.strip() for c in row.split("|")[1:-1]] for row in rows[2:4]]
    assert cells[0] == ["transformer_rskip_base (2+2 layers, d=128, not base)", "1,234,567", "30.50", "1m15s", "40",
                        "5 update checkpoints"]
    assert cells[1][0] == "transformer (base)"
