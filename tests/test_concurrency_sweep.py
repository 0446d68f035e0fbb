"""The GPU study's runs side by side: bf16 as a setting of its own, each run on its own CPU
cores, and the concurrency sweep that picks how many runs share the card (its rates read
from fairseq's log lines, the worker count from its lines)."""
import json
import os
import sys

import pytest

from conftest import REPO_ROOT
from resnmt.study import milestones
from resnmt.study.records import settings_key

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # the lab's campaign
from campaign import concurrency, curves, plan, tables  # noqa: E402
from campaign.cores import core_sets, start_side_by_side  # noqa: E402


def key(*argv):
    return settings_key(milestones.study_settings(curves.parser().parse_args(list(argv))))


def test_bf16_has_a_settings_key_of_its_own_and_trains_with_resnmt_train():
    assert key() == "75bcde6d41" and key("--pair", "en-fr") == "20d33fe7aa"  # the CPU study's, unchanged
    assert key("--bf16") not in (key(), key("--fast-path"))
    assert milestones.study_settings(curves.parser().parse_args(["--bf16"]))["dtype"] == "bf16"
    a = curves.parser().parse_args(["--bf16", "--device", "cuda", "--sdpa-backends", "flash"])
    assert milestones.execution_flags(a)[-1] == "--bf16"
    assert milestones.trainer(a) == [sys.executable, "-m", "resnmt.cli.train"]
    cpu = curves.parser().parse_args(["--bf16"])
    assert milestones.execution_flags(cpu) == ["--bf16", "--cpu"]
    assert milestones.trainer(curves.parser().parse_args([])) == ["fairseq-train"]
    gpu = ["--device", "cuda", "--lr", "7e-4", "--warmup", "2000"]
    line = {"device": "cuda", "settings": milestones.study_settings(curves.parser().parse_args([*gpu, "--bf16"]))}
    fp32 = dict(line, settings=milestones.study_settings(curves.parser().parse_args(gpu)))
    assert tables.setting_of(line) == "cuda, lr 0.0007, warm-up 2000, bf16"  # tabulated apart from fp32's
    assert tables.setting_of(fp32) == "cuda, lr 0.0007, warm-up 2000"


def test_core_sets_split_the_cores_and_wrap_when_too_few():
    assert core_sets(2, [0, 1, 2, 3, 4]) == [[0, 1], [2, 3, 4]]
    assert core_sets(4, range(16)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert core_sets(3, [5, 7]) == [[5], [7], [5]]


def test_pinned_children_run_on_their_own_cores(tmp_path):
    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    outs = [open(tmp_path / f"{i}.txt", "w") for i in range(2)]
    procs = start_side_by_side([show, show], True, outs)
    assert [p.wait() for p in procs] == [0, 0]
    for f in outs:
        f.close()
    seen = [json.loads((tmp_path / f"{i}.txt").read_text()) for i in range(2)]
    assert seen == core_sets(2)
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(seen[0]) & set(seen[1])
    free = start_side_by_side([show], False, [open(tmp_path / "free.txt", "w")])
    assert free[0].wait() == 0
    assert json.loads((tmp_path / "free.txt").read_text()) == sorted(os.sched_getaffinity(0))


def test_a_runs_rate_is_the_median_ups_after_its_first_interval(tmp_path):
    log = tmp_path / "run0.log"
    ups = (0.8, 6.0, 9.0, 7.0, 2.0)  # the first: start-up, left out -> median of 6, 9, 7, 2 = 6.5
    log.write_text("2026-01-01 00:00:00 | INFO | fairseq_cli.train | begin training\n" + "".join(
        f"2026-01-01 00:00:0{i} | INFO | train_inner | epoch 001:     {10 * i} / 135 loss=9.1, nll_loss=8.9, "
        f"ppl=477, wps=5000, ups={u}, wpb=800, bsz=40, num_updates={10 * i}, lr=1e-05, gnorm=1.2, train_wall=1, "
        f"wall={i}\n" for i, u in enumerate(ups, 1)), encoding="utf-8")
    assert concurrency.run_rate(log) == 6.5
    assert concurrency.run_rate(log, skip=5) is None
    line = concurrency.sweep_line(2, [6.5, None], device="cuda")
    assert line["total_ups"] == 6.5 and line["runs_measured"] == 1 and line["per_run_ups"] == [6.5, None]


def step(n, total, device="cuda", measured=None):
    return {"benchmark": "concurrency_sweep", "n_runs": n, "total_ups": total, "device": device,
            "runs_measured": n if measured is None else measured}


def test_workers_from_the_sweep_take_the_highest_total_that_fits_a_lease():
    # 4000 updates, 4 milestones: a run takes 4000 * N / total + 220 s, within 620 s when total >= 10 N
    lines = [step(1, 13.0), step(4, 44.0), step(8, 76.0), step(12, 90.0), step(8, 1000.0, device="cpu")]
    n, why = plan.workers_from_sweep(lines, "cuda", 4000, 4)
    assert n == 4 and "the highest total within a lease" in why  # 8 at once: 4000 * 8 / 76 + 220 = 641 s
    assert plan.workers_from_sweep(lines + [step(8, 84.0)], "cuda", 4000, 4)[0] == 8  # a later line of N wins
    assert plan.workers_from_sweep(lines + [step(8, 84.0, measured=7)], "cuda", 4000, 4)[0] == 4  # a run logged none
    crashed = dict(step(8, 84.0), ended_early=[None] * 7 + [1])
    assert plan.workers_from_sweep(lines + [crashed], "cuda", 4000, 4)[0] == 4
    slow = [step(1, 5.0), step(4, 16.0)]  # none fits: the fastest run, 5 updates/s alone
    assert plan.workers_from_sweep(slow, "cuda", 4000, 4)[0] == 1
    assert plan.workers_from_sweep(lines, "nowhere", 4000, 4)[0] is None


@pytest.mark.parametrize("argv, message", [
    (["--concurrency-sweep", "1,0", "--sweep-lines", "x"], "argument --concurrency-sweep: invalid value '1,0': must be comma-separated integers >= 1"),
    (["--concurrency-sweep", "1,4"], "--concurrency-sweep needs --sweep-lines JSONL"),
    (["--concurrency-sweep", "1", "--sweep-lines", "x", "--sweep-seconds", "0"], "argument --sweep-seconds: invalid value '0': must be a real number > 0"),
])
def test_bad_sweep_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        curves.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.slow
def test_the_sweep_end_to_end_on_the_tiny_model_in_bf16(tiny_bin, tmp_path):
    """1 and 2 pinned bf16 runs side by side, a short window each: a line per step with every
    run's rate, a readable line per step, the last line the runs to train side by side."""
    from conftest import REPO_ROOT, run_cli

    sweep = tmp_path / "sweep.jsonl"
    out = run_cli([sys.executable, REPO_ROOT / "benchmarks" / "curves.py", "--data", tiny_bin.parent,
                   "--ref", tiny_bin.parent / "text" / "test.de", "--tiny", "--bf16", "--pin-cores", "--threads", "1",
                   "--max-tokens", "300", "--concurrency-sweep", "1,2", "--sweep-seconds", "20",
                   "--sweep-lines", sweep, "--workdir", tmp_path / "work"], timeout=300)
    lines = [json.loads(x) for x in sweep.read_text(encoding="utf-8").splitlines()]
    assert [(r["n_runs"], r["runs_measured"], r["dtype"], r["pinned"]) for r in lines] == [
        (1, 1, "bf16", True), (2, 2, "bf16", True)]
    assert all(r["total_ups"] == pytest.approx(sum(r["per_run_ups"]), abs=0.01) for r in lines)
    assert lines[0]["execution_flags"] == ["--bf16", "--cpu"] and lines[0]["ended_early"] == [None]
    printed = out.stdout.strip().splitlines()
    assert printed[0].startswith("1 at once (bf16, pinned, MPS off): ") and printed[-1] in ("1", "2")
