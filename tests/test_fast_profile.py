"""benchmarks/fast_profile.py (the fast path's own profile, part 5 of benchmarks/gpu_job.sh) in
its CPU smoke mode: the fast path's trainer built from the GPU job's command line, updates
profiled, the JSON written; on the CPU the steps run eagerly and there is no device time."""
import json
import sys

import pytest

from conftest import REPO_ROOT, run_cli

SCRIPT = REPO_ROOT / "benchmarks" / "fast_profile.py"


@pytest.mark.slow  # a process building fairseq and training 3 updates: about 10 s of CPU
def test_smoke_profile_on_the_cpu(tiny_bin, tmp_path):
    out = tmp_path / "fast_path_profile.json"
    proc = run_cli([sys.executable, SCRIPT, "--smoke", "--cpu", "--data", tiny_bin, "--out", out, "--tokens", "600",
                    "--warmup", "1", "--updates", "2"])
    profile = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {k: profile[k] for k in (
        "wall_ms", "host_ms", "kernel_ms", "device_busy", "kernel_launches", "graph_launches", "adam_kernel",
        "loss_kernel")}
    assert profile["run"] == "resnmt_train_fast_bf16" and profile["device"] == "cpu"
    assert (profile["updates"], profile["warmup_updates"]) == (2, 1)
    assert 0 < profile["host_ms"] <= profile["host_ms_max"] and profile["wall_ms"] >= profile["host_ms"] * 0.99
    # the CPU: eager steps, the multi-tensor Adam, no device time, no launches
    assert profile["graphs"] is None and profile["adam_kernel"] == "foreach" and profile["device_busy"] is None
    assert profile["loss_kernel"] == "fairseq"
    assert profile["kernel_ms"] == 0 and profile["kernel_launches"] == profile["graph_launches"] == 0
    # the update's host operations, the matrix products among them
    assert any(op["name"] == "aten::mm" and op["count"] > 0 for op in profile["top_host_ops"])
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_counts_are_refused(tiny_bin, tmp_path):
    proc = run_cli([sys.executable, SCRIPT, "--smoke", "--cpu", "--data", tiny_bin, "--out", tmp_path / "p.json",
                    "--updates", "0"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "argument --updates: invalid value '0': must be an integer >= 1")
    assert not (tmp_path / "p.json").exists()
