"""resnmt-study verdict: a kind's rows beside the shipped study's, with the study's verdicts,
from its lines (training is the study's own, tested in test_benchmarks; the whole command on
the example kind, installed, through submitit's local executor is in test_install)."""
import json

import pytest

from resnmt.cli import study_verdict
from resnmt.experiment.results import read_jsonl
from resnmt.study.verdict import CPU, CUDA, REFERENCE as SHIPPED, report

REFERENCE = read_jsonl(SHIPPED)
STUDY_KEY = "75bcde6d41"  # the CPU study's settings key (EN-DE), what its committed lines carry


def lines_as(row: str, like: str, shift: float):
    """The committed CPU lines of ``like``, renamed ``row``, their BLEU moved by ``shift``."""
    return [dict(r, row=row, bleu=r["bleu"] + shift) for r in REFERENCE
            if r["row"] == like and r.get("device", "cpu") == "cpu"]


def test_the_command_trains_with_the_committed_studys_settings(tmp_path):
    a = study_verdict.parser().parse_args(["mine", "--workdir", str(tmp_path), "--out", str(tmp_path / "x")])
    args = study_verdict.study_args(a, CPU)
    from resnmt.study.milestones import study_settings
    from resnmt.study.records import settings_key

    assert settings_key(study_settings(args)) == STUDY_KEY
    assert {r["settings_key"] for r in REFERENCE if r.get("device", "cpu") == "cpu"} >= {STUDY_KEY}


def test_a_kind_is_judged_against_post_ln_pre_ln_and_the_best_row_paired_by_seed():
    post = {r["seed"]: r["bleu"] for r in REFERENCE if r["row"] == "post_ln" and r["size"]["name"] == "small"
            and r["updates"] == 2400 and r.get("settings_key") == STUDY_KEY}  # the study's own pair
    mine = lines_as("mine", "post_ln", +1.0)  # post-LN's seeds, each 1 BLEU better
    text = report(mine, REFERENCE, "mine", CPU, CPU.milestones, (STUDY_KEY, STUDY_KEY))
    seeds = len(post)
    named = ", ".join(map(str, sorted(post)))
    assert (f"above post-LN at 2+2? yes: {', '.join(['+1.00'] * seeds)} (paired by seed: seeds {named}; "
            f"{seeds} seeds: a verdict)") in text
    assert any(line.startswith("above pre-LN at 6+6? no: -1") for line in text)  # post-LN's 6+6: 13-15 BLEU behind
    mean = sum(post.values()) / seeds + 1
    assert any(line.startswith("  mine") and f"{mean:.2f} (" in line and line.endswith("(yours)") for line in text)
    best = [line for line in text if line.endswith("(best shipped)")]
    assert len(best) == 2 and all(not line.startswith("  mine") for line in best)
    worse = report(lines_as("mine", "post_ln", -1.0), REFERENCE, "mine", CPU, CPU.milestones, (STUDY_KEY, STUDY_KEY))
    assert f"above post-LN at 2+2? no: {', '.join(['-1.00'] * seeds)} (paired by seed: seeds {named}; " in " ".join(worse)


def test_every_difference_printed_is_the_one_the_rule_reads():
    """Paired by seed over the seeds both rows have, named; no seed in common: mean against
    mean, said so; level only within the margin on both sides, else above or below; one seed
    (or a quick look) is a first look, not a verdict."""
    from resnmt.study.verdict import verdict
    from resnmt.study.verdicts import LEVEL

    theirs = {1: 30.0, 2: 31.0, 3: 32.0}
    assert verdict({1: 31.59}, theirs, "post_ln", 2400, False) == (
        "yes: +1.59 (paired by seed: seed 1; 1 seed: a first look)")
    assert verdict({4: 32.0, 5: 31.0}, theirs, "post_ln", 2400, False) == (
        "yes: +0.50 (mean against mean, no seed in common: yours seeds 4, 5, the reference's seeds 1, 2, 3; "
        "2 seeds: a first look)")
    assert verdict({1: 30.49, 2: 31.2}, theirs, "hyper", 2400, True).startswith("level: +0.49, +0.20 (")
    assert verdict({1: 30.8, 2: 31.1}, theirs, "hyper", 2400, True).startswith("above: +0.80, +0.10")
    assert verdict({1: 29.4, 2: 31.0}, theirs, "hyper", 2400, True).startswith("below: -0.60, +0.00")
    assert verdict({1: 29.4, 2: 31.6}, theirs, "hyper", 2400, True).startswith("mixed: ")
    assert verdict({1: 31.0, 2: 32.0}, theirs, "post_ln", 2400, False).endswith("2 seeds: a verdict)")
    assert verdict({1: 31.0, 2: 32.0}, theirs, "post_ln", 600, False, protocol=False).endswith("a first look)")
    assert LEVEL == 0.5


def test_a_quick_look_says_so_on_every_verdict_and_an_unmeasured_size_says_not_yet():
    text = report(lines_as("mine", "pre_ln", 0.0)[:1], REFERENCE, "mine", CPU, CPU.quick, (STUDY_KEY, STUDY_KEY))
    assert all(line.startswith("QUICK LOOK (2+2, d=128, to 600 updates: not the study's protocol)") for line in text
               if "?" in line)
    full = report([], REFERENCE, "mine", CPU, CPU.milestones, (STUDY_KEY, STUDY_KEY))
    assert "above post-LN at 2+2? not measured yet" in full and "above pre-LN at 6+6? not measured yet" in full


def test_on_a_gpu_without_reference_rows_at_base_size_it_says_so_in_one_line(tmp_path, capsys):
    """--device cuda: the GPU study's base size under the schedule its sweep chose (the
    fallback while no sweep line exists); no base-size row of those settings in the
    reference lines: one line, no comparison."""
    out = tmp_path / "mine.jsonl"
    out.write_text("")
    # handwritten reference lines, not the committed study's (which GPU rows will join): the CPU
    # study's post-LN line alone, no sweep line and no base-size row
    cpu_only = tmp_path / "cpu_only.jsonl"
    cpu_only.write_text(json.dumps({"benchmark": "curves", "settings_key": STUDY_KEY, "device": "cpu", "row": "post_ln",
                                    "size": {"name": "small"}, "seed": 1, "updates": 2400, "bleu": 30.0}) + "\n")
    assert study_verdict.main(["mine", "--device", "cuda", "--report", "--out", str(out),
                               "--reference", str(cpu_only)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no reference rows at 6+6, d=512 (cuda, the study's settings for it) yet: no comparison (your lines are "
        "kept; --report compares them once the study has its rows)"]
    a = study_verdict.parser().parse_args(["mine", "--device", "cuda", "--workdir", str(tmp_path), "--out", str(out)])
    args = study_verdict.study_args(a, CUDA)
    assert (args.device, args.save_every, args.sdpa_backends, args.lr, args.warmup) == (
        "cuda", 100, "flash,efficient,math", 5e-4, 4000)  # the GPU study's schedule
    # once the reference lines hold base-size rows of those settings, they are compared
    from resnmt.study.milestones import study_settings
    from resnmt.study.records import settings_key

    key = settings_key(study_settings(args))
    line = {"benchmark": "curves", "settings_key": key, "device": "cuda", "size": {"name": "base"}, "seed": 1,
            "updates": 4000, "settings": study_settings(args)}
    reference = tmp_path / "reference.jsonl"
    reference.write_text("".join(json.dumps(dict(line, row=row, bleu=b)) + "\n"
                                 for row, b in (("post_ln", 30.0), ("pre_ln", 31.0))))
    out.write_text(json.dumps(dict(line, row="mine", bleu=30.5)) + "\n")
    assert study_verdict.main(["mine", "--device", "cuda", "--report", "--out", str(out),
                               "--reference", str(reference)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert "above post-LN at 6+6, d=512? yes: +0.50 (paired by seed: seed 1; 1 seed: a first look)" in text
    assert "above pre-LN at 6+6, d=512? no: -0.50 (paired by seed: seed 1; 1 seed: a first look)" in text


@pytest.mark.parametrize("argv, message", [
    (["mine", "--seeds", "one"], "argument --seeds: invalid value 'one': must be comma-separated integers >= 1"),
    (["post_ln"], "post_ln: a shipped row of the study has this name"),
    (["mine", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["mine", "--reference", "/nonexistent.jsonl"], "--reference /nonexistent.jsonl: no such file"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        study_verdict.main(argv + ["--report"])
    assert stop.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_job_that_dies_is_submitted_again_and_a_failing_one_is_one_line(tmp_path):
    """submitit's local executor: a job whose process dies (killed) is submitted again and
    its second attempt's result gathered; one that keeps failing is reported in one line
    after --retries attempts."""
    import os
    import signal
    from argparse import Namespace

    from resnmt.study.jobs import executor, run_jobs

    class DiesOnce:
        def __call__(self, marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)  # the job's process dies, as on a lost node
            return 1

    class AlwaysFails:
        def __call__(self, _):
            raise RuntimeError("the kind diverged")

    a = Namespace(executor="local", jobs_folder=str(tmp_path / "jobs"), workdir=str(tmp_path), device="cpu",
                  gpus_per_run=None, time=5, threads=1, partition=None)
    said = []
    assert run_jobs(executor(a, "t"), [("small", "k", 1)], lambda run: (str(tmp_path / "marker"),), 1, said.append,
                    job=DiesOnce) == []
    assert said[1].startswith("small k 1: job ") and "submitted again as job" in said[1] and said[2].endswith(" done")
    failures = run_jobs(executor(a, "t"), [("small", "k", 2)], lambda run: (None,), 1, said.append, job=AlwaysFails)
    assert len(failures) == 1 and failures[0].startswith("small k 2: job ") and " failed 2 times; the last: " in \
        failures[0] and "RuntimeError: the kind diverged" in failures[0]


def test_the_cost_line_by_hand_and_what_a_quick_look_leaves_out():
    from resnmt.study.cost import cost_line, left_out

    todo = {("small", 1): 2400, ("deep", 1): 1200, ("small", 2): 0}  # seed 2 at 2+2: done
    line = cost_line(todo, {"small": 1.0, "deep": 0.5}, CPU.milestones)
    assert line == ("cost: 2 runs to train, 3600 updates, about 1h20m of training on this machine (measured here: "
                    "2+2, d=128 at 1.00 updates/s, 6+6, d=128 at 0.50 updates/s, over 3 updates each), plus decoding "
                    "and scoring test2016 at 8 milestones")  # 2400 / 1.0 + 1200 / 0.5 = 4800 s; 5 + 3 milestones
    assert cost_line({("small", 1): 0}, {}, CPU.milestones) == "cost: nothing left to train (1 run done)"
    assert cost_line({("base", 1): 4000}, None, CUDA.milestones) == (  # --executor slurm from a node without a GPU
        "cost: 1 run to train, 4000 updates (no time: no device of the runs' kind here to measure a rate on), plus "
        "decoding and scoring test2016 at 4 milestones")
    assert left_out(CPU.milestones, CPU.quick, "--quick") == (
        "--quick leaves out 2+2, d=128 from 600 to 2400 updates and the 6+6, d=128 runs (to 1200 updates): no "
        "verdict of the protocol's is read from it, a first look only")
    assert left_out(CPU.milestones, CPU.milestones, "the protocol") == ""


def test_a_preempted_or_timed_out_job_is_requeued_as_the_same_run():
    """On SLURM, submitit asks a job's checkpoint() what to requeue: the same run with the same
    arguments (it resumes from the run's last checkpoint, as the killed job above does)."""
    from submitit.helpers import DelayedSubmission

    from resnmt.study.jobs import RunJob

    job = RunJob()
    again = job.checkpoint("args", {"settings": 1}, "key", ("small", "post_ln", 1), env={"OMP_NUM_THREADS": "1"})
    assert isinstance(again, DelayedSubmission) and again.function is job
    assert again.args == ("args", {"settings": 1}, "key", ("small", "post_ln", 1))
    assert again.kwargs == {"env": {"OMP_NUM_THREADS": "1"}}
