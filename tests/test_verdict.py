"""benchmarks/verdict.py: a kind's rows beside the committed study's, with the study's
verdicts, from its lines (training is the curves study's own, tested in test_benchmarks)."""
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import verdict  # noqa: E402

from resnmt.experiment.results import read_jsonl  # noqa: E402

REFERENCE = read_jsonl(verdict.RESULTS)


def lines_as(row: str, like: str, shift: float):
    """The committed CPU lines of ``like``, renamed ``row``, their BLEU moved by ``shift``."""
    return [dict(r, row=row, bleu=r["bleu"] + shift) for r in REFERENCE
            if r["row"] == like and r.get("device", "cpu") == "cpu"]


def test_the_committed_study_has_the_settings_the_command_trains_with():
    assert {r["settings_key"] for r in REFERENCE if r.get("device", "cpu") == "cpu"} >= {verdict.study_key()}


def test_a_kind_is_judged_against_post_ln_pre_ln_and_the_best_row_paired_by_seed():
    post = {r["seed"]: r["bleu"] for r in REFERENCE if r["row"] == "post_ln" and r["size"]["name"] == "small"
            and r["updates"] == 2400 and r.get("settings_key") == verdict.study_key()}  # the study's own pair
    mine = lines_as("mine", "post_ln", +1.0)  # post-LN's seeds, each 1 BLEU better
    text = verdict.report(mine, REFERENCE, "mine", verdict.PROTOCOL, False, verdict.study_key())
    seeds = len(post)
    assert f"above post-LN at 2+2? yes ({', '.join(['+1.00'] * seeds)})" in text
    assert any(line.startswith("above pre-LN at 6+6? no (-1") for line in text)  # post-LN's 6+6: 13-15 BLEU behind
    mean = sum(post.values()) / seeds + 1
    assert any(line.startswith("  mine") and f"{mean:.2f} (" in line and line.endswith("(yours)") for line in text)
    best = [line for line in text if line.endswith("(best shipped)")]
    assert len(best) == 2 and all(not line.startswith("  mine") for line in best)
    worse = verdict.report(lines_as("mine", "post_ln", -1.0), REFERENCE, "mine", verdict.PROTOCOL, False,
                           verdict.study_key())
    assert f"above post-LN at 2+2? no ({', '.join(['-1.00'] * seeds)})" in worse


def test_a_quick_look_says_so_on_every_verdict_and_an_unmeasured_size_says_not_yet():
    text = verdict.report(lines_as("mine", "pre_ln", 0.0)[:1], REFERENCE, "mine", verdict.QUICK, True,
                          verdict.study_key())
    assert all(line.startswith("QUICK LOOK (2+2 to 600 updates, not the study's protocol)") for line in text
               if "?" in line)
    full = verdict.report([], REFERENCE, "mine", verdict.PROTOCOL, False, verdict.study_key())
    assert "above post-LN at 2+2? not measured yet" in full and "above pre-LN at 6+6? not measured yet" in full


@pytest.mark.parametrize("argv, message", [
    (["mine", "--seeds", "one"], "--seeds 'one': expected comma-separated integers"),
    (["post_ln"], "post_ln: a shipped row of the study has this name"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        verdict.main(argv + ["--report"])
    assert stop.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
