"""resnmt installed the way a user installs it (``pip install .``, not editable), used from
outside the repository: the console scripts run, prepare a real corpus and plan an
experiment from the installed package alone, and none of their messages names a path
into the repository.

The fresh virtualenv reuses the test environment's packages (torch, fairseq, ...)
through a .pth file, so nothing is downloaded; only resnmt itself is built and installed
into it from a copy of the working tree.
"""
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, built_once, run_cli
from data_prep_mirror import custom_args, write_corpus
from model_utils import TINY

# words that would point an installed user at files only a checkout has
REPO_PATHS = ("scripts/", "data-prep", "docs/", "run_experiment.sh", "train.sh", "make venv", str(REPO_ROOT))


def copy_working_tree(dest: Path) -> Path:
    """The files git tracks or would track (ignored ones left out: no .venv, runs/, data/)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO_ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def install(root: Path) -> None:
    """A fresh virtualenv in ROOT/venv with resnmt installed non-editably from a copy of the tree."""
    source = copy_working_tree(root / "src")
    env = root / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", env], check=True)
    purelib = subprocess.run([env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the test environment's packages, appended to sys.path; its own .pth files (resnmt's
    # editable install among them) are not processed from there, so resnmt is not importable
    Path(purelib, "test-environment.pth").write_text("".join(p + "\n" for p in site.getsitepackages()))
    run_cli([env / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
             source], cwd=root, timeout=600)
    shutil.rmtree(source)  # nothing may depend on the copy it was built from


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin directory of a fresh virtualenv with resnmt installed non-editably (once per test run)."""
    return built_once(tmp_path_factory, "install", install) / "venv" / "bin"


def test_non_editable_install(installed, tmp_path):
    alone = {"PYTHONPATH": ""}  # the installed package only, whatever the test's environment adds
    help_texts = [run_cli([installed / "resnmt-prepare", "custom", "--help"], cwd=tmp_path, **alone).stdout,
                  run_cli([installed / "resnmt-experiment", "--help"], cwd=tmp_path, **alone).stdout]
    assert "--source-lang" in help_texts[0] and "--dry-run" in help_texts[1]

    # a small real corpus, prepared by the installed package
    prefixes = write_corpus(tmp_path / "corpus", n_train=400, n_valid=40, n_test=40)
    out = tmp_path / "data" / "mine"
    proc = run_cli([installed / "resnmt-prepare", "custom", *custom_args(prefixes, "--bpe-size", "300", "--workers", "1"),
                    out], cwd=tmp_path, timeout=600, **alone)
    assert (out / "bin" / "train.en-de.de.bin").is_file() and (out / "prepared.json").is_file()
    messages = [*help_texts, proc.stderr]

    # resnmt-experiment's plan for that directory, and for a built-in corpus it would prepare
    plan = run_cli([installed / "resnmt-experiment", "--dry-run", out, "transformer_rskip_base"], cwd=tmp_path,
                   **alone).stdout
    assert f"1. prepare  {out} is prepared" in plan and "--post-process sentencepiece" in plan
    user_dir = plan.split("--user-dir ")[1].split()[0]  # the installed package, not the (removed) copy
    assert user_dir.startswith(str(installed.parent)) and "site-packages" in user_dir
    assert os.path.isfile(os.path.join(user_dir, "__init__.py"))
    builtin = run_cli([installed / "resnmt-experiment", "--dry-run", "iwslt15-en-vi", "transformer_rskip_base"],
                      cwd=tmp_path, **alone).stdout
    assert "1. prepare  resnmt-prepare iwslt15-en-vi data/iwslt15-en-vi" in builtin
    refused = run_cli([installed / "resnmt-experiment", "multi30k", "transformer_nope_base"], cwd=tmp_path,
                      check=False, **alone)
    assert refused.returncode == 1
    messages += [plan, builtin, refused.stderr]
    for text in messages:
        assert not any(path in text for path in REPO_PATHS), [p for p in REPO_PATHS if p in text]


def readme_own_data_commands() -> list:
    """The README's "Your own data" commands, as lists of words (continuation lines joined,
    comments dropped)."""
    import re
    import shlex

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"### Your own data\n\n```bash\n(.*?)```", readme, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_a_newcomers_first_run_of_the_readmes_own_data_example(installed, tmp_path):
    """The README's own-data example as a newcomer runs it, installed, outside the checkout,
    on a corpus of 3,000 real pairs: the preparation succeeds on the first try (the vocabulary
    capped, saying so), a first short run scales the preset's warm-up and says what it cannot
    average before training, averages up to the update it stopped at (mid-epoch), records
    it, and prints no configuration dump or torch notice; the warnings are the last lines."""
    prepare, experiment = readme_own_data_commands()
    assert prepare[:2] == ["resnmt-prepare", "custom"] and "--bpe-size" not in prepare
    assert experiment[0] == "resnmt-experiment"
    write_corpus(tmp_path / "corpus", n_train=3000, n_valid=50, n_test=50)  # corpus/train.en ..., as the README
    alone = {"PYTHONPATH": ""}  # the installed package only, whatever the test's environment adds
    prepared = run_cli([installed / prepare[0], *prepare[1:], "--workers", "1"], cwd=tmp_path, timeout=600, **alone)
    assert "capped at" in prepared.stderr and json.loads((tmp_path / "data/my-corpus/prepared.json").read_text())[
        "subword_size"] < 8000

    # a first run: short, with a tiny model and short hypotheses to keep the test fast
    run = run_cli([installed / experiment[0], *experiment[1:], "--max-update", "30", "--gen-args",
                   "--max-len-a 1.2 --max-len-b 10", "--", *TINY, "--num-workers", "0"], cwd=tmp_path, timeout=900,
                  **alone)
    save_dir = tmp_path / "runs" / "my-corpus" / f"{experiment[2]}-2+2xd16"  # the size TINY trains, in its name
    record = json.loads((save_dir / "result.json").read_text())
    assert record["num_updates"] == 30 and record["averaged_updates"][-1] == 30  # the model trained is the one scored
    assert record["averaged_kind"] == "epoch+last" and record["averaged_updates"][0] < 30
    assert "note: preset small: the run (30 updates) is shorter than its 500 warm-up updates: warm-up scaled to 7" \
        in run.stderr
    before_training = run.stderr[:run.stderr.index("[train] running: ")]
    assert "[train] warning: --average 10: this run saves 2 checkpoint(s) to average" in before_training
    assert record["warnings"][0].startswith("--average 10: this run saves 2 checkpoint(s)")
    assert run.stderr.splitlines()[-len(record["warnings"]):] == [
        f"[resnmt-experiment] warning: {w}" for w in record["warnings"]]
    for noise in ("{'_name': ", "pin_memory", "Model(", "has already been imported"):
        assert noise not in run.stdout + run.stderr, noise
    for text in (prepared.stderr, run.stdout, run.stderr):
        assert not any(path in text for path in REPO_PATHS), [p for p in REPO_PATHS if p in text]


def test_an_installed_kind_package_and_its_verdict_from_an_empty_folder(installed, tiny_bin, tmp_path):
    """The example kind package installed as its docs say (non-editable, --no-deps: it depends
    on resnmt without pulling fairseq's torchaudio in) beside a non-editable resnmt: pip check
    says nothing new; from an empty folder, resnmt-study verdict finds the shipped rows in the
    installed package and, its run a job of submitit's local executor, says the cost first (a
    rate measured here) and what the smoke test leaves out, trains the tiny model to 2 updates
    and prints the kind beside the shipped rows, every verdict line a smoke test's, each
    difference paired by seed; run again (in its own process), it resumes: nothing trained."""
    import re

    from resnmt.experiment.results import read_jsonl
    from resnmt.study.verdict import REFERENCE

    example = shutil.copytree(REPO_ROOT / "examples" / "layerscale", tmp_path / "layerscale")
    run_cli([installed / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
             example], cwd=tmp_path, timeout=600)
    check = run_cli([installed / "python", "-m", "pip", "check"], cwd=tmp_path, check=False)
    assert set(check.stdout.strip().splitlines()) <= {"ve-fairseq 0.12.3 requires torchaudio, which is not installed."}
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [installed / "resnmt-study", "verdict", "layerscale", "--tiny", "--data", tiny_bin.parent,
            "--ref", tiny_bin.parent / "text" / "test.de", "--remove-bpe", "none", "--threads", "1",
            "--workdir", tmp_path / "w"]
    alone = {"PYTHONPATH": ""}  # the installed packages only
    first = run_cli([*argv, "--executor", "local"], cwd=empty, timeout=300, **alone)
    progress = [line for line in first.stderr.splitlines() if line.startswith("[verdict] ")]
    assert progress[0] == ("[verdict] --tiny (the tiny model, a smoke test) leaves out 2+2, d=128 from 2 to 2400 "
                           "updates and the 6+6, d=128 runs (to 1200 updates): no verdict of the protocol's is read "
                           "from it, a first look only"), first.stderr
    assert re.fullmatch(r"\[verdict\] cost: 1 run to train, 2 updates, about \d+s of training on this machine "
                        r"\(measured here: 2\+2, d=128 at [\d.]+ updates/s, over 3 updates each\), plus decoding and "
                        r"scoring test2016 at 1 milestone", progress[1]), first.stderr
    assert progress[2].startswith("[verdict] 1 jobs submitted (AutoExecutor local): small layerscale 1 = job ")
    assert progress[3].startswith("[verdict] small layerscale 1: job ") and progress[3].endswith(" done")
    (log,) = (tmp_path / "w" / "jobs").glob("*_log.err")
    assert "[verdict] small layerscale seed 1: milestone 1/1, training to 2 updates" in log.read_text()
    assert list(empty.iterdir()) == []
    (ours,) = read_jsonl(tmp_path / "w" / "curves.jsonl")
    assert (ours["row"], ours["updates"], ours["flags"], ours["size"]["name"]) == (
        "layerscale", 2, ["--residual", "layerscale"], "small")
    shipped = {(r["row"], r["seed"]): r["bleu"] for r in read_jsonl(REFERENCE) if r["settings_key"] == "75bcde6d41"
               and r["size"]["name"] == "small" and r["updates"] == 600}
    smoke = "SMOKE TEST (the tiny model to 2 updates beside the shipped rows at 600: not the study's protocol): "
    lines = first.stdout.splitlines()
    assert lines[0] == smoke + "2+2, d=128, sacreBLEU at 600 updates:"
    assert lines[1].split() == ["layerscale", f"{ours['bleu']:.2f}", "(1", "seed)", "(yours,", "at", "2)"]
    post = [b for (row, _), b in shipped.items() if row == "post_ln"]
    assert lines[2].split() == ["post_ln", f"{sum(post) / len(post):.2f}", f"({min(post):.2f}-{max(post):.2f},",
                                str(len(post)), "seeds)"]
    diff = ours["bleu"] - shipped[("post_ln", 1)]
    assert smoke + (f"above post-LN at 2+2? {'no' if diff < 0 else 'yes'}: {diff:+.2f} (paired by seed: seed 1; "
                    "1 seed: a first look)") in lines
    assert all(line.startswith(smoke) for line in lines if "?" in line) and len([x for x in lines if "?" in x]) == 2
    again = run_cli(argv, cwd=empty, timeout=300, **alone)
    assert "training to" not in again.stderr and again.stdout == first.stdout
    assert "[verdict] cost: nothing left to train (1 run done)" in again.stderr
