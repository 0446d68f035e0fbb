"""scripts/train.sh and scripts/run_experiment.sh: options, errors before any work,
the batch arithmetic of the presets, launchers, and a tiny experiment end to end
(train -> average -> decode with the GNMT penalty -> score) that a re-run skips."""
import json
import os
import shlex

import pytest
import torch

from conftest import REPO_ROOT, run_cli
from model_utils import TINY

from resnmt.cli import experiment as cli
from resnmt.experiment import presets

TRAIN = ["bash", str(REPO_ROOT / "scripts" / "train.sh")]
EXPERIMENT = ["bash", str(REPO_ROOT / "scripts" / "run_experiment.sh")]


def call_main(main, args, capsys):
    """``(exit status, stdout, stderr)`` of a command line's ``main(argv)`` called in-process."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def train_sh(capsys, monkeypatch, tmp_path):
    """train.sh's Python side (``resnmt.cli.experiment train``) called in-process, which is
    what the one-line wrapper execs (test_help runs the wrapper itself): ``(exit status,
    stdout, stderr)``, run in ``tmp_path`` with no GPU visible. In-process because each
    bad option is a one-line check: a subprocess would spend its time importing torch."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(presets, "count_gpus", lambda: 0)

    return lambda *args: call_main(cli.train_main, args, capsys)


@pytest.fixture
def dry_run(train_sh):
    """(the fairseq command as a list, stderr) of train.sh --dry-run."""

    def call(*args):
        code, out, err = train_sh("--dry-run", *args)
        assert code == 0, err
        return shlex.split(out.strip()), err

    return call


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


@pytest.mark.parametrize("script, words", [
    (TRAIN, ["--gpus", "--preset", "--launcher", "torchrun", "slurm", "--dry-run", "update-freq", "checkpoint_last.pt"]),
    (EXPERIMENT, ["--mirror", "--average", "--beam", "--lenpen", "--results", "resnmt-evaluate"]),
])
def test_help(script, words):
    out = run_cli([*script, "--help"]).stdout
    assert out.startswith("Usage: scripts/")
    for word in words:
        assert word in out, word


@pytest.mark.parametrize("args, code, message", [
    (["wmt15-en-de", "transformer_sas_base"], 2,
     "DATASET 'wmt15-en-de' is not one of: multi30k multi30k-en-fr iwslt15-en-vi wmt14-en-de wmt14-en-fr, nor a directory"),
    (["multi30k", "transformer_sas_huge"], 2, "ARCH 'transformer_sas_huge' is not a resnmt_transformer arch"),
    (["multi30k", "lstm"], 2, "ARCH 'lstm' is not a resnmt_transformer arch or 'transformer'; resnmt's archs: "
     "python -m resnmt.cli.arch_table (see scripts/train.sh --help)"),  # not the 57 names (1,213 characters)
    (["multi30k", "transformer_sas_bas"], 2, "ARCH 'transformer_sas_bas' is not a resnmt_transformer arch or "
     "'transformer'; closest: transformer_sas_base transformer_sas_big transformer_xskip_base; resnmt's archs: "
     "python -m resnmt.cli.arch_table"),
    (["--gpus", "two", "multi30k", "transformer"], 2, "--gpus 'two': must be an integer >= 0"),
    (["--gpus", "3", "multi30k", "transformer"], 2, "--gpus 3 but only 0 GPU(s) visible here"),
    (["--nodes", "2", "multi30k", "transformer"], 2, "--nodes 2 needs --launcher torchrun or --launcher slurm"),
    (["--preset", "tiny", "multi30k", "transformer"], 2, "--preset 'tiny' is not one of: paper small cpu"),
    (["--max-update", "0", "multi30k", "transformer"], 2, "--max-update '0': must be an integer >= 1"),
    (["multi30k"], 2, "expected DATASET and ARCH, got 1 argument(s): multi30k"),
    (["--data", "NOWHERE", "multi30k", "transformer"], 1, "data directory NOWHERE not found"),
    # the flags after --, with fairseq's own parser and resnmt's model flags
    (["multi30k", "transformer_sas_base", "--", "--residual", "rskip_lnn"], 2,
     "[train] error: --residual rskip_lnn: no such connection kind (closest: rskip_ln, xskip_ln); choose from "
     "post_ln, pre_ln, "),
    (["multi30k", "transformer_sas_base", "--", "--residul", "rskip_ln"], 2,
     "[train] error: fairseq-train: unrecognized arguments: --residul rskip_ln (--residul: closest --residual "),
    (["multi30k", "transformer_sas_base", "--", "--max-tokens", "4k"], 2,  # before the schedule reads it
     "[train] error: fairseq-train: argument --max-tokens: invalid int value: '4k' (see scripts/train.sh --help)"),
    (["multi30k", "transformer_rskip_base", "--", "--skip-lambda", "2.5"], 2,  # the model's own check
     "[train] error: fairseq-train: --skip-lambda 2.5 is invalid for --residual rskip_ln: it must be an integer >= 1 "
     "(see scripts/train.sh --help)"),
])
def test_bad_input_stops_before_any_work(train_sh, tmp_path, args, code, message):
    save_dir = tmp_path / "run"
    status, _, err = train_sh("--save-dir", save_dir, *args)
    assert status == code, err
    assert message in err.splitlines()[-1] and "[train] error: " in err and "Traceback" not in err
    assert not save_dir.exists() and not (tmp_path / "runs").exists()


def test_data_of_another_language_pair_is_refused(train_sh, tiny_bin, tmp_path):
    status, _, err = train_sh("--data", tiny_bin, "--save-dir", tmp_path / "r", "iwslt15-en-vi", "transformer")
    assert status == 1
    assert f"{tiny_bin}/dict.vi.txt not found: {tiny_bin} is not iwslt15-en-vi data binarized for en->vi" in err
    assert not (tmp_path / "r").exists()


def test_the_bin_of_a_prepared_directory_names_it_and_the_directory_is_not_data(train_sh, tiny_bin, tmp_path):
    """DATASET OUTDIR/bin is OUTDIR (its manifest, its bin/, runs/DATASET/ARCH), as
    fairseq-generate's DATA names it; --data OUTDIR is refused naming OUTDIR/bin; nothing
    is written."""
    root = write_data_root(tiny_bin, tmp_path / "data" / "m30k")
    status, out, err = train_sh("--dry-run", root / "bin", "transformer")
    assert status == 0, err
    cmd = shlex.split(out.strip())
    # its manifest; the CPU preset trains 2+2 layers at d=128: the run's name and its line say so, not "(base)"
    assert (cmd[1], flag(cmd, "--save-dir")) == (str(root / "bin"), "runs/multi30k/transformer-2+2xd128")
    assert "[train] multi30k en->de, transformer (2+2 layers, d=128, not base), preset small" in err
    status, _, err = train_sh("--data", root, "--save-dir", tmp_path / "r", root, "transformer")
    assert status == 1 and err.splitlines()[-1] == (
        f"[train] error: --data {root} is a directory prepared by resnmt-prepare: its binarized data is {root}/bin")
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_dtype_bf16_runs_resnmt_train(dry_run, monkeypatch):
    """--dtype bf16: fairseq's --bf16 through resnmt-train (which keeps it off TPUs)."""
    monkeypatch.delenv("RESNMT_FAIRSEQ_TRAIN", raising=False)
    cmd, err = dry_run("--gpus", "1", "--dtype", "bf16", "iwslt15-en-vi", "transformer_postln_base")
    assert cmd[0] == "resnmt-train" and "--bf16" in cmd and "--fp16" not in cmd
    assert "transformer_postln_base (base), preset paper, bf16," in err  # the named arch's own size


def test_paper_presets_batch_arithmetic_and_multi_gpu_commands(dry_run):
    # WMT'14 big on 8 GPUs: fairseq spawns 8 processes, 8 x 3584 tokens, update-freq 1, fp16
    cmd, err = dry_run("--gpus", "8", "wmt14-en-de", "transformer_sas_big")
    assert cmd[0] == "fairseq-train" and cmd[1] == "data/wmt14-en-de/bin"
    assert (flag(cmd, "--max-tokens"), flag(cmd, "--update-freq")) == ("3584", "1")
    assert flag(cmd, "--distributed-world-size") == "8" and "--fp16" in cmd
    assert (flag(cmd, "--lr"), flag(cmd, "--max-update"), flag(cmd, "--arch")) == ("5e-4", "300000", "transformer_sas_big")
    assert flag(cmd, "--adam-betas") == "(0.9, 0.98)" and flag(cmd, "--label-smoothing") == "0.1"
    assert flag(cmd, "--warmup-updates") == "4000" and flag(cmd, "--keep-last-epochs") == "10"
    assert flag(cmd, "--save-dir") == "runs/wmt14-en-de/transformer_sas_big"
    assert "8 x max-tokens 3584 x update-freq 1 = 28672 tokens per update (target 32768)" in err
    # the same on one GPU: 4096 x 8 for base, no distributed flags
    cmd, err = dry_run("--gpus", "1", "--tag", "s2", "--seed", "2", "wmt14-en-fr", "transformer_rskip_base",
                       "--", "--skip-lambda", "3", "--lr", "1e-3")
    assert (flag(cmd, "--max-tokens"), flag(cmd, "--update-freq")) == ("4096", "8")
    assert "--distributed-world-size" not in cmd and flag(cmd, "--seed") == "2"
    assert flag(cmd, "--save-dir") == "runs/wmt14-en-fr/transformer_rskip_base-s2"
    assert cmd[-4:] == ["--skip-lambda", "3", "--lr", "1e-3"]  # after the preset's: they win
    # IWSLT: the papers' 4096 tokens on one GPU; on 2 GPUs the per-GPU batch halves
    cmd, _ = dry_run("--gpus", "2", "iwslt15-en-vi", "transformer_postln_base")
    assert (flag(cmd, "--max-tokens"), flag(cmd, "--update-freq")) == ("2048", "1")
    assert (flag(cmd, "--source-lang"), flag(cmd, "--target-lang")) == ("en", "vi")
    # two nodes through torchrun: no init method, fairseq reads torchrun's environment
    cmd, _ = dry_run("--gpus", "8", "--nodes", "2", "--node-rank", "1", "--launcher", "torchrun",
                     "--master-addr", "10.0.0.1", "wmt14-en-de", "transformer_sas_base")
    assert cmd[:11] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                        "--master-addr", "10.0.0.1", "--master-port", "29500"]
    assert cmd[11].endswith("fairseq-train") and os.path.isabs(cmd[11])
    assert flag(cmd, "--distributed-world-size") == "16" and "--distributed-init-method" not in cmd
    assert (flag(cmd, "--max-tokens"), flag(cmd, "--update-freq")) == ("2048", "1")


def write_data_root(tiny_bin, root):
    """A prepared-dataset layout (bin/, raw/test.de, the manifest) around the shared tiny
    corpus; its words are whole (no subwords), so subword_nmt's post-processing keeps them."""
    from resnmt.data.corpora import DATASETS
    from resnmt.data.manifest import write_manifest

    (root / "raw").mkdir(parents=True)
    os.symlink(tiny_bin, root / "bin")
    (root / "raw" / "test.de").write_text((tiny_bin.parent / "text" / "test.de").read_text())
    write_manifest(root, DATASETS["multi30k"], "subword_nmt", "bpe/bpe.codes")
    return root


def test_experiment_end_to_end_then_nothing_to_redo(tiny_bin, tmp_path):
    root = write_data_root(tiny_bin, tmp_path / "data")
    results = tmp_path / "results.jsonl"
    save_dir = tmp_path / "runs" / "m30k-rskip"
    cmd = [*EXPERIMENT, "--data-root", root, "--save-dir", save_dir, "--results", results,
           "--preset", "cpu", "--max-epoch", "3", "--max-tokens", "800", "--average", "5",
           "--gen-args", "--max-len-b 20", "multi30k", "transformer_rskip_base",
           "--", *TINY, "--warmup-updates", "10", "--num-workers", "0", "--no-progress-bar"]
    proc = run_cli(cmd)
    err = proc.stderr
    for step in ("step 1/5: prepare: ", "step 2/5: train transformer_rskip_base", "step 3/5: average the last 3 epoch",
                 "step 4/5: decode test with beam 4, GNMT length penalty 0.6", "step 5/5: score"):
        assert step in err, step
    assert f"note: --average 5: {save_dir} holds 3 checkpointE.pt file(s), fewer than asked: all 3 are averaged" in err
    assert "decoded 60 sentences" in err
    # fairseq's lines at each batching (each epoch, validation, decoding) are in train.log, not printed
    assert "can_reuse_epoch_itr" not in proc.stdout + err
    assert "can_reuse_epoch_itr" in (save_dir / "train.log").read_text()

    lines = results.read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec == json.loads((save_dir / "result.json").read_text())
    assert (rec["dataset"], rec["arch"], rec["averaged"], rec["averaged_kind"]) == ("multi30k", "transformer_rskip_base", 3, "epoch")
    assert (rec["beam"], rec["lenpen"], rec["lenpen_form"], rec["epochs"]) == (4, 0.6, "gnmt", 3)
    assert rec["n_sentences"] == 60 and 0 <= rec["bleu"] <= 100 and rec["signature"].startswith("nrefs:1")
    assert rec["params"] > 0 and rec["num_updates"] > 0 and rec["train_seconds"] > 0
    assert rec["checkpoint"] == str(save_dir / "checkpoint.avg3.pt")
    avg = torch.load(save_dir / "checkpoint.avg3.pt", weights_only=True)
    assert [os.path.basename(p) for p in avg["resnmt_averaged_from"]] == [f"checkpoint{e}.pt" for e in (1, 2, 3)]
    key = "avg3.beam4.lenpen0.6.gen-max-len-b20"
    assert rec == json.loads((save_dir / f"result.{key}.json").read_text())
    gen = (save_dir / f"gen.test.{key}.out").read_text()
    assert gen.count("\nD-") + gen.startswith("D-") == 60
    assert not list(save_dir.glob("*.tmp*")) and not list(save_dir.glob(".evaluate*"))
    assert "[train] starting a new run in" in err and (save_dir / "train.log").read_text().count("num. shared model params") == 1

    # the same command again: every step skipped, nothing appended, no file rewritten
    mtimes = {p: p.stat().st_mtime_ns for p in save_dir.iterdir()}
    again = run_cli(cmd).stderr
    for step in ("step 1/5: prepare: ", "step 2/5: train: ", "step 3/5: average: ", "step 4/5: decode: ",
                 "step 5/5: score: "):
        assert step in again and "skipped" in again.split(step)[1].splitlines()[0], step
    assert "[train] running:" not in again and "decoded" not in again  # nothing trained or decoded
    assert len(results.read_text().splitlines()) == 1
    assert {p: p.stat().st_mtime_ns for p in save_dir.iterdir()} == mtimes

    # other decoding settings (fewer checkpoints averaged, beam 2, hypotheses cut to one token),
    # with --strict: averaged, decoded and scored again into their own files; result.json
    # follows; the first result is kept; the score means nothing and is flagged, so the
    # exit status is 1 and the last line says why (one run: each step is its own process)
    other_cmd = [*cmd[:cmd.index("--average")], "--strict", "--average", "2", "--beam", "2",
                 "--gen-args", "--max-len-a 0 --max-len-b 1", *cmd[cmd.index("--gen-args") + 2:]]
    other = run_cli(other_cmd, check=False)
    other_err = other.stderr
    assert "step 2/5: train: " in other_err and "step 3/5: average the last 2 epoch" in other_err
    assert "decode test with beam 2" in other_err and "decoded 60 sentences" in other_err
    assert [json.loads(x)["averaged"] for x in results.read_text().splitlines()] == [3, 2]
    latest = json.loads((save_dir / "result.json").read_text())
    assert (latest["averaged"], latest["beam"]) == (2, 2)
    assert latest == json.loads((save_dir / "result.avg2.beam2.lenpen0.6.gen-max-len-a0_max-len-b1.json").read_text())
    assert latest == json.loads(results.read_text().splitlines()[-1])
    assert json.loads((save_dir / f"result.{key}.json").read_text()) == rec
    assert latest["score_meaningless"] and latest["length_ratio"] < 0.5
    warnings = "the warning" if len(latest["warnings"]) == 1 else "the warnings"
    assert other.returncode == 1 and other_err.splitlines()[-1] == (
        f"[run_experiment] error: --strict: the score is flagged as meaningless ({warnings} above), so the exit "
        "status is 1")
    assert other_err.splitlines()[-2].startswith("[run_experiment] warning: ")

    # a checkpoint_last.pt truncated by a kill during fairseq's copy is replaced, and training resumes
    last = save_dir / "checkpoint_last.pt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    train = run_cli([*TRAIN, "--preset", "cpu", "--data", root / "bin", "--save-dir", save_dir, "--max-epoch", "3",
                     "--max-tokens", "800", "multi30k", "transformer_rskip_base", "--", *TINY, "--num-workers", "0"])
    assert "checkpoint_last.pt was incomplete" in train.stderr and "replaced by" in train.stderr
    assert f"resuming from {save_dir}/checkpoint_last.pt" in train.stderr
    assert "(epoch 4 @ " in train.stdout + train.stderr  # fairseq loaded it: epoch 3 was complete
    assert (save_dir / "checkpoint_last.pt.broken").stat().st_size == len(data) // 2

    # trained further (train.done deleted to resume with a larger --max-epoch): the average, the
    # decoding and the score made from the older checkpoints are each made again, one line naming why
    (save_dir / "train.done").unlink()
    same = [x for x in other_cmd if x != "--strict"]  # the second decoding settings, made above
    further = run_cli([*same[:same.index("--max-epoch")], "--max-epoch", "4", *same[same.index("--max-epoch") + 2:]])
    key2 = "avg2.beam2.lenpen0.6.gen-max-len-a0_max-len-b1"
    for made_again in (f"{save_dir}/checkpoint4.pt is newer than {save_dir}/checkpoint.avg2.pt: making it again",
                       f"{save_dir}/checkpoint.avg2.pt is newer than {save_dir}/gen.test.{key2}.out: making it again",
                       f"{save_dir}/gen.test.{key2}.out is newer than {save_dir}/result.{key2}.json: making it again",
                       "decoded 60 sentences"):
        assert made_again in further.stderr, made_again
    assert f"resuming from {save_dir}/checkpoint_last.pt" in further.stderr and "[train] epoch 4: " in further.stdout
    record = json.loads(results.read_text().splitlines()[-1])
    assert (record["epochs"], record["averaged"]) == (4, 2) and record["num_updates"] > rec["num_updates"]
    assert record == json.loads((save_dir / f"result.{key2}.json").read_text())
    assert "--max-epoch 4" in " ".join(json.loads((save_dir / "train.done").read_text())["cmd"])


def test_experiment_bad_options_stop_before_any_work(tmp_path, monkeypatch, capsys):
    """run_experiment.sh's Python side, in-process (test_help runs the wrapper)."""
    monkeypatch.chdir(tmp_path)

    def run_experiment(*args):
        code, _, err = call_main(lambda argv: cli.main(argv, "scripts/run_experiment.sh"), args, capsys)
        return code, err

    code, err = run_experiment("--results", tmp_path / "r.jsonl", "multi30k", "transformer_nope_base")
    assert code == 1 and err.splitlines()[-1].startswith(
        "[run_experiment] error: the training options were refused: ARCH 'transformer_nope_base' is not a "
        "resnmt_transformer arch or 'transformer'; closest: transformer_preln_base transformer_hyper_base transformer_periln_base")
    code, err = run_experiment("--average", "0", "multi30k", "transformer")
    assert code == 2 and "--average '0': must be an integer >= 1" in err
    assert os.listdir(tmp_path) == []


def test_experiment_checks_the_flags_after_the_double_dash_before_it_starts(tmp_path):
    """The kinds named after -- are checked before the data is prepared: a wrong --residual is
    one line (the last) naming the closest kinds and the kinds to choose from, not fairseq's
    212 lines of usage; exit status 2; nothing is made."""
    proc = run_cli(["resnmt-experiment", "multi30k", "transformer_sas_base", "--max-update", "1", "--",
                    "--residual", "rskip_lnn"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()  # the built-in kinds, then any installed (the example's layerscale)
    assert line.startswith(
        "[resnmt-experiment] error: --residual rskip_lnn: no such connection kind (closest: rskip_ln, xskip_ln); "
        "choose from post_ln, pre_ln, xskip, xskip_ln, rskip_ln, sas, highway, deepnorm, rezero, admin, peri_ln, "
        "b2t, resi_dual, dlcl, dlcl_post, denseformer, mix_ln, ln_scaling, hybrid_norm, hyper, mhc")
    assert os.listdir(tmp_path) == []
