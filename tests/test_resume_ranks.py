"""Stopping a run of several ranks anywhere and continuing it anywhere (resnmt/training/resume.py).

Each rank is a real process running fairseq-train's entry point through test_distributed's
probe (exact per-update losses, the sentence ids of every update, final weights; PROBE_STOP
kills or stops a rank at an update), over gloo on 127.0.0.1; the ranks of a run are
started together by RANKS below, one command per rank as a launcher runs them. The tiny
post-LN model, the tiny Multi30k corpus: 10 batches of --max-tokens 600 per epoch, so an
epoch is 5 updates of 2 ranks and the runs stop and resume inside epoch 1.

* A 2-rank run stopped after update 3 (both ranks killed, one rank killed, or rank 0 killed
  half-way through copying its checkpoint of update 4 to checkpoint_last.pt) and started
  again with the same command resumes from update 2 without a flag and ends with the
  uninterrupted run's losses and weights bit for bit; the rank left alive names the lost
  one and the checkpoint within seconds.
* The same checkpoint resumed by 1 process with --update-freq 2, and a 1-process run's by 2
  ranks, continue with the uninterrupted run's losses (float rounding apart: a sum over
  the same sentences in another order).
* Where the batch of an update changes (1 process -> 2 ranks, same --update-freq), one
  line says so before the first update, and every sentence of the epoch is still seen once.
* A rank that hangs (SIGSTOP) stops the others after --distributed-timeout.
* ``torchrun --max-restarts 1`` with a rank killed once restarts the run, which resumes and
  ends with the uninterrupted run's losses and weights.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BIN_DIR, REPO_ROOT, built_once, cli_env, run_cli
from test_distributed import _named_parameters, free_port, probe_train_args, write_probe

ARCH = ["--arch", "transformer_postln_base"]
DDP = []  # fairseq's default DDP backend (pytorch_ddp)
MAX_UPDATE = 6
SAVE_EVERY = ["--save-interval-updates", "2"]
CENSUS_S = 3  # resnmt.training.resume.CENSUS_S

RANKS = r'''
"""Start WORLD ranks of a fairseq-train command (the probe) as processes forked from this
one, the same arguments for each and --distributed-rank R (WORLD 1: one process, as is),
then wait for them; once one has ended the others get GRACE seconds before SIGKILL.
OUT/ranks.json: each rank's exit status, the seconds it ended after the first one, and the
ranks this driver killed. Test-only."""
import atexit, json, os, runpy, signal, sys, time, traceback
import fairseq_cli.train  # noqa: F401  (imported once, before the ranks fork, with the --user-dir's package)
import resnmt  # noqa: F401

probe, out, world, grace, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5:]
os.makedirs(out, exist_ok=True)
pids = {}
for rank in range(world):
    pid = os.fork()
    if pid == 0:
        log = os.open(os.path.join(out, "rank%d.log" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.argv = [probe, *args, *(["--distributed-rank", str(rank)] if world > 1 else [])]
        code = 0
        try:
            runpy.run_path(probe, run_name="__main__")
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    pids[pid] = rank
status, ended, killed, first = {}, {}, [], None
while len(status) < world:
    pid, wait_status = os.waitpid(-1, os.WNOHANG)
    if pid:
        status[pids[pid]] = os.waitstatus_to_exitcode(wait_status)
        ended[pids[pid]] = time.monotonic()
        first = first or ended[pids[pid]]
        continue
    if first is not None and time.monotonic() - first > grace:
        for pid, rank in pids.items():
            if rank not in status and rank not in killed:
                killed.append(rank)
                os.kill(pid, signal.SIGKILL)
    time.sleep(0.02)
with open(os.path.join(out, "ranks.json"), "w") as f:
    json.dump({"exit": [status[r] for r in range(world)], "after_first": [ended[r] - first for r in range(world)],
               "killed": killed}, f)
'''


def ranks_driver(directory: Path) -> Path:
    path = directory / "ranks_driver.py"
    if not path.exists():
        path.write_text(RANKS)
    return path


def train(root: Path, data, save_dir, out, world=2, update_freq=1, stop=None, grace=30.0, extra=(), ddp=DDP):
    """One run of ``world`` ranks (``update_freq``), the probe's records in ``out``; PROBE_STOP
    ``stop``. Returns ranks.json and each rank's log."""
    probe = write_probe(root) if not (root / "fairseq_train_probe.py").exists() else root / "fairseq_train_probe.py"
    args = probe_train_args(probe, data, save_dir, ARCH, "--max-update", str(MAX_UPDATE), *SAVE_EVERY,
                            "--update-freq", str(update_freq), *extra)[2:]
    if world > 1:
        args += ["--distributed-world-size", str(world), "--distributed-num-procs", "1",
                 "--distributed-backend", "gloo", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}",
                 "--distributed-no-spawn", "--device-id", "0", *ddp]
    env = {"PROBE_OUT": str(out)}
    if stop:
        env["PROBE_STOP"] = stop
    run_cli([sys.executable, ranks_driver(root), probe, out, world, grace, *args], timeout=300, **env)
    result = json.loads((out / "ranks.json").read_text())
    result["logs"] = [(out / f"rank{r}.log").read_text() for r in range(world)]
    return result


def all_ok(result):
    for rank, (code, log) in enumerate(zip(result["exit"], result["logs"])):
        assert code == 0, f"rank {rank} ended with {code}:\n{log[-3000:]}"


def records(out: Path, rank=0) -> dict:
    """{update: record} of the probe; a later record of the same update (after a restart) wins."""
    found = {}
    for line in (out / f"loss.rank{rank}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        found[rec["update"]] = rec
    return found


def final_weights(out: Path, rank=0) -> dict:
    state = torch.load(out / f"state.rank{rank}.pt", weights_only=True)
    assert state["num_updates"] == MAX_UPDATE
    return dict(_named_parameters(state["model"]))


def checkpoint_updates(path: Path) -> int:
    return torch.load(path, weights_only=True)["optimizer_history"][-1]["num_updates"]


@pytest.fixture(scope="module")
def reference(tiny_bin, tmp_path_factory):
    """The uninterrupted 2-rank run (fairseq's default DDP backend): its probe output."""
    def run(root):
        all_ok(train(root, tiny_bin, root / "ckpt", root / "out"))

    return built_once(tmp_path_factory, "resume_ranks_reference", run) / "out"


@pytest.fixture(scope="module")
def stopped_two_ranks(tiny_bin, tmp_path_factory):
    """The same 2-rank command with both ranks killed after update 3 (its last checkpoint: update 2)."""
    def run(root):
        result = train(root, tiny_bin, root / "ckpt", root / "out", stop="0,1@3:KILL")
        assert result["exit"] == [-9, -9], result
        assert checkpoint_updates(root / "ckpt" / "checkpoint_last.pt") == 2

    return built_once(tmp_path_factory, "resume_ranks_stopped", run)


def copy_run(stopped: Path, dest: Path):
    shutil.copytree(stopped / "ckpt", dest / "ckpt")
    shutil.copytree(stopped / "out", dest / "out")


def assert_same_as(reference: Path, out: Path, exact=True, ranks=(0, 1)):
    """The run in ``out`` (restarted: its later records win) has the reference's losses at every
    update and its final weights, on each of ``ranks``; bit for bit where ``exact``."""
    ref, got = records(reference), records(out)
    assert sorted(got) == sorted(ref) == list(range(1, MAX_UPDATE + 1))
    for update in ref:
        if exact:
            assert got[update]["loss"] == ref[update]["loss"], update
        else:
            assert got[update]["loss"] == pytest.approx(ref[update]["loss"], rel=1e-6), update
    expected = final_weights(reference)
    for rank in ranks:
        weights = final_weights(out, rank)
        assert weights.keys() == expected.keys()
        for name, value in expected.items():
            if exact:
                assert torch.equal(weights[name], value), f"rank {rank}: {name}"
            else:
                torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=1e-6, msg=f"rank {rank}: {name}")


def last_line(log: str) -> str:
    return log.rstrip("\n").rsplit("\n", 1)[-1]


@pytest.mark.parametrize("how", ["job", "rank", "writer"])
def test_a_stopped_two_rank_run_resumes_exactly_with_the_same_command(tiny_bin, tmp_path, reference,
                                                                     stopped_two_ranks, how):
    """Stopped after update 3 (``job``: both ranks killed; ``rank``: rank 1 killed, rank 0
    left; ``writer``: rank 0 killed while copying its checkpoint of update 4 to
    checkpoint_last.pt, with --ddp-backend legacy_ddp), then the same command again: the
    uninterrupted run's losses and weights, bit for bit."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    ddp = ["--ddp-backend", "legacy_ddp"] if how == "writer" else DDP
    if how == "job":
        copy_run(stopped_two_ranks, tmp_path)
    else:
        stop = {"rank": "1@3:KILL", "writer": "0@4:COPY"}[how]
        stopped = train(tmp_path, tiny_bin, ckpt, out, stop=stop, ddp=ddp)
        dead, alive = (1, 0) if how == "rank" else (0, 1)
        assert stopped["exit"][dead] == -9 and stopped["exit"][alive] == 1, stopped
        assert not stopped["killed"], "the rank left alive did not stop by itself"
        assert stopped["after_first"][alive] < CENSUS_S + 10, stopped["after_first"]
        assert last_line(stopped["logs"][alive]) == (
            f"fairseq-train: error: rank {dead} of 2 lost (its connection closed, or no answer within "
            f"--distributed-timeout 300 s); training stopped, and a re-run of the same command resumes from "
            f"{ckpt}/checkpoint_last.pt (epoch 1, 2 updates)")
        # the copy that was cut short never replaced the checkpoint of update 2
        assert checkpoint_updates(ckpt / "checkpoint_last.pt") == 2
        if how == "writer":
            assert checkpoint_updates(ckpt / "checkpoint_1_4.pt") == 4  # written whole before the copy
    resumed = train(tmp_path, tiny_bin, ckpt, out, ddp=ddp)
    all_ok(resumed)
    assert "Loaded checkpoint" in resumed["logs"][0] and "(epoch 1 @ 2 updates)" in resumed["logs"][0]
    assert_same_as(reference, out)
    assert checkpoint_updates(ckpt / "checkpoint_last.pt") == MAX_UPDATE


def test_two_ranks_resume_on_one_and_one_on_two(tiny_bin, tmp_path, reference, stopped_two_ranks):
    """2 ranks -> 1 process with --update-freq 2, and 1 process (--update-freq 2) -> 2 ranks,
    mid-epoch: the uninterrupted run's losses and weights (one sum over the same sentences)."""
    two_to_one = tmp_path / "two_to_one"
    copy_run(stopped_two_ranks, two_to_one)
    resumed = train(tmp_path, tiny_bin, two_to_one / "ckpt", two_to_one / "out", world=1, update_freq=2)
    all_ok(resumed)
    assert ("epoch 1: 4 of its batches were taken by 2 rank(s); 1 rank(s) take the rest, each batch once"
            in resumed["logs"][0])
    assert "resuming a run of 2 ranks x --update-freq 1 x --max-tokens 600 on 1 rank x --update-freq 2 x " \
           "--max-tokens 600: the same batches per update" in resumed["logs"][0]
    assert_same_as(reference, two_to_one / "out", exact=False, ranks=(0,))

    one_to_two = tmp_path / "one_to_two"
    stopped = train(tmp_path, tiny_bin, one_to_two / "ckpt", one_to_two / "out", world=1, update_freq=2,
                    stop="0@3:KILL")
    assert stopped["exit"] == [-9]
    resumed = train(tmp_path, tiny_bin, one_to_two / "ckpt", one_to_two / "out")
    all_ok(resumed)
    assert_same_as(reference, one_to_two / "out", exact=False)


def test_another_global_batch_is_said_and_each_sentence_still_seen_once(tiny_bin, tmp_path, reference):
    """1 process (--update-freq 1) stopped after update 4, its checkpoint of update 3 (3 of the
    epoch's 10 batches taken), resumed by 2 ranks: one line before the first update says each
    update now takes 2 batches; the 2 ranks share the 7 batches left, so every sentence of
    epoch 1 is seen once."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    extra = ["--save-interval-updates", "3", "--max-update", "7"]
    stopped = train(tmp_path, tiny_bin, ckpt, out, world=1, stop="0@4:KILL", extra=extra)
    assert stopped["exit"] == [-9]
    assert checkpoint_updates(ckpt / "checkpoint_last.pt") == 3
    first = records(out)
    resumed = train(tmp_path, tiny_bin, ckpt, out, extra=extra)
    all_ok(resumed)
    log = resumed["logs"][0]
    line = ("resuming a run of 1 rank x --update-freq 1 x --max-tokens 600 on 2 ranks x --update-freq 1 x "
            "--max-tokens 600: each update takes 2 batches of the epoch's order instead of 1; the rest of epoch 1 "
            "is seen once and the learning-rate schedule goes on by updates, so the losses will differ from the "
            "run's had it gone on unchanged")
    assert line in log
    assert log.index(line) < log.index('"num_updates": "4"'), "the line comes after an update"
    later = [records(out, rank) for rank in range(2)]
    seen = [i for u in (1, 2, 3) for i in first[u]["ids"]]  # the checkpoint's updates
    epoch_1 = [u for u in sorted(later[0]) if u > 3 and later[0][u]["epoch"] == 1]
    assert epoch_1 == [4, 5, 6, 7]  # 7 batches left: 3 updates of 2 and one of a batch (and a dummy)
    seen += [i for u in epoch_1 for rank in range(2) for i in later[rank][u]["ids"]]
    # the sentences of epoch 1's batches, as the uninterrupted run took them (fairseq's batches
    # leave out 4 of the 300: a last batch short of --required-batch-size-multiple)
    ref = [records(reference, rank) for rank in range(2)]
    epoch = sorted(i for rank in range(2) for rec in ref[rank].values() if rec["epoch"] == 1 for i in rec["ids"])
    assert len(epoch) == len(set(epoch)) == 296
    assert sorted(seen) == epoch, "a sentence of epoch 1 was seen twice or not at all"


@pytest.mark.slow  # a rank that dies (SIGKILL) stops the others within seconds in the default suite
def test_a_hung_rank_stops_the_others_after_the_timeout(tiny_bin, tmp_path):
    """Rank 1 stopped (SIGSTOP) after update 3: rank 0 waits --distributed-timeout 6 s in its
    next collective, then ends naming rank 1 and the checkpoint."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    result = train(tmp_path, tiny_bin, ckpt, out, stop="1@3:STOP", grace=1,
                   extra=["--distributed-timeout", "6"])
    assert result["exit"][0] == 1 and result["killed"] == [1], result
    assert last_line(result["logs"][0]) == (
        "fairseq-train: error: rank 1 of 2 lost (its connection closed, or no answer within --distributed-timeout "
        f"6 s); training stopped, and a re-run of the same command resumes from {ckpt}/checkpoint_last.pt "
        "(epoch 1, 2 updates)")


def test_torchrun_restarts_a_run_whose_rank_was_killed_once(tiny_bin, tmp_path, reference):
    """torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 1, rank 1 killed after update 3 in
    the first attempt: torchrun restarts both ranks, which resume from the checkpoint of update
    2 and end with the uninterrupted run's losses and weights, bit for bit."""
    probe, ckpt, out = write_probe(tmp_path), tmp_path / "ckpt", tmp_path / "out"
    args = probe_train_args(probe, tiny_bin, ckpt, ARCH, "--max-update", str(MAX_UPDATE), *SAVE_EVERY, *DDP)[1:]
    command = [BIN_DIR / "torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]
    proc = subprocess.run([str(a) for a in command], cwd=str(REPO_ROOT), env=cli_env(PROBE_OUT=str(out),
                          PROBE_STOP="1@3:KILL"), capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "Loaded checkpoint" in log and "(epoch 1 @ 2 updates)" in log, "the restart did not resume"
    attempts = {json.loads(line)["pid"] for line in (out / "loss.rank1.jsonl").read_text().splitlines()}
    assert len(attempts) == 2, "rank 1 did not train in two processes (killed, then restarted)"
    assert_same_as(reference, out)


class Items(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def epoch_iterators(world: int, n: int = 23):
    """fairseq's EpochBatchIterator of each of ``world`` ranks over ``n`` one-item batches."""
    from fairseq.data import iterators

    import resnmt  # noqa: F401  (its patches, iterators-resume-at-any-world-size among them)
    from resnmt import fairseq_patches

    assert fairseq_patches.applied("iterators-resume-at-any-world-size")
    return [iterators.EpochBatchIterator(Items(n), collate_fn=list, batch_sampler=[[i] for i in range(n)], seed=1,
                                         num_shards=world, shard_id=rank, epoch=1, buffer_size=0)
            for rank in range(world)]


@pytest.mark.parametrize("worlds", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 3), (2, 3, 1), (1, 4, 2)])
def test_an_epoch_continued_on_other_numbers_of_ranks_takes_each_batch_once(worlds):
    """fairseq's own iterators, in this process: an epoch of 23 batches taken in turns by
    each number of ranks of ``worlds`` (a few updates each, then its state handed to the
    next): every batch of the epoch is taken exactly once, in the epoch's order."""
    world, itrs = worlds[0], epoch_iterators(worlds[0])
    running = [itr.next_epoch_itr(shuffle=True) for itr in itrs]
    order = [b[0] for b in epoch_iterators(1)[0].next_epoch_itr(shuffle=True)]  # one process's order
    taken = []
    for following in worlds[1:]:
        for _ in range(3):  # 3 updates of `world` ranks: each rank takes a batch per update
            taken += [b[0] for it in running for b in [next(it)] if b]
        state = itrs[0].state_dict()
        assert all(itr.state_dict() == state for itr in itrs)
        world, itrs = following, epoch_iterators(following)
        for itr in itrs:
            itr.load_state_dict(state)
        running = [itr.next_epoch_itr(shuffle=True) for itr in itrs]
    rest = [list(it) for it in running]  # the last run of ranks ends the epoch
    assert len({len(r) for r in rest}) == 1, "the ranks would take different numbers of updates"
    taken += [b[0] for update in zip(*rest) for b in update if b]
    assert taken == order


def test_what_a_resumed_run_does_is_said_in_one_line():
    """Another --max-tokens: the epoch's other batches, the share of it done skipped, said;
    the same update split otherwise (2 ranks x 1 -> 1 x 2): nothing to say; another
    global batch: one line; --distributed-timeout 0: refused in one line."""
    from types import SimpleNamespace

    from resnmt.training.launch import LaunchError
    from resnmt.training.resume import global_batch_change, resume_point, timeout_of

    state = {"epoch": 2, "iterations_in_epoch": 5, "num_shards": 2, "batches_done": 10, "batches_in_epoch": 20}
    assert resume_point(state, 1, 20) == (10, 0, None)
    assert resume_point(state, 4, 20) == (2, 2, None)
    iterations, shift, note = resume_point(state, 2, 40)
    assert (iterations, shift) == (10, 0)
    assert note == ("epoch 2 now has 40 batches, the checkpoint's run had 20 (other --max-tokens, --batch-size or "
                    "data): the run skips the first 20, the share of the epoch done (10 of 20); sentences of the "
                    "epoch may be seen twice or not at all")
    two = {"world_size": 2, "update_freq": [1], "max_tokens": 4096, "batch_size": None}
    assert global_batch_change(two, dict(two, world_size=1, update_freq=[2]), epoch=3) is None
    assert global_batch_change(two, dict(two, max_tokens=8192), epoch=1).startswith(
        "resuming a run of 2 ranks x --update-freq 1 x --max-tokens 4096 on 2 ranks x --update-freq 1 x "
        "--max-tokens 8192; the rest of epoch 1 is seen once")
    with pytest.raises(LaunchError, match=r"--distributed-timeout 0: must be a number of seconds > 0$"):
        timeout_of(SimpleNamespace(task=SimpleNamespace(distributed_timeout=0)))
    assert timeout_of(SimpleNamespace(task=SimpleNamespace())) == 300
