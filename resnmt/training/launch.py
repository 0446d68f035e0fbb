"""Data-parallel ranks on the CPU with every launcher: fairseq 0.12.3's launch code assumes
one CUDA device per rank. Two patches, each of one place of fairseq and idempotent:
``ddp_on_cpu_modules`` (its default DDP backend on a CPU module) and
``cpu_ranks_with_every_launcher`` (its launch: spawn, torchrun, SLURM), whose rule is
``plan_cpu_ranks``; so that a cluster command runs as printed on a laptop with ``--cpu``
(gloo over TCP), the same ``torch.distributed`` code a GPU run takes, NCCL aside.
"""
import functools
import os
import random
import socket
import subprocess
import sys


def ddp_on_cpu_modules() -> None:
    """``--ddp-backend c10d``/``pytorch_ddp`` (fairseq's default) on a CPU module.

    fairseq 0.12.3 (``fairseq/models/distributed_fairseq_model.py``) builds torch's
    ``DistributedDataParallel(module, device_ids=[device_id], output_device=device_id, ...)``
    whatever the module's device; torch refuses ``device_ids`` for a module on the CPU
    (``ValueError: DistributedDataParallel device_ids and output_device arguments only work
    with single-device/multiple-device GPU modules or CPU modules``). The constructor that
    module calls is replaced by one that drops ``device_ids`` and ``output_device`` where
    every parameter is on the CPU (torch's documented use for CPU modules) and passes
    everything else on unchanged; a GPU module is built exactly as before."""
    from fairseq.models import distributed_fairseq_model as dfm

    if getattr(dfm.DistributedDataParallel, "resnmt_cpu_ddp", False):
        return
    ddp = dfm.DistributedDataParallel

    @functools.wraps(ddp, updated=())
    def distributed_data_parallel(module, *args, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        return ddp(module, *args, device_ids=device_ids, output_device=output_device, **kwargs)

    distributed_data_parallel.resnmt_cpu_ddp = True
    dfm.DistributedDataParallel = distributed_data_parallel


# ----------------------------------------------------------------------------- where the ranks come from

# How fairseq's own launch starts CPU ranks: forked on Linux, each rank a copy of the process that
# parsed the command (torch, fairseq and the user directory imported once, not once per rank as
# with fairseq's "spawn", which CUDA needs and the CPU does not); spawned elsewhere (macOS).
CPU_START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"
TORCHRUN_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")  # what torchrun (and torch.distributed.launch) set


class LaunchError(SystemExit):
    """A launch refused before anything runs: one line, ``PROG: error: MESSAGE`` (exit 1)."""

    def __init__(self, message: str):
        super().__init__(f"{os.path.basename(sys.argv[0]) or 'fairseq-train'}: error: {message}")


def _given(argv, flag: str) -> bool:
    """``flag`` is on the command line ``argv`` (``--flag V`` or ``--flag=V``)."""
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_port(environ) -> int:
    """The port every task of a SLURM job derives alike from its job id (fairseq's rule on
    GPUs, ``_infer_single_node_init``), so that no flag has to name one."""
    job = environ.get("SLURM_JOB_ID", "0") + environ.get("SLURM_ARRAY_TASK_ID", "")
    return random.Random(int(job)).randint(10000, 60000)


def _first_slurm_host(node_list: str, environ) -> str:
    """The first host of SLURM's compressed ``node_list`` (``node[1-2]``), as fairseq asks
    ``scontrol`` for it (found on ``environ``'s PATH)."""
    try:
        hosts = subprocess.check_output(["scontrol", "show", "hostnames", node_list], text=True,
                                        env=dict(environ)).split()
    except FileNotFoundError:
        raise LaunchError(f"SLURM's node list is set ({node_list}) but its 'scontrol' command is "
                          "not on PATH: run inside the SLURM allocation (srun ...), on a node where SLURM's client "
                          "commands are installed") from None
    except subprocess.CalledProcessError as e:
        raise LaunchError(f"scontrol show hostnames {node_list} failed (exit {e.returncode}): SLURM's node list "
                          "names no host") from None
    if not hosts:
        raise LaunchError(f"scontrol show hostnames {node_list} printed no host")
    return hosts[0]


def refuse_gpu_only_precision(common) -> None:
    """``--fp16`` on the CPU: fairseq's FP16Optimizer keeps its flattened float32 master weights
    on ``torch.cuda.current_device()`` (a traceback after the model is built); refused in one
    line (LaunchError) naming what trains on the CPU instead."""
    flattened = not (common.bf16 or common.memory_efficient_fp16 or common.amp or common.fp16_no_flatten_grads)
    if common.fp16 and flattened:
        raise LaunchError("--fp16 trains on GPUs only (fairseq's fp16 optimizer keeps its float32 master weights on "
                          "one); on the CPU train in float32 (no flag), or in bf16 with resnmt-train --bf16")


def plan_cpu_ranks(dt, environ, argv) -> int:
    """Fill fairseq's distributed settings ``dt`` (``cfg.distributed_training``) for ranks on
    the CPU from the launcher that started this process; returns how many processes this one
    spawns (fairseq's own launch), 0 where it is one rank itself (torchrun, SLURM, or
    ``--distributed-no-spawn``), -1 where the run is not distributed. Refuses (LaunchError,
    one line) a GPU-only flag and a launch that would train nothing. ``environ``: the
    launcher's variables; ``argv``: the command line (what was given, not defaulted)."""
    if dt.distributed_backend == "nccl":
        if _given(argv, "--distributed-backend"):
            raise LaunchError("--distributed-backend nccl: NCCL runs on GPUs only; ranks on the CPU talk over gloo "
                              "(--distributed-backend gloo, the default with --cpu)")
        dt.distributed_backend = "gloo"
    if dt.pipeline_model_parallel:
        raise LaunchError("--pipeline-model-parallel: fairseq's pipeline places layers on GPUs; it cannot run with --cpu")
    world, rank = dt.distributed_world_size, dt.distributed_rank or 0
    if dt.distributed_init_method is not None:  # the user's own rendezvous: fairseq's launch as it is
        return 0 if dt.distributed_no_spawn else _spawned_here(dt, argv, rank)
    if all(k in environ for k in TORCHRUN_ENV) and (int(environ["WORLD_SIZE"]) > 1 or world > 1):
        dt.distributed_init_method = "env://"
        dt.distributed_world_size, dt.distributed_rank = int(environ["WORLD_SIZE"]), int(environ["RANK"])
        dt.device_id, dt.distributed_no_spawn = int(environ.get("LOCAL_RANK", 0)), True
        return 0
    node_list = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    tasks = int(environ.get("SLURM_NTASKS") or environ.get("SLURM_STEP_NUM_TASKS") or 1)
    # a task of srun (SLURM_PROCID); in an allocation's shell (salloc) the ranks are this process's to start
    if node_list and "SLURM_PROCID" in environ and (tasks > 1 or world > 1):
        if world != tasks and _given(argv, "--distributed-world-size"):
            raise LaunchError(f"--distributed-world-size {world} but SLURM started {tasks} task(s): on the CPU each "
                              f"task is one rank (srun --ntasks {world}, or drop --distributed-world-size)")
        port = dt.distributed_port if dt.distributed_port > 0 else _slurm_port(environ)
        dt.distributed_init_method = f"tcp://{_first_slurm_host(node_list, environ)}:{port}"
        dt.distributed_world_size, dt.distributed_rank = tasks, int(environ.get("SLURM_PROCID", 0))
        dt.device_id, dt.distributed_no_spawn = int(environ.get("SLURM_LOCALID", 0)), True
        return 0
    if world == 1:
        return -1
    if dt.distributed_no_spawn:
        raise LaunchError(f"--distributed-no-spawn with --distributed-world-size {world}: nothing starts the other "
                          "ranks (no --distributed-init-method, no torchrun or SLURM environment); drop "
                          f"--distributed-no-spawn to start {world} ranks here, or launch with torchrun")
    port = dt.distributed_port if dt.distributed_port > 0 else _free_port()
    dt.distributed_init_method = f"tcp://127.0.0.1:{port}"
    return _spawned_here(dt, argv, rank)


def _spawned_here(dt, argv, start_rank: int) -> int:
    """The CPU processes fairseq's own launch spawns on this machine, ranks ``start_rank``
    on: ``--distributed-num-procs`` where given, else the rest of the world (all of it on one
    machine). fairseq would start one per visible GPU: none on the CPU."""
    world = dt.distributed_world_size
    procs = dt.distributed_num_procs if _given(argv, "--distributed-num-procs") else world - start_rank
    if procs < 1 or start_rank + procs > world:
        raise LaunchError(f"--distributed-num-procs {procs} from --distributed-rank {start_rank}: ranks "
                          f"{start_rank}..{start_rank + procs - 1} do not fit in --distributed-world-size {world}")
    return procs


def cpu_ranks_with_every_launcher() -> None:
    """Ranks on the CPU (``--cpu``, or no CUDA device) with fairseq's own launch, torchrun and SLURM.

    fairseq 0.12.3's ``fairseq.distributed.utils.call_main`` infers the launch from one GPU
    per rank: its own launch spawns ``min(torch.cuda.device_count(), world)`` processes, 0
    on the CPU, and exits 0 having trained nothing; under torchrun it sets ``device_id =
    rank % torch.cuda.device_count()`` (ZeroDivisionError) and, with the CPU's default
    ``--distributed-world-size 1``, never reads torchrun's variables (each process trains
    alone); under SLURM it counts GPUs per node (a world of 0); its default backend is NCCL.
    On the CPU, ``call_main`` is replaced by one that takes the launch from
    ``plan_cpu_ranks`` (gloo; torchrun's WORLD_SIZE/RANK/LOCAL_RANK; SLURM's
    SLURM_NTASKS/SLURM_PROCID/SLURM_LOCALID and its first host by ``scontrol``; else
    ``--distributed-world-size`` processes started here, ``CPU_START_METHOD``), then runs
    fairseq's own ``distributed_main`` in each rank; ``--fp16``, which needs a GPU, is
    refused first (``refuse_gpu_only_precision``). Runs on GPUs go to fairseq's
    ``call_main`` unchanged."""
    from fairseq.distributed import utils as distributed_utils

    if getattr(distributed_utils.call_main, "resnmt_cpu_ranks", False):
        return
    fairseq_call_main = distributed_utils.call_main

    @functools.wraps(fairseq_call_main)
    def call_main(cfg, main, **kwargs):
        import torch

        if cfg.common.tpu or (not cfg.common.cpu and torch.cuda.is_available()):
            return fairseq_call_main(cfg, main, **kwargs)
        refuse_gpu_only_precision(cfg.common)
        dt = cfg.distributed_training
        procs = plan_cpu_ranks(dt, os.environ, sys.argv[1:])
        if procs < 0:
            return main(cfg, **kwargs)
        if procs == 0:
            return distributed_utils.distributed_main(dt.device_id, main, cfg, kwargs)
        kwargs["start_rank"], dt.distributed_rank = dt.distributed_rank or 0, None  # as fairseq's spawn: rank = start + i
        torch.multiprocessing.start_processes(distributed_utils.distributed_main, args=(main, cfg, kwargs),
                                              nprocs=procs, join=True, start_method=CPU_START_METHOD)

    call_main.resnmt_cpu_ranks = True
    distributed_utils.call_main = call_main
