"""resnmt.experiment's pieces that the end-to-end runs rely on: the names of decoding
settings, the one reader of fairseq's log, the checkpoint selection, the presets' batch
arithmetic in-process, the options' checks, and the subprocesses' environment; and the
study's training to a budget (resnmt.study.runs)."""
import json
import os
import platform
import subprocess
import sys

import pytest

from resnmt.experiment import presets, results, runtime
from resnmt.experiment.errors import ExperimentError, UsageError
from resnmt.experiment.pipeline import ExperimentRequest
from resnmt.experiment.steps import FairseqLog
from resnmt.study import runs

# what fairseq-train --log-format simple printed over two runs of one save dir
LOG = """\
2026-11-23 10:00:00 | INFO | fairseq_cli.train | num. shared model params: 1,949,696 (num. trained: 1,949,696)
2026-11-23 10:00:05 | INFO | train_inner | epoch 001:     50 / 136 loss=9.876, nll_loss=9.5, ppl=724, num_updates=50, lr=0.0001
2026-11-23 10:01:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.5 | nll_loss 8.1 | ppl 274 | wps 900 | num_updates 136
2026-11-23 10:01:00 | INFO | train | epoch 001 | loss 9.25 | nll_loss 8.9 | ppl 477 | wps 1500 | ups 2.2 | num_updates 136 | lr 0.000272 | train_wall 60 | wall 61
2026-11-23 10:01:01 | INFO | fairseq_cli.train | done training in 61.2 seconds
2026-11-23 11:00:00 | INFO | fairseq_cli.train | num. shared model params: 1,949,696 (num. trained: 1,949,696)
2026-11-23 11:01:00 | INFO | train | epoch 002 | loss 7.5 | nll_loss 7.0 | ppl 128 | wps 1500 | ups 2.2 | num_updates 272 | lr 0.000544 | train_wall 59 | wall 60
2026-11-23 11:01:00 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.25 | nll_loss 6.75 | ppl 108 | wps 900 | num_updates 272
2026-11-23 11:01:01 | INFO | fairseq_cli.train | done training in 60.3 seconds
"""


def test_decoding_settings_read_in_file_names():
    assert results.decoding_key("avg10", 4, 0.6) == "avg10.beam4.lenpen0.6"
    assert results.decoding_key("avg3", 4, 1.0, "--max-len-b 20") == "avg3.beam4.lenpen1.gen-max-len-b20"
    assert results.decoding_key("last", 2, 0.6, " --max-len-a 1.2 --max-len-b 10 ") == \
        "last.beam2.lenpen0.6.gen-max-len-a1.2_max-len-b10"
    assert results.flags_name("--unkpen -0.5 --prefix-size 1") == "unkpen-0.5_prefix-size1"
    long_a, long_b = "--constraints " + "a" * 80, "--constraints " + "a" * 79 + "b"
    name_a, name_b = results.flags_name(long_a), results.flags_name(long_b)
    assert len(name_a) == results.MAX_NAME_PART and name_a.startswith("constraints" + "a" * 10) and name_a != name_b
    assert results.flags_name("--path /tmp/x y") == "path-tmp-xy"  # only file-name-safe characters


def test_fairseq_log_over_a_restart():
    log = FairseqLog.parse(LOG)
    assert log.params == 1_949_696
    assert log.epochs == [(1, 136, 9.25), (2, 272, 7.5)]
    assert log.valid == [(136, 8.5, 8.1), (272, 7.25, 6.75)]
    assert log.train == [(50, 9.876)]
    assert log.train_seconds == pytest.approx(121.5)  # both runs, summed


def test_checkpoints_until_an_update(tmp_path):
    for name in ("checkpoint1.pt", "checkpoint_1_40.pt", "checkpoint_1_80.pt", "checkpoint_2_120.pt",
                 "checkpoint_last.pt", "checkpoint.avg5.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in runs.checkpoints_until(tmp_path, 2, 80)] == ["checkpoint_1_40.pt", "checkpoint_1_80.pt"]
    # training stopped at 136 (an epoch end: no checkpoint_E_136.pt) -> checkpoint_last.pt is that model
    runs.atomic_write_text(tmp_path / runs.TRAINED_STAMP, '{"updates": 136}\n')
    assert [p.name for p in runs.checkpoints_until(tmp_path, 2, 136)] == ["checkpoint_2_120.pt", "checkpoint_last.pt"]
    with pytest.raises(ExperimentError, match="1 checkpoints up to update 40, 2 wanted"):
        runs.checkpoints_until(tmp_path, 2, 40)


def test_train_to_counts_every_call_and_a_stopped_one_up_to_the_checkpoint_it_resumes_from(tmp_path, monkeypatch):
    """The seconds train_to returns are the model's whole training time: each finished call
    in full, and a call stopped mid-way (a session's end) up to checkpoint_last.pt, where the
    next call resumes; the updates after that checkpoint are counted when trained again."""
    now = [1000.0]
    monkeypatch.setattr(runs, "time", type("FakeTime", (), {"time": staticmethod(lambda: now[0])}))
    save_dir = tmp_path / "checkpoints"
    calls = []

    def fake_fairseq_train(cmd, log_path, env):
        calls.append(cmd)
        assert cmd[cmd.index("--save-dir") + 1] == save_dir
        last = save_dir / "checkpoint_last.pt"
        last.write_bytes(b"")
        if len(calls) == 2:  # writes a checkpoint 70 s in, is stopped 90 s in
            os.utime(last, (now[0] + 70.0, now[0] + 70.0))
            now[0] += 90.0
            raise KeyboardInterrupt
        now[0] += {1: 50.0, 3: 40.0}[len(calls)]

    monkeypatch.setattr(runs, "run_logged", fake_fairseq_train)
    assert runs.trained_seconds(save_dir) == 0.0 and runs.trained_updates(save_dir) == 0
    assert runs.train_to(200, ["fairseq-train"], save_dir, None, {}) == pytest.approx(50.0)
    with pytest.raises(KeyboardInterrupt):
        runs.train_to(400, ["fairseq-train"], save_dir, None, {})
    assert runs.trained_updates(save_dir) == 200 and runs.trained_seconds(save_dir) == pytest.approx(120.0)
    assert runs.train_to(400, ["fairseq-train"], save_dir, None, {}) == pytest.approx(160.0)
    assert [c[c.index("--max-update") + 1] for c in calls] == [200, 400, 400]
    assert runs.train_to(400, ["fairseq-train"], save_dir, None, {}) == pytest.approx(160.0)  # done: not run again
    assert len(calls) == 3
    assert json.loads((save_dir / runs.TRAINED_STAMP).read_text()) == {"updates": 400, "seconds": pytest.approx(160.0)}


@pytest.mark.parametrize("gpus, nodes, tokens, expected", [
    ("1", "1", None, ("4096", "8")),     # WMT base on one GPU: 8 x 4096 = 32768
    ("4", "1", None, ("4096", "2")),
    ("8", "2", None, ("2048", "1")),     # 16 x 4096 > 4/3 x 32768: smaller batches instead
    ("1", "1", "8000", ("4096", "2")),   # round(8000 / 4096) = 2
])
def test_update_freq_from_the_gpu_count(gpus, nodes, tokens, expected):
    req = presets.TrainRequest("wmt14-en-de", "transformer_sas_base", gpus=gpus, nodes=nodes, tokens_per_update=tokens,
                          launcher="torchrun" if nodes != "1" else "spawn")
    cmd = presets.plan_training(req, dry_run=True).cmd
    assert (cmd[cmd.index("--max-tokens") + 1], cmd[cmd.index("--update-freq") + 1]) == expected


def test_requests_convert_command_line_text_once_on_construction(tmp_path):
    req = presets.TrainRequest("multi30k", "transformer", seed="2", gpus="0", max_update="300", save_dir=str(tmp_path))
    assert (req.seed, req.gpus, req.max_update, req.nodes, req.save_dir) == (2, 0, 300, 1, tmp_path)
    exp = ExperimentRequest(train=req, average="5", beam=2, lenpen="1.0", results=str(tmp_path / "r.jsonl"))
    assert (exp.average, exp.beam, exp.lenpen, exp.results) == (5, 2, 1.0, tmp_path / "r.jsonl")


@pytest.mark.parametrize("make, message", [
    (lambda: presets.TrainRequest("multi30k", "transformer", tokens_per_update="0"),
     r"^--tokens-per-update '0': must be an integer >= 1$"),
    (lambda: presets.TrainRequest("multi30k", "transformer", seed=-1), r"^--seed '-1': must be an integer >= 0$"),
    (lambda: presets.TrainRequest("multi30k", "transformer", max_epoch=2.5), r"^--max-epoch '2.5': must be an integer >= 1$"),
    (lambda: presets.TrainRequest("multi30k", "transformer", gpus=True), r"^--gpus 'True': must be an integer >= 0$"),
    (lambda: presets.TrainRequest("multi30k", "transformer", nodes=2, node_rank=2, launcher="torchrun"),
     r"^--node-rank 2 must be < --nodes 2$"),
    (lambda: presets.TrainRequest("multi30k", "transformer", preset="cpu", gpus=1),
     r"^--preset cpu runs on the CPU; it cannot take --gpus 1$"),
    (lambda: presets.TrainRequest("multi30k", "transformer", launcher="mpi"),
     r"^--launcher 'mpi' is not one of: spawn torchrun slurm$"),
    (lambda: ExperimentRequest(train=None, lenpen="-0.1"), r"^--lenpen '-0.1': must be a real number >= 0$"),
    (lambda: ExperimentRequest(train=None, lenpen="nan"), r"^--lenpen 'nan': must be a real number >= 0$"),
    (lambda: ExperimentRequest(train=None, batch_size="0"), r"^--batch-size '0': must be an integer >= 1$"),
])
def test_bad_values_name_the_flag(make, message):
    with pytest.raises(UsageError, match=message):
        make()


@pytest.mark.parametrize("args, trainer, precision", [
    (dict(gpus="1"), "fairseq-train", ["--fp16"]),                     # the paper preset on GPUs: fp16
    (dict(gpus="1", dtype="fp32"), "fairseq-train", []),
    (dict(gpus="1", dtype="bf16"), "resnmt-train", ["--bf16"]),         # bf16 kept off TPUs by resnmt-train
    (dict(gpus="1", extra=["--bf16"]), "resnmt-train", ["--bf16"]),     # fairseq's flag after --: the same
    (dict(gpus="0", dtype="bf16"), "resnmt-train", ["--cpu", "--bf16"]),
    (dict(gpus="0"), "fairseq-train", ["--cpu"]),
])
def test_dtype_sets_the_precision_and_the_trainer(args, trainer, precision, monkeypatch):
    monkeypatch.delenv("RESNMT_FAIRSEQ_TRAIN", raising=False)
    req = presets.TrainRequest("multi30k", "transformer_postln_base", **args)
    cmd = presets.plan_training(req, dry_run=True).cmd
    assert os.path.basename(cmd[0]) == trainer
    assert [f for f in cmd if f in ("--fp16", "--bf16", "--cpu")] == precision


def test_dtype_fp16_on_the_cpu_and_unknown_dtypes_are_refused():
    with pytest.raises(UsageError, match=r"^--dtype fp16 trains on GPUs only \(fairseq's --fp16\); on the CPU use "
                                         r"fp32 or bf16$"):
        presets.plan_training(presets.TrainRequest("multi30k", "transformer", gpus="0", dtype="fp16"), dry_run=True)
    with pytest.raises(UsageError, match=r"^--dtype fp32 and --bf16 after --: choose one precision$"):
        presets.plan_training(presets.TrainRequest("multi30k", "transformer", gpus="1", dtype="fp32",
                                                   extra=["--bf16"]), dry_run=True)
    with pytest.raises(UsageError, match=r"^--dtype 'fp8'"):
        presets.TrainRequest("multi30k", "transformer", dtype="fp8")


def test_unknown_dataset_names_the_allowed_ones(tmp_path):
    with pytest.raises(UsageError, match=r"^DATASET 'wmt16' is not one of: multi30k multi30k-en-fr iwslt15-en-vi wmt14-en-de "
                                         r"wmt14-en-fr, nor a directory prepared by resnmt-prepare$"):
        presets.dataset_of("wmt16")
    with pytest.raises(UsageError, match=rf"^DATASET '{tmp_path}': {tmp_path}: not a directory prepared by "
                                         "resnmt-prepare"):
        presets.dataset_of(str(tmp_path))


def test_a_benchmark_rows_flags_override_the_shared_settings(tmp_path):
    """The study's control rows change one shared setting through their flags."""
    from fairseq import options

    argv = runs.benchmark_train_argv(tmp_path, "transformer_postln_base", ["--warmup-updates", "1000", "--dropout", "0.1"],
                                       presets.SIZES["small"], seed=1, max_tokens=4096, lr=1e-3, warmup=300,
                                       dropout=0.3, save_every=40, keep=5, validate=True)
    args = options.parse_args_and_arch(options.get_training_parser(), argv[1:])
    assert (args.warmup_updates, args.dropout, args.encoder_layers, args.lr) == (1000, 0.1, 2, [1e-3])


def test_subprocesses_keep_freed_memory_unless_the_user_says_otherwise(monkeypatch):
    for name in runtime.KEEP_FREED_MEMORY_ENV:
        monkeypatch.delenv(name, raising=False)
    assert {k: runtime.tool_env()[k] for k in runtime.KEEP_FREED_MEMORY_ENV} == runtime.KEEP_FREED_MEMORY_ENV
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert runtime.tool_env(threads=1)["MALLOC_TRIM_THRESHOLD_"] == "131072"


# A child that fills 64 MiB, frees it, and prints how much of it is still resident.
_RESIDENT_AFTER_FREE = """
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
before = rss()
block = b"\\x01" * (64 << 20)
del block
print((rss() - before) / (64 << 20))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/status"),
                    reason="the variables are glibc's; the check reads /proc")
def test_with_the_pipelines_environment_freed_memory_stays_in_the_process(monkeypatch):
    """What KEEP_FREED_MEMORY_ENV does, observed: glibc's default gives a freed 64 MiB
    buffer back to the kernel (to be faulted in again at the next training step); with
    the pipeline's environment it stays resident for reuse."""
    for name in runtime.KEEP_FREED_MEMORY_ENV:
        monkeypatch.delenv(name, raising=False)
    keep = runtime.tool_env()
    default = {k: v for k, v in keep.items() if k not in runtime.KEEP_FREED_MEMORY_ENV}

    def resident_after_free(env):
        out = subprocess.run([sys.executable, "-c", _RESIDENT_AFTER_FREE], env=env, capture_output=True,
                             text=True, check=True).stdout
        return float(out)

    assert resident_after_free(default) < 0.1
    assert resident_after_free(keep) > 0.9


def test_a_short_run_scales_the_presets_warmup_and_names_what_it_cannot_average(tiny_bin, capsys):
    """--max-update 10 on ~3 updates per epoch (300 real pairs, 2000 tokens per update): the
    small preset's 500 warm-up updates would never reach the peak learning rate, so the
    preset scales them to the run, saying so; a warm-up given after -- is the user's, kept
    and warned about; averaging 10 checkpoints of a 10-update run is warned about, with
    values that work. resnmt-experiment --dry-run prints the same lines, last."""
    from resnmt.cli import experiment as cli
    from resnmt.experiment.schedule import epoch_updates

    per_epoch = epoch_updates(tiny_bin, "en", "de", max_tokens=2000, per_update=1)
    assert 2 <= per_epoch <= 4

    def plan(max_update, *extra):
        return presets.plan_training(presets.TrainRequest(
            "multi30k", "transformer_rskip_base", data=tiny_bin, gpus="0", max_update=max_update, max_tokens="2000",
            tokens_per_update="2000", extra=list(extra)), dry_run=True)

    short = plan("10")
    assert short.cmd[short.cmd.index("--warmup-updates") + 1] == "2"
    assert short.notes == ["preset small: the run (10 updates) is shorter than its 500 warm-up updates: warm-up "
                           "scaled to 2 (-- --warmup-updates N to choose)"]
    assert short.schedule.epoch_updates == per_epoch and short.schedule.warnings() == []
    saved = list(range(per_epoch, 11, per_epoch)) + ([10] if 10 % per_epoch else [])
    averaging = (f"--average 10: this run saves {len(saved)} checkpoint(s) to average, every {per_epoch} updates (an "
                 f"epoch), the first at update {per_epoch}, so the average holds models from early in training; use "
                 f"--average {len(saved) // 2}, or --max-update {10 * per_epoch} or more")
    assert short.schedule.warnings(average=10) == [averaging]

    own = plan("10", "--warmup-updates", "500")
    assert own.notes == [] and own.cmd[len(own.cmd) - 1 - own.cmd[::-1].index("--warmup-updates") + 1] == "500"
    assert own.schedule.warnings() == ["--warmup-updates 500 is not shorter than the run (10 updates): the learning "
                                       "rate never reaches --lr; use --warmup-updates 2, or train longer"]
    long = plan("2000")
    assert long.notes == [] and long.schedule.warnings(average=10) == []

    assert cli.main(["--dry-run", "--data-root", str(tiny_bin.parent), "--gpus", "0", "--max-update", "10",
                     "--max-tokens", "2000", "--tokens-per-update", "2000", "multi30k", "transformer_rskip_base"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [f"note: {short.notes[0]}", f"warning: {averaging}"]


def test_fairseqs_batching_lines_are_left_out_of_what_the_pipeline_prints():
    """FairseqNoise (what resnmt-experiment prints of fairseq-train's and fairseq-generate's
    output): the 4 lines of each batching go, in both log formats; the lines around stay."""
    from resnmt.training.quiet import FairseqNoise

    noise = FairseqNoise()
    lines = ["2026-11-27 13:52:26 | INFO | fairseq.tasks.fairseq_task | can_reuse_epoch_itr = True",
             "2026-11-27 13:52:26 | INFO | fairseq.tasks.fairseq_task | reuse_dataloader = True",
             "2026-11-27 13:52:26 | INFO | fairseq.tasks.fairseq_task | rebuild_batches = False",
             "2026-11-27 13:52:26 | INFO | fairseq.tasks.fairseq_task | creating new batches for epoch 2",
             "INFO:fairseq.tasks.fairseq_task:can_reuse_epoch_itr = False"]
    kept = ["2026-11-27 13:52:26 | INFO | fairseq.data.iterators | grouped total_num_itrs = 25",
            "2026-11-27 13:52:26 | INFO | fairseq.trainer | begin training epoch 2",
            "2026-11-27 13:52:26 | INFO | fairseq_cli.train | rebuild_batches = False (not fairseq_task's)"]
    assert [line for line in lines + kept if noise.keep(line + "\n")] == kept


def test_an_output_older_than_its_input_is_made_again(tmp_path):
    """A cached step's output (an average, a decoding, a score) counts as done only while no
    input is newer; a newer one is named in one line."""
    from resnmt.experiment.steps import up_to_date

    ckpt, avg, lines = tmp_path / "checkpoint3.pt", tmp_path / "checkpoint.avg1.pt", []
    assert not up_to_date(avg, [ckpt], lines.append) and lines == []
    ckpt.write_bytes(b"1")
    avg.write_bytes(b"2")
    os.utime(ckpt, ns=(0, 10**18))
    os.utime(avg, ns=(0, 10**18 + 1))
    assert up_to_date(avg, [ckpt], lines.append) and lines == []
    os.utime(ckpt, ns=(0, 10**18 + 2))  # checkpoint3.pt written again (training resumed)
    assert not up_to_date(avg, [ckpt], lines.append)
    assert lines == [f"{ckpt} is newer than {avg}: making it again"]


def test_without_verbose_the_training_step_prints_its_numbers_not_fairseqs_info_lines():
    """What resnmt-experiment prints of fairseq-train's output without --verbose: an epoch's,
    a validation's and a logged update's numbers on short lines of its own; fairseq's other
    INFO lines nothing; a warning or an error as it is."""
    from resnmt.experiment.steps import progress_of
    from resnmt.training.quiet import FairseqNoise

    fairseq = [
        "2026-11-28 00:36:14 | INFO | fairseq_cli.train | task: ResNMTTranslationTask",
        "2026-11-28 00:36:14 | INFO | fairseq.trainer | Loaded checkpoint run/checkpoint_last.pt (epoch 4 @ 30 "
        "updates)",
        "2026-11-28 00:36:19 | INFO | train_inner | epoch 001:    100 / 5 loss=9.1, nll_loss=9.0, num_updates=100",
        "2026-11-28 00:36:21 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.987 | nll_loss 8.986 | "
        "ppl 507 | wps 0 | wpb 734 | bsz 20 | num_updates 5",
        "2026-11-28 00:36:21 | INFO | train | epoch 001 | loss 9.068 | nll_loss 9.075 | ppl 539.4 | wps 5248.9 | "
        "num_updates 5 | lr 0.000447214 | gnorm 0.714 | train_wall 2 | wall 7",
        "2026-11-28 00:36:21 | INFO | fairseq_cli.train | done training in 2.2 seconds",
        "2026-11-28 00:36:21 | WARNING | fairseq.trainer | NaN detected",
        "Traceback (most recent call last):",
    ]
    noise = FairseqNoise()
    assert [progress_of(line + "\n", noise) for line in fairseq] == [
        None, b"[train] loaded run/checkpoint_last.pt (epoch 4 @ 30 updates): training goes on from there\n",
        b"[train] update 100: train loss 9.1\n", b"[train] valid loss 8.987 (nll_loss 8.986) after 5 updates\n",
        b"[train] epoch 1: train loss 9.068, 5 updates\n", None,
        b"2026-11-28 00:36:21 | WARNING | fairseq.trainer | NaN detected\n", b"Traceback (most recent call last):\n"]


def test_a_finished_trainings_data_stamp_hashes_only_files_whose_size_or_time_changed(tmp_path, monkeypatch):
    """train.done's data stamp: unchanged files are not read; a file with a new mtime and the
    same bytes is no change (its new mtime in the stamp now); other bytes of the same size,
    a file gone or added are changes; a stamp without sha256 counts any new mtime."""
    import hashlib

    from resnmt.data import fetch
    from resnmt.experiment.steps import data_changes, data_stamp

    for name, text in (("dict.de.txt", "a 3\n"), ("train.en-de.de.bin", "xyz")):
        (tmp_path / name).write_text(text)
    stamp = data_stamp(tmp_path)
    assert stamp["dict.de.txt"] == [4, (tmp_path / "dict.de.txt").stat().st_mtime_ns,
                                    hashlib.sha256(b"a 3\n").hexdigest()]
    hashed = []
    monkeypatch.setattr(fetch, "sha256_of",
                        lambda path, digest=fetch.sha256_of: hashed.append(path.name) or digest(path))
    assert data_changes(stamp, tmp_path) == ([], stamp) and hashed == []
    os.utime(tmp_path / "dict.de.txt", ns=(0, 10**18))
    changed, now = data_changes(stamp, tmp_path)
    assert (changed, hashed) == ([], ["dict.de.txt"]) and now["dict.de.txt"] == [4, 10**18, stamp["dict.de.txt"][2]]
    (tmp_path / "dict.de.txt").write_text("a 4\n")  # the same size, other bytes
    assert data_changes(stamp, tmp_path)[0] == ["dict.de.txt"]
    (tmp_path / "train.en-de.de.bin").unlink()
    (tmp_path / "valid.en-de.de.bin").write_text("")
    assert data_changes(stamp, tmp_path)[0] == ["dict.de.txt", "train.en-de.de.bin", "valid.en-de.de.bin"]
    hashed.clear()
    assert data_changes({"dict.de.txt": stamp["dict.de.txt"][:2]}, tmp_path)[0][0] == "dict.de.txt" and hashed == []


def test_flags_that_do_not_change_what_is_trained_are_not_compared():
    from resnmt.experiment.steps import flag_changes

    before = ["fairseq-train", "/data/a/bin", "--user-dir", "/venv1/resnmt", "--save-dir", "runs/x", "--lr", "0.0005",
              "--num-workers", "0", "--no-progress-bar", "--share-all-embeddings"]
    now = ["fairseq-train", "/data/a/bin", "--user-dir", "/venv2/resnmt", "--save-dir", "archive/x", "--lr", "0.0007",
           "--log-interval", "10"]
    assert flag_changes(before, now) == ("--lr 0.0005 --share-all-embeddings", "--lr 0.0007")
