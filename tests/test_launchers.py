"""Ranks on the CPU through every launcher a user uses, each with every DDP backend: real
processes over gloo on 127.0.0.1, started as the user starts them (resnmt.training.launch).

* fairseq's own launch: ``fairseq-train ... --cpu --distributed-world-size 2``;
* torchrun, one node x 2 processes and two nodes x 1 (two torchrun commands, --node-rank 0/1);
* SLURM: two tasks with the variables srun gives them and ``scontrol`` a stub on PATH.

The launcher starts the ranks once; in each rank, PROBE runs fairseq-train's ``main`` once
per DDP backend: first as parsed (fairseq's default, pytorch_ddp, no flag), then
legacy_ddp, then no_c10d, each a whole training run of its own (its model built, wrapped
and trained in the process group the launch made). For each launcher and backend: both
ranks end with identical weights, and the losses and weights equal, bit for bit, one
process training the same two batches per update (``--update-freq 2``).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BIN_DIR, REPO_ROOT, built_once, cli_env, run_cli
from model_utils import TINY
from test_distributed import _named_parameters, free_port, probe_train_args

BACKENDS = ("pytorch_ddp", "legacy_ddp", "no_c10d")  # the first: fairseq's default, no flag given
MAX_UPDATE = 3

PROBE = r'''
"""fairseq-train, its main run once per DDP backend of PROBE_BACKENDS (the first as parsed),
recording each update's exact loss and the final weights per rank and backend. Test-only."""
import copy
import json
import os
import sys

import torch
from fairseq.trainer import Trainer
from fairseq_cli import train as train_cli

OUT = os.environ["PROBE_OUT"]
_reduce = Trainer._reduce_and_log_stats


def _reduce_and_log_stats(self, logging_outputs, sample_size, grad_norm=None):
    if grad_norm is not None and logging_outputs:  # a training update, not validation
        out = os.path.join(OUT, self.cfg.distributed_training.ddp_backend)
        os.makedirs(out, exist_ok=True)
        rank, size = self.data_parallel_rank, float(sample_size)
        record = {"update": self.get_num_updates(), "world": self.data_parallel_world_size, "pid": os.getpid(),
                  "loss": sum(float(log.get("loss", 0.0)) for log in logging_outputs) / size}
        with open(os.path.join(out, "loss.rank%d.jsonl" % rank), "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.get_num_updates() == self.cfg.optimization.max_update:
            state = {k: v.detach().clone() for k, v in self.get_model().state_dict().items()}
            torch.save(state, os.path.join(out, "state.rank%d.pt" % rank))
    return _reduce(self, logging_outputs, sample_size, grad_norm)


Trainer._reduce_and_log_stats = _reduce_and_log_stats
_main = train_cli.main


def main_each_backend(cfg, **kwargs):
    backends = os.environ.get("PROBE_BACKENDS")  # unset: once, as parsed
    for i, backend in enumerate(backends.split(",") if backends else [cfg.distributed_training.ddp_backend]):
        run = copy.deepcopy(cfg)
        if i:
            run.distributed_training.ddp_backend = backend
        assert run.distributed_training.ddp_backend == backend, run.distributed_training.ddp_backend
        _main(run, **kwargs)


train_cli.main = main_each_backend  # what cli_main hands to call_main (spawned ranks unpickle it from here)

if __name__ == "__main__":
    sys.argv = ["fairseq-train"] + sys.argv[1:]
    sys.exit(train_cli.cli_main())
'''

# srun's variables for task RANK of 2 on two nodes (one task each); scontrol is the stub below
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_STEP_NODELIST": "node[1-2]",
             "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1"}
SCONTROL = """#!/bin/sh
# SLURM's scontrol, as fairseq calls it: scontrol show hostnames NODELIST
[ "$1 $2 $3" = "show hostnames node[1-2]" ] || { echo "scontrol stub: unexpected arguments: $*" >&2; exit 2; }
printf '127.0.0.1\\n127.0.0.1\\n'
"""


def train_args(probe, data, *extra):
    """``python PROBE DATA ...``: tiny SAS model, no dropout, no checkpoints nor validation
    (the probe records the weights), MAX_UPDATE updates."""
    return [str(a) for a in probe_train_args(probe, data, "unused", ["--arch", "transformer_sas_base"],
                                             "--max-update", str(MAX_UPDATE), "--no-save", "--disable-validation",
                                             *extra)]


def launch(launcher: str, probe: Path, data: Path, out: Path, tmp: Path) -> list:
    """Start 2 ranks with ``launcher`` as a user does; wait for every process; its logs."""
    args, port = train_args(probe, data), free_port()
    env = cli_env(PROBE_OUT=str(out), PROBE_BACKENDS=",".join(BACKENDS))
    torchrun = [str(BIN_DIR / "torchrun"), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    if launcher == "spawn":
        commands = [([*args, "--distributed-world-size", "2"], {})]
    elif launcher == "torchrun_1x2":
        commands = [([*torchrun, "--nnodes", "1", "--nproc-per-node", "2", *args[1:]], {})]
    elif launcher == "torchrun_2x1":
        commands = [([*torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(r), *args[1:]], {})
                    for r in range(2)]
    else:  # slurm
        stub = tmp / "slurm-bin"
        stub.mkdir()
        (stub / "scontrol").write_text(SCONTROL)
        (stub / "scontrol").chmod(0o755)
        commands = [(args, {**SLURM_ENV, "PATH": f"{stub}{os.pathsep}{env['PATH']}",
                                              "SLURM_PROCID": str(r), "SLURM_NODEID": str(r), "SLURM_LOCALID": "0"})
                    for r in range(2)]
    procs = [subprocess.Popen(cmd, cwd=str(REPO_ROOT), env={**env, **extra}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for cmd, extra in commands]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, f"{launcher}: {proc.args} failed:\n{log[-4000:]}"
    return logs


def read_run(out: Path, ranks: int):
    """Per rank: ({update: loss}, final weights, {update: world size})."""
    runs = []
    for rank in range(ranks):
        records = [json.loads(line) for line in (out / f"loss.rank{rank}.jsonl").read_text().splitlines()]
        state = torch.load(out / f"state.rank{rank}.pt", weights_only=True)
        runs.append(({r["update"]: r["loss"] for r in records}, state, {r["update"]: r["world"] for r in records},
                     {r["pid"] for r in records}))
    return runs


@pytest.fixture(scope="module")
def one_process(tiny_bin, tmp_path_factory):
    """The reference: one process, the same two batches per update (--update-freq 2)."""
    def build(root):
        probe = root / "probe.py"
        probe.write_text(PROBE)
        run_cli(train_args(probe, tiny_bin, "--update-freq", "2"), PROBE_OUT=str(root))

    return read_run(built_once(tmp_path_factory, "launchers_one_process", build) / BACKENDS[0], 1)[0]


@pytest.mark.parametrize("launcher", ["spawn", "torchrun_1x2", "torchrun_2x1", "slurm"])
def test_launcher_trains_cpu_ranks_with_every_ddp_backend(tiny_bin, tmp_path, one_process, launcher):
    probe, out = tmp_path / "probe.py", tmp_path / "out"
    probe.write_text(PROBE)
    logs = launch(launcher, probe, tiny_bin, out, tmp_path)
    text = "\n".join(logs)
    assert "distributed init (rank 0)" in text and "distributed init (rank 1)" in text
    ref_losses, ref_state = one_process[0], one_process[1]
    assert sorted(ref_losses) == list(range(1, MAX_UPDATE + 1))
    for backend in BACKENDS:
        (losses0, state0, world0, pids0), (losses1, state1, world1, pids1) = read_run(out / backend, 2)
        assert set(world0.values()) == set(world1.values()) == {2}, backend
        assert not pids0 & pids1, f"{backend}: the two ranks ran in one process"
        # the loss of every update was summed over both ranks: each logs the same
        assert losses0 == losses1, backend
        assert sorted(losses0) == list(range(1, MAX_UPDATE + 1)), backend
        trained = [k for k, _ in _named_parameters(state0)]
        assert trained
        for key in trained:
            assert torch.equal(state0[key], state1[key]), f"{backend}: {key} differs between the ranks"
        # two ranks == one process accumulating the same two batches per update, bit for bit
        # (the all-reduce of two ranks adds the same two gradients as the accumulation)
        assert losses0 == ref_losses, backend
        for key in trained:
            assert torch.equal(state0[key], ref_state[key]), f"{backend}: {key} differs from one process's"


# ------------------------------------------------------------------ what each launcher's variables give

def planned(environ, argv=(), **settings):
    """(processes spawned here, fairseq's distributed settings) that ``plan_cpu_ranks`` makes
    of a launcher's ``environ`` and the command line ``argv`` (``settings``: as parsed)."""
    from fairseq.dataclass.configs import DistributedTrainingConfig

    from resnmt.training.launch import plan_cpu_ranks

    dt = DistributedTrainingConfig(distributed_world_size=1, distributed_num_procs=1, device_id=0)
    for key, value in settings.items():
        setattr(dt, key, value)
    return plan_cpu_ranks(dt, environ, list(argv)), dt


def test_each_launchers_variables_make_ranks_on_gloo(tmp_path):
    # torchrun: its variables, though the CPU's default world size is 1; LOCAL_RANK the device id
    procs, dt = planned({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "3",
                         "LOCAL_RANK": "1"})
    assert procs == 0 and dt.distributed_init_method == "env://" and dt.distributed_backend == "gloo"
    assert (dt.distributed_world_size, dt.distributed_rank, dt.device_id, dt.distributed_no_spawn) == (4, 3, 1, True)
    # SLURM: one rank per task, the first host of the node list; a port every task derives alike
    stub = tmp_path / "scontrol"
    stub.write_text(SCONTROL.replace("127.0.0.1\\n127.0.0.1", "gpu-node1\\ngpu-node2"))
    stub.chmod(0o755)
    env = {**SLURM_ENV, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "PATH": f"{tmp_path}{os.pathsep}/usr/bin:/bin"}
    (procs, dt), (_, dt0) = planned(env), planned({**env, "SLURM_PROCID": "0"})
    assert procs == 0 and dt.distributed_init_method == dt0.distributed_init_method
    assert dt.distributed_init_method.startswith("tcp://gpu-node1:")
    assert (dt.distributed_world_size, dt.distributed_rank, dt0.distributed_rank, dt.device_id) == (2, 1, 0, 0)
    _, dt = planned(env, distributed_port=12345)
    assert dt.distributed_init_method == "tcp://gpu-node1:12345"
    # fairseq's own launch: every rank spawned here, on a free port of 127.0.0.1
    procs, dt = planned({}, ["--distributed-world-size", "3"], distributed_world_size=3)
    assert procs == 3 and dt.distributed_init_method.startswith("tcp://127.0.0.1:")
    # ... or --distributed-num-procs of them, from --distributed-rank, with the user's rendezvous
    procs, dt = planned({}, ["--distributed-num-procs", "2"], distributed_world_size=4, distributed_num_procs=2,
                        distributed_rank=2, distributed_init_method="tcp://10.0.0.1:9000")
    assert procs == 2 and dt.distributed_init_method == "tcp://10.0.0.1:9000"
    # ... also in a SLURM allocation's shell, where srun started no task
    procs, dt = planned({k: v for k, v in env.items() if k != "SLURM_PROCID"},
                        ["--distributed-world-size", "2"], distributed_world_size=2)
    assert procs == 2 and dt.distributed_init_method.startswith("tcp://127.0.0.1:")
    assert planned({})[0] == -1  # one process: not distributed


@pytest.mark.parametrize("environ, argv, settings, message", [
    ({}, ["--distributed-backend", "nccl"], {"distributed_world_size": 2},
     "--distributed-backend nccl: NCCL runs on GPUs only; ranks on the CPU talk over gloo"),
    ({}, ["--distributed-no-spawn"], {"distributed_world_size": 2, "distributed_no_spawn": True},
     "--distributed-no-spawn with --distributed-world-size 2: nothing starts the other ranks"),
    ({}, ["--distributed-num-procs", "3"], {"distributed_world_size": 2, "distributed_num_procs": 3},
     "--distributed-num-procs 3 from --distributed-rank 0: ranks 0..2 do not fit in --distributed-world-size 2"),
    ({**SLURM_ENV, "SLURM_PROCID": "0", "PATH": "/nowhere"}, [], {},
     "SLURM's node list is set (node[1-2]) but its 'scontrol' command is not on PATH"),
    ({**SLURM_ENV, "SLURM_PROCID": "0"}, ["--distributed-world-size", "4"], {"distributed_world_size": 4},
     "--distributed-world-size 4 but SLURM started 2 task(s): on the CPU each task is one rank"),
])
def test_a_launch_that_would_train_nothing_is_refused(environ, argv, settings, message):
    from resnmt.training.launch import LaunchError

    with pytest.raises(LaunchError) as refused:
        planned(environ, argv, **settings)
    assert message in str(refused.value.code) and "\n" not in str(refused.value.code)


def test_fp16_on_the_cpu_is_refused_where_fairseq_needs_a_gpu_for_it():
    from fairseq.dataclass.configs import CommonConfig

    from resnmt.training.launch import LaunchError, refuse_gpu_only_precision

    with pytest.raises(LaunchError, match="--fp16 trains on GPUs only .* on the CPU train in float32"):
        refuse_gpu_only_precision(CommonConfig(fp16=True, cpu=True))
    for fine in (dict(), dict(fp16=True, memory_efficient_fp16=True), dict(fp16=True, bf16=True)):
        refuse_gpu_only_precision(CommonConfig(cpu=True, **fine))  # these run on the CPU


def test_nccl_on_the_cpu_is_refused_in_one_line_before_any_work(tiny_bin, tmp_path):
    save_dir = tmp_path / "run"
    proc = run_cli(["fairseq-train", tiny_bin, "--user-dir", REPO_ROOT / "resnmt", "--task", "resnmt_translation",
                    "--arch", "transformer_sas_base", *TINY, "--max-tokens", "600", "--save-dir", save_dir, "--cpu",
                    "--distributed-world-size", "2", "--distributed-backend", "nccl"], check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "fairseq-train: error: --distributed-backend nccl: NCCL runs on GPUs only; ranks on the CPU talk over gloo "
        "(--distributed-backend gloo, the default with --cpu)")
    assert "Traceback" not in proc.stderr and not save_dir.exists()


# ------------------------------------------------------------------ the project's commands: the same launch with --cpu

from test_train_scripts import dry_run, flag, train_sh  # noqa: E402,F401  (fixtures: train.sh in-process)


@pytest.mark.parametrize("launcher, head", [
    ("spawn", ["fairseq-train"]),
    ("torchrun", ["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                  "--master-port", "29500"]),
    ("slurm", ["srun", "--nodes", "2", "--ntasks-per-node", "{tasks}"]),
])
def test_cpu_rehearses_the_cluster_command(dry_run, launcher, head):
    """--cpu runs the GPU cluster's command on CPU ranks: the same launcher, ranks, batch and
    flags, plus fairseq's --cpu (SLURM: one task per CPU rank, where a GPU node spawns its GPUs)."""
    nodes = [] if launcher == "spawn" else ["--nodes", "2"]
    where = ["--node-rank", "1", "--master-addr", "10.0.0.1"] if launcher == "torchrun" else []
    args = ["--launcher", launcher, *nodes, *where, "--gpus", "2", "--preset", "small", "--max-update", "50",
            "multi30k", "transformer_sas_base"]
    gpu, _ = dry_run(*args)
    cpu, err = dry_run("--cpu", *args)
    world = "2" if launcher == "spawn" else "4"
    assert f"{world} process(es) (2 CPU rank(s) x {1 if launcher == 'spawn' else 2} node(s))" in err
    assert cpu[:len(head)] == [h.format(tasks=2) for h in head] and flag(cpu, "--distributed-world-size") == world
    assert gpu[:len(head)] == [h.format(tasks=1) for h in head]
    assert [w for w in cpu if w != "--cpu"][len(head):] == gpu[len(head):] and cpu.count("--cpu") == 1


@pytest.mark.parametrize("args, message", [
    (["--nodes", "2", "multi30k", "transformer"], "--nodes 2 needs --launcher torchrun or --launcher slurm"),
    (["--launcher", "slurm", "--nodes", "2", "--node-rank", "1", "multi30k", "transformer"],
     "--node-rank 1 is torchrun's (--launcher torchrun); spawn runs on one node and SLURM numbers the nodes itself"),
])
def test_a_launch_the_launcher_cannot_make_is_refused(train_sh, tmp_path, args, message):
    status, _, err = train_sh("--cpu", "--save-dir", tmp_path / "run", *args)
    assert status == 2 and err.splitlines()[-1].startswith(f"[train] error: {message}")
    assert not (tmp_path / "run").exists()


def test_slurm_without_srun_says_what_is_missing(train_sh, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(BIN_DIR))  # the venv's tools, no SLURM
    save_dir = tmp_path / "run"
    status, _, err = train_sh("--cpu", "--launcher", "slurm", "--nodes", "2", "--save-dir", save_dir,
                              "multi30k", "transformer_sas_base")
    assert status == 1 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "[train] error: 'srun' not found on PATH: --launcher slurm runs inside a SLURM allocation, on a cluster "
        "whose administrators installed SLURM (it is not a Python package): on its login node, salloc --nodes 2 then "
        "this command, or this command in an sbatch script; on a machine without SLURM, --launcher torchrun starts "
        "the same ranks (add --cpu to rehearse on this machine's CPU)")
    assert not save_dir.exists()


def test_experiment_takes_the_launch_options(tmp_path, capsys, monkeypatch):
    from resnmt.cli import experiment as cli
    from resnmt.experiment import presets
    from test_train_scripts import call_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(presets, "count_gpus", lambda: 0)
    status, out, err = call_main(cli.main, ["--help"], capsys)
    for word in ("--nodes", "--launcher", "--cpu", "--node-rank", "spawn", "torchrun", "slurm"):
        assert word in out, word
    status, out, err = call_main(cli.main, ["--dry-run", "--cpu", "--gpus", "2", "--launcher", "torchrun", "--nodes",
                                            "2", "--node-rank", "1", "multi30k", "transformer_sas_base"], capsys)
    assert status == 0, err
    train = next(line for line in out.splitlines() if line.startswith("2. train"))
    assert "torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 " in train and " --cpu " in train


@pytest.mark.slow  # the command it runs is test_cpu_rehearses_the_cluster_command's, whose launch runs by default
def test_train_sh_launches_cpu_ranks_with_torchrun(train_sh, tiny_bin, tmp_path):
    """scripts/train.sh --cpu --gpus 2 --launcher torchrun: torchrun starts two CPU ranks
    that train together; checkpoint_last.pt holds the updates asked for."""
    save_dir = tmp_path / "run"
    status, out, err = train_sh("--cpu", "--gpus", "2", "--launcher", "torchrun", "--master-port", free_port(),
                                "--data", tiny_bin, "--save-dir", save_dir, "--max-update", "3", "--max-tokens", "600",
                                "multi30k", "transformer_sas_base", "--", *TINY, "--num-workers", "0",
                                "--no-epoch-checkpoints", "--disable-validation")
    log = (save_dir / "train.log").read_text()
    assert status == 0, err + log[-3000:]
    assert (save_dir / "train.cmd").read_text().startswith("torchrun --nnodes 1 --nproc-per-node 2 ")
    assert "distributed init (rank 0): env://" in log and "distributed init (rank 1): env://" in log
    assert "training on 2 devices" in log
    ckpt = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert ckpt["optimizer_history"][-1]["num_updates"] == 3


# ------------------------------------------------------------------ docs/training.md's launch commands

def documented_launch_commands():
    """The command lines of docs/training.md's section on launchers, ``$ARGS`` expanded."""
    import re
    import shlex

    text = (REPO_ROOT / "docs" / "training.md").read_text()
    section = text.split("## One GPU, several GPUs, several nodes")[1].split("\n## ")[0]
    lines = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()]
    args, commands = None, []
    for line in [line for line in "\n".join(lines).replace('"\n  ', '" ').replace("\n  ", " ").splitlines()]:
        if line.startswith("ARGS="):
            args = shlex.split(line[len("ARGS="):])[0]
        elif line and not line.startswith("#"):
            words = shlex.split(line.split("  #")[0].replace("$ARGS", args or "").replace("$(which fairseq-train)",
                                                                                      "fairseq-train"))
            commands.append([w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)])  # VAR=value prefixes
    return commands


def test_documented_launch_commands_parse(capsys, monkeypatch, tmp_path):
    """Each command of the section parses as its program parses it: fairseq-train's flags (also
    behind torchrun and srun: torchrun's own parser for its part) and scripts/train.sh's
    (--dry-run, which checks the fairseq flags it builds too)."""
    from fairseq import options
    from torch.distributed.run import get_args_parser

    from resnmt.cli import experiment as cli
    from resnmt.experiment import presets
    from test_train_scripts import call_main

    commands = documented_launch_commands()
    programs = {c[0] for c in commands}
    assert programs == {"fairseq-train", "torchrun", "srun", "scripts/train.sh"}, programs
    assert sum(c[0] == "scripts/train.sh" and "--cpu" in c for c in commands) >= 5
    monkeypatch.setattr(presets, "count_gpus", lambda: 0)
    for command in commands:
        monkeypatch.chdir(REPO_ROOT)
        program, rest = command[0], command[1:]
        if program == "scripts/train.sh":
            monkeypatch.chdir(tmp_path)
            status, _, err = call_main(cli.train_main, ["--dry-run", *rest], capsys)
            assert status == 0, f"{command}: {err}"
            continue
        if program == "torchrun":
            parsed = get_args_parser().parse_args(rest)
            assert parsed.training_script == "fairseq-train", command
            rest = parsed.training_script_args
        elif program == "srun":
            rest = rest[rest.index("fairseq-train") + 1:]
        args = options.parse_args_and_arch(options.get_training_parser(), input_args=rest)
        assert args.cpu and args.arch == "transformer_sas_base" and args.max_update == 20, command
