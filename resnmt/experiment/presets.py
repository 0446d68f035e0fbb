"""The papers' training presets: what ``fairseq-train`` command trains ARCH on DATASET.

``TrainRequest`` declares the options of a training run (``resnmt.experiment.command_options``:
each with its default, help and check); ``plan_training`` resolves one into the command
(batch arithmetic, launcher, paths). ``SIZES`` is the one table of model sizes below the
papers' (the CPU presets, the benchmarks and the tests). DATASET is a corpus of
``resnmt.data.corpora`` or a directory prepared by ``resnmt-prepare`` (its manifest).
"""
import dataclasses
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from resnmt.data.corpora import DATASETS, Dataset, custom
from resnmt.data.manifest import ManifestError, binarized_data_problem, read_manifest
from resnmt.experiment.command_options import convert_options, option
from resnmt.experiment.errors import ExperimentError, Log, UsageError, quiet
from resnmt.experiment.fairseq_flags import check_arch, check_training_flags
from resnmt.experiment.runtime import USER_DIR, require_commands, which
from resnmt.experiment.schedule import Schedule, flag_value, warmup_to_fit

# ----------------------------------------------------------------------------- sizes


class ModelSize(NamedTuple):
    """A Transformer size for the encoder and the decoder alike."""

    layers: int
    dim: int
    ffn: int
    heads: int

    def fairseq_flags(self) -> List[str]:
        flags = []
        for side in ("encoder", "decoder"):
            flags += [f"--{side}-layers", str(self.layers), f"--{side}-embed-dim", str(self.dim),
                      f"--{side}-ffn-embed-dim", str(self.ffn), f"--{side}-attention-heads", str(self.heads)]
        return flags

    def as_dict(self) -> Dict[str, int]:
        return self._asdict()


# The sizes below the papers' (theirs are the named archs, ``*_base``/``*_big``).
SIZES = {
    "tiny": ModelSize(2, 16, 32, 2),      # tests and smoke runs
    "small": ModelSize(2, 128, 512, 4),   # the small/cpu preset and the demo
    "deep": ModelSize(6, 128, 512, 4),    # the demo's width at the papers' depth
    "cpu": ModelSize(6, 256, 1024, 4),    # the CPU speed table (benchmarks/speed.py)
    "base": ModelSize(6, 512, 2048, 8),   # transformer_wmt_en_de
    "base12": ModelSize(12, 512, 2048, 8),  # base at twice the depth, where post-LN fails (GPU study only)
}

# the sizes of the named archs (``*_base``, ``*_big``; fairseq's transformer is base)
NAMED_SIZES = {"base": SIZES["base"], "big": ModelSize(6, 1024, 4096, 16)}


def trained_size(arch: str, cmd: Sequence[str]) -> str:
    """The size the training command ``cmd`` trains, as every line naming the run says it:
    the named arch's (``base``, ``big``) where the command keeps it, else what it trains
    instead (a preset, or flags after --, shrink the named arch): ``2+2 layers, d=128, not base``."""
    named = "big" if arch.endswith("_big") else "base"
    cmd = [str(c) for c in cmd]

    def last(flag: str, default: int) -> int:
        at = [i for i, word in enumerate(cmd[:-1]) if word == flag]
        return int(cmd[at[-1] + 1]) if at else default

    size = NAMED_SIZES[named]
    enc, dec = last("--encoder-layers", size.layers), last("--decoder-layers", size.layers)
    dim = last("--encoder-embed-dim", size.dim)
    return named if (enc, dec, dim) == (size.layers, size.layers, size.dim) else f"{enc}+{dec} layers, d={dim}, not {named}"

# ---------------------------------------------------------------------------- datasets


def dataset_of(name: str) -> Dataset:
    """A built-in corpus by name, or the corpus of a directory prepared by resnmt-prepare."""
    if name in DATASETS:
        return DATASETS[name]
    if Path(name).is_dir():
        try:
            manifest = read_manifest(name)
        except ManifestError as e:
            raise UsageError(f"DATASET '{name}': {e}") from None
        if manifest.dataset in DATASETS:  # a built-in corpus prepared into another directory
            return DATASETS[manifest.dataset]
        return dataclasses.replace(custom(manifest.source_lang, manifest.target_lang), name=Path(name).name)
    raise UsageError(f"DATASET '{name}' is not one of: {' '.join(DATASETS)}, nor a directory prepared by "
                     "resnmt-prepare")


def prepared_dataset(name: str) -> str:
    """DATASET as given, or OUTDIR where it names OUTDIR/bin, the binarized data of a
    directory prepared by resnmt-prepare (as fairseq-generate's DATA names it)."""
    if name in DATASETS or not Path(name).is_dir():
        return name
    try:
        return str(read_manifest(name).directory)
    except ManifestError:
        return name  # dataset_of says what it is not


def default_data_root(name: str) -> Path:
    """Where DATASET's prepared data is by default: data/NAME, or the directory DATASET itself."""
    return Path("data") / name if name in DATASETS else Path(name)


def default_save_dir(dataset: str, arch: str, tag: Optional[str], size: str = "") -> Path:
    """runs/DATASET/ARCH[-SIZE][-TAG]: SIZE (``2+2xd128``) where the run trains another size
    than the named arch's (``size``: ``trained_size``'s words)."""
    shape = re.fullmatch(r"(\d+)\+(\d+) layers, d=(\d+), not \w+", size)
    name = f"{arch}-{shape.group(1)}+{shape.group(2)}xd{shape.group(3)}" if shape else arch
    return Path("runs") / dataset / (f"{name}-{tag}" if tag else name)


# ------------------------------------------------------------------------------ request

PRESETS = ("paper", "small", "cpu")
LAUNCHERS = ("spawn", "torchrun", "slurm")
# the options resnmt-experiment shares with the training command; the others are the training command's own
SHARED_TRAIN_OPTIONS = ("tag", "preset", "gpus", "cpu", "dtype", "seed", "max_update", "max_epoch", "max_tokens",
                        "tokens_per_update", "nodes", "launcher", "node_rank", "master_addr", "master_port")
DTYPES = ("fp32", "fp16", "bf16")
TRAIN_ONLY_OPTIONS = ("data", "save_dir")


@dataclass
class TrainRequest:
    """One training run (the training command's options; None: the preset's). Checked on
    construction (UsageError naming the flag): numbers may be given as their text (a
    command line's) and are stored as numbers; paths are stored as Paths."""

    dataset: str
    arch: str
    data: Optional[Path] = option(None, "DIR", "binarized data (default: DATA_ROOT/bin: data/DATASET/bin, or "
                                  "DATASET/bin for a prepared directory)", kind="path")
    save_dir: Optional[Path] = option(
        None, "DIR", "checkpoints, train.log (the output of every run, appended) and train.cmd (the commands "
        "used) (default: runs/DATASET/ARCH[-SIZE][-TAG], SIZE such as 2+2xd128 where a preset or flags after -- "
        "shrink ARCH)", kind="path")
    tag: Optional[str] = option(None, "TAG", "suffix of the default save dir (e.g. seed1)")
    preset: Optional[str] = option(
        None, "P", "paper: the papers' settings for DATASET and the arch's size (default with GPUs); small: "
        "2+2 layers d=128 FFN 512 for CPU runs and demos (default without GPUs); cpu: small, forced onto "
        "the CPU", kind="choice", choices=PRESETS)
    gpus: Optional[int] = option(None, "N", "GPUs per node (default: all visible; 0 = CPU); with --cpu, the "
                                 "processes per node, each a rank on the CPU (default 1)", kind="int")
    cpu: bool = option(False, "", "ranks on the CPU (fairseq's --cpu, over gloo): the command of a GPU cluster, "
                       "--gpus N per node, run on this machine's CPU first", kind="switch")
    dtype: Optional[str] = option(
        None, "D", "precision: fp32; fp16 (fairseq's --fp16, GPUs only); bf16 (bf16 with float32 master weights, "
        "run by resnmt-train, which keeps fairseq 0.12's --bf16 off TPUs; GPUs or the CPU) (default: fp16 with "
        "the paper preset on GPUs, else fp32)", kind="choice", choices=DTYPES)
    nodes: int = option(1, "N", "nodes (N > 1 needs --launcher torchrun or slurm)", kind="int", minimum=1)
    launcher: str = option(
        "spawn", "L", "spawn: fairseq-train starts one process per GPU (with --cpu, --gpus N of them); "
        "torchrun: run this command once per node with --node-rank; slurm: run it inside an allocation (srun, "
        "one task per node, or per rank with --cpu)", kind="choice", choices=LAUNCHERS)
    node_rank: int = option(0, "R", "this node's rank, torchrun only", kind="int")
    master_addr: str = option("127.0.0.1", "HOST", "torchrun rendezvous host")
    master_port: int = option(29500, "PORT", "torchrun rendezvous / slurm port", kind="int", minimum=1)
    seed: int = option(1, "S", "random seed", kind="int")
    max_update: Optional[int] = option(None, "N", "stop after N updates (overrides the preset's)", kind="int",
                                       minimum=1)
    max_epoch: Optional[int] = option(None, "N", "stop after N epochs (without --max-update it replaces the "
                                      "preset's update limit)", kind="int", minimum=1)
    max_tokens: Optional[int] = option(None, "N", "tokens per GPU per batch (overrides the preset's)", kind="int",
                                       minimum=1)
    tokens_per_update: Optional[int] = option(
        None, "N", "the effective batch the preset aims at: --update-freq = max(1, round(N / (nodes*gpus*"
        "max-tokens))); if one step over all GPUs already exceeds 4/3 N, --max-tokens ceil(N / (nodes*gpus)) "
        "and --update-freq 1", kind="int", minimum=1)
    extra: Sequence[str] = ()

    def __post_init__(self):
        convert_options(self)
        self.dataset = prepared_dataset(self.dataset)
        self.extra = list(self.extra)
        if self.node_rank >= self.nodes:
            raise UsageError(f"--node-rank {self.node_rank} must be < --nodes {self.nodes}")
        if self.nodes > 1 and self.launcher == "spawn":
            raise UsageError(f"--nodes {self.nodes} needs --launcher torchrun or --launcher slurm (spawn starts "
                             "processes on one machine)")
        if self.node_rank and self.launcher != "torchrun":
            raise UsageError(f"--node-rank {self.node_rank} is torchrun's (--launcher torchrun); spawn runs on one "
                             "node and SLURM numbers the nodes itself")
        if self.preset == "cpu" and self.gpus not in (None, 0) and not self.cpu:
            raise UsageError(f"--preset cpu runs on the CPU; it cannot take --gpus {self.gpus}")


@dataclass
class TrainPlan:
    """What ``plan_training`` resolved: the command, where it writes, its schedule (whose
    ``warnings`` name what cannot train) and the notes on what the preset changed."""

    cmd: List[str]
    data: Path
    save_dir: Path
    schedule: Optional[Schedule] = None
    notes: List[str] = dataclasses.field(default_factory=list)


FAIRSEQ_BF16_FLAGS = ("--bf16", "--memory-efficient-bf16")


def fairseq_bf16_problem(flags: Sequence[str]) -> Optional[str]:
    """Why fairseq-train would stop on ``flags`` asking for bf16, or None. fairseq 0.12's
    ``--bf16`` (and ``--memory-efficient-bf16``) sets ``--tpu`` (fairseq/options.py), which
    needs torch_xla: without it every run stops at start-up in ``get_tpu_device`` (measured
    on an H100: every kind, exit 1, no update)."""
    import importlib.util

    asked = [f for f in flags if f in FAIRSEQ_BF16_FLAGS]
    if not asked or importlib.util.find_spec("torch_xla") is not None:
        return None
    return (f"{asked[0]}: fairseq 0.12 trains in bf16 on TPUs only ({asked[0]} implies --tpu, which needs "
            "torch_xla, not installed here); train in bf16 with resnmt-train, or in float32 or with --fp16")


def bf16_requested(req: "TrainRequest") -> bool:
    """bf16 asked for, by --dtype or by fairseq's flags after ``--``."""
    return req.dtype == "bf16" or any(flag in FAIRSEQ_BF16_FLAGS for flag in req.extra)


def count_gpus() -> int:
    """CUDA GPUs this process can use: 0 without nvidia-smi (fast path), else torch's count
    (which honours CUDA_VISIBLE_DEVICES)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count()


# ------------------------------------------------------------------------------- plan

class Hardware(NamedTuple):
    """Where a run trains: its preset (paper or small, once the defaults are decided), GPUs
    per node (0 on the CPU), nodes, the processes over all of them, and whether they run
    on the CPU."""

    preset: str
    gpus: int
    nodes: int
    world: int
    cpu: bool = False

    @property
    def per_node(self) -> int:
        return self.world // self.nodes


class Batch(NamedTuple):
    """A run's batch: tokens per GPU per step, steps per update, and the tokens per update
    the preset aims at."""

    max_tokens: int
    update_freq: int
    target: int


def plan_training(req: TrainRequest, log: Log = quiet, *, dry_run: bool = False) -> TrainPlan:
    """The ``fairseq-train`` command of the papers' presets for ``req``. ``req`` checked its
    values when it was built; here, before any work (UsageError), the dataset, the arch,
    the GPUs asked for against those visible, the whole command's flags (those after ``--``
    too) with fairseq's own parser and, unless ``dry_run``, the data."""
    dataset = dataset_of(req.dataset)
    trainer = trainer_command(req)
    check_arch(req.arch)
    hardware = decide_hardware(req, log, dry_run)
    size = "big" if req.arch.endswith("_big") else "base"
    flags, batch, preset_max_update = preset_flags(req, dataset, hardware.preset, size)
    batch = batch_for(batch, hardware.world)
    flags += ["--max-tokens", str(batch.max_tokens), "--update-freq", str(batch.update_freq)]
    flags += length_flags(req, preset_max_update)
    dtype = decide_dtype(req, hardware)
    flags += precision_flags(req, dtype, hardware.cpu)
    data = req.data or default_data_root(req.dataset) / "bin"
    save_dir = req.save_dir or default_save_dir(dataset.name, req.arch, req.tag,
                                                trained_size(req.arch, [*flags, *req.extra]))
    launch, trainer, dist = launcher(req, hardware, trainer, dry_run)

    def fairseq_args():
        return [str(data), "--user-dir", str(USER_DIR), *flags, *dist, "--save-dir", str(save_dir), "--log-format",
                "simple", *req.extra]

    check_training_flags(fairseq_args())  # those after -- too, as fairseq-train will parse them, before any work
    schedule, notes = fit_warmup(req, flags, Schedule.of([*flags, *req.extra], data if data.is_dir() else None,
                                                         dataset.src, dataset.tgt, hardware.world), hardware.preset)
    cmd = [*launch, *trainer, *fairseq_args()]
    if not dry_run:
        check_data(req, dataset, data)
    log(f"{dataset.name} {dataset.src}->{dataset.tgt}, {req.arch} ({trained_size(req.arch, cmd)}), "
        f"preset {hardware.preset}, {dtype}, "
        f"{hardware.world} process(es) ({hardware.per_node} {'CPU rank' if hardware.cpu else 'GPU'}(s) x "
        f"{hardware.nodes} node(s))")
    log(f"batch: {hardware.world} x max-tokens {batch.max_tokens} x update-freq {batch.update_freq} = "
        f"{hardware.world * batch.max_tokens * batch.update_freq} tokens per update (target {batch.target})"
        + (f", {schedule.epoch_updates} updates per epoch" if schedule.epoch_updates else ""))
    for note in notes:
        log(f"note: {note}")
    return TrainPlan(cmd=cmd, data=data, save_dir=save_dir, schedule=schedule, notes=notes)


def trainer_command(req: TrainRequest) -> List[str]:
    """The training program: ``$RESNMT_FAIRSEQ_TRAIN``, else fairseq-train, or resnmt-train
    for bf16 (fairseq-train whose --bf16 stays off TPUs; resnmt/training/bf16.py)."""
    default_trainer = "resnmt-train" if bf16_requested(req) else "fairseq-train"
    trainer = shlex.split(os.environ.get("RESNMT_FAIRSEQ_TRAIN", default_trainer))
    if not trainer:
        raise UsageError("RESNMT_FAIRSEQ_TRAIN is set but empty")
    require_commands(trainer[0])
    return trainer


def decide_hardware(req: TrainRequest, log: Log, dry_run: bool) -> Hardware:
    """The GPUs (asked for, or all visible; none with the cpu preset) against those visible,
    or with --cpu the ranks per node on the CPU (--gpus N of them, default 1), and the preset
    they make the default (paper on GPUs)."""
    nodes, gpus, preset = req.nodes, req.gpus, req.preset
    if req.cpu:
        per_node = gpus or 1
        return Hardware("small" if preset in (None, "cpu") else preset, 0, nodes, nodes * per_node, cpu=True)
    if preset == "cpu":
        gpus = 0
    detected = count_gpus()
    if gpus is None:
        gpus = detected
        log(f"GPUs: {gpus} (detected; --gpus N to choose)")
    elif gpus > detected:
        if not dry_run:
            raise UsageError(f"--gpus {gpus} but only {detected} GPU(s) visible here (nvidia-smi / CUDA_VISIBLE_DEVICES)")
        log(f"warning: --gpus {gpus} but {detected} visible here (dry run: printing the command anyway)")
    preset = preset or ("paper" if gpus > 0 else "small")
    preset = "small" if preset == "cpu" else preset
    return Hardware(preset, gpus, nodes, nodes * max(gpus, 1), cpu=gpus == 0)


def preset_flags(req: TrainRequest, dataset: Dataset, preset: str, size: str) -> Tuple[List[str], Batch, int]:
    """The preset's flags for ``dataset`` and the arch's ``size`` (optimizer, schedule,
    criterion, checkpoints; the small preset's model sizes), the batch it aims at (before
    the GPUs are counted; the request's --max-tokens and --tokens-per-update win) and its
    number of updates."""
    flags = ["--task", "resnmt_translation", "--source-lang", dataset.src, "--target-lang", dataset.tgt,
             "--arch", req.arch, "--share-all-embeddings",
             "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-09", "--clip-norm", "0.0",
             "--weight-decay", "0.0", "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-07",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--keep-last-epochs", "10", "--seed", str(req.seed)]
    if preset == "paper":
        lr, cap = ("5e-4", 3584) if size == "big" else ("7e-4", 4096)
        target, preset_max_update = dataset.tokens_per_update, dataset.max_update[size]
        # a checkpoint every 1000 updates, the last 10 kept: tensor2tensor's default
        # interval, whose last 10 checkpoints the papers averaged
        flags += ["--lr", lr, "--warmup-updates", "4000", "--log-interval", "100",
                  "--save-interval-updates", "1000", "--keep-interval-updates", "10"]
        if dataset.name == "wmt14-en-fr" and size == "big":
            flags += ["--dropout", "0.1"]  # Vaswani et al. trained the EN-FR big model with dropout 0.1, not 0.3
    else:
        cap, target, preset_max_update = 4096, 4096, 2000
        flags += [*SIZES["small"].fairseq_flags(), "--dropout", "0.1",
                  "--lr", "1e-3", "--warmup-updates", "500", "--log-interval", "50"]
    return flags, Batch(req.max_tokens or cap, 1, req.tokens_per_update or target), preset_max_update


def batch_for(batch: Batch, world: int) -> Batch:
    """``batch`` over ``world`` processes: update-freq = max(1, round(target / (world * cap)));
    when one step over all GPUs already holds more than 4/3 of the target, the per-GPU
    batch shrinks instead: max-tokens = ceil(target / world)."""
    cap, target = batch.max_tokens, batch.target
    update_freq = max(1, (target + world * cap // 2) // (world * cap))
    if update_freq == 1 and 3 * world * cap > 4 * target:
        cap = -(-target // world)
    return Batch(cap, update_freq, target)


def length_flags(req: TrainRequest, preset_max_update: int) -> List[str]:
    """How long the run trains: the request's --max-update and --max-epoch, the preset's
    updates when neither is given."""
    flags = []
    if req.max_update is not None:
        flags += ["--max-update", str(req.max_update)]
    elif req.max_epoch is None:
        flags += ["--max-update", str(preset_max_update)]
    return flags + (["--max-epoch", str(req.max_epoch)] if req.max_epoch is not None else [])


def decide_dtype(req: TrainRequest, hardware: Hardware) -> str:
    """The precision: --dtype, else bf16 when fairseq's bf16 flags follow ``--``, fp16 with
    the paper preset on GPUs, fp32 otherwise; fp16 needs GPUs, and one precision only."""
    extra_bf16 = [f for f in req.extra if f in FAIRSEQ_BF16_FLAGS]  # fairseq's bf16 flags after --
    dtype = req.dtype or ("bf16" if extra_bf16 else "fp16" if hardware.preset == "paper" and not hardware.cpu
                          else "fp32")
    if extra_bf16 and dtype != "bf16":
        raise UsageError(f"--dtype {dtype} and {extra_bf16[0]} after --: choose one precision")
    if dtype == "fp16" and hardware.cpu:
        raise UsageError("--dtype fp16 trains on GPUs only (fairseq's --fp16); on the CPU use fp32 or bf16")
    return dtype


def precision_flags(req: TrainRequest, dtype: str, cpu: bool) -> List[str]:
    """fairseq's flags for ``dtype`` (--bf16 not repeated where it follows ``--``), and --cpu."""
    given_bf16 = any(f in FAIRSEQ_BF16_FLAGS for f in req.extra)
    flags = ["--cpu"] if cpu else []
    return flags + {"fp32": [], "fp16": ["--fp16"], "bf16": [] if given_bf16 else ["--bf16"]}[dtype]


def srun_missing(nodes: int) -> str:
    return ("'srun' not found on PATH: --launcher slurm runs inside a SLURM allocation, on a cluster whose "
            "administrators installed SLURM (it is not a Python package): on its login node, salloc --nodes "
            f"{nodes} then this command, or this command in an sbatch script; on a machine without SLURM, "
            "--launcher torchrun starts the same ranks (add --cpu to rehearse on this machine's CPU)")


def launcher(req: TrainRequest, hardware: Hardware, trainer: List[str],
             dry_run: bool = False) -> Tuple[List[str], List[str], List[str]]:
    """(the launcher's command before the trainer, the trainer, fairseq's distributed
    flags) for runs over several processes: fairseq's own spawning, torchrun or slurm.
    On the CPU (``hardware.cpu``) fairseq-train reads the same launchers' variables
    (resnmt.training.launch): the commands are the GPU run's, ranks per node for GPUs."""
    launch, dist = [], []
    nodes, per_node = hardware.nodes, hardware.per_node
    if hardware.world > 1:
        dist = ["--distributed-world-size", str(hardware.world)]
        if req.launcher == "torchrun":
            # torchrun sets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK; fairseq reads
            # them (infer_init_method) when no --distributed-init-method is given.
            require_commands("torchrun")
            launch = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node), "--node-rank",
                      str(req.node_rank), "--master-addr", req.master_addr, "--master-port", str(req.master_port)]
            trainer = [which(trainer[0]), *trainer[1:]]
        elif req.launcher == "slurm":
            # GPUs: one task per node; fairseq reads SLURM_* (scontrol for the first host) and
            # spawns one process per GPU, ranks node_id*gpus + local. CPU: one task per rank.
            if which("srun") is None and not dry_run:
                raise ExperimentError(srun_missing(nodes))
            launch = ["srun", "--nodes", str(nodes), "--ntasks-per-node", str(per_node if hardware.cpu else 1)]
            dist += ["--distributed-port", str(req.master_port)]
    return launch, trainer, dist


def fit_warmup(req: TrainRequest, flags: List[str], schedule: Schedule, preset: str) -> Tuple[Schedule, List[str]]:
    """A preset's warm-up longer than the run is scaled to it (in ``flags``; a warm-up after
    ``--`` is the user's: warned about, not changed): the schedule and the notes saying so."""
    notes = []
    if schedule.total and schedule.warmup >= schedule.total and flag_value(req.extra, "--warmup-updates") is None:
        warmup = warmup_to_fit(schedule.total)
        flags[flags.index("--warmup-updates") + 1] = str(warmup)
        notes.append(f"preset {preset}: the run ({schedule.total} updates) is shorter than its {schedule.warmup} "
                     f"warm-up updates: warm-up scaled to {warmup} (-- --warmup-updates N to choose)")
        schedule = dataclasses.replace(schedule, warmup=warmup)
    return schedule, notes


def check_data(req: TrainRequest, dataset: Dataset, data: Path) -> None:
    """``data`` must be ``dataset`` binarized for its direction (ExperimentError naming what is missing)."""
    if not data.is_dir():
        how = (f"resnmt-prepare {dataset.name} {default_data_root(req.dataset)}" if req.dataset in DATASETS
               else f"resnmt-prepare custom ... {req.dataset}")
        raise ExperimentError(f"data directory {data} not found (prepare it: {how}, or --data DIR)")
    problem = binarized_data_problem(data)
    if problem:
        raise ExperimentError(f"--data {problem}" if req.data else problem)
    pair = f"{dataset.src}-{dataset.tgt}"
    for name in (f"dict.{dataset.src}.txt", f"dict.{dataset.tgt}.txt", f"train.{pair}.{dataset.src}.idx",
                 f"train.{pair}.{dataset.tgt}.idx", f"valid.{pair}.{dataset.src}.idx"):
        if not (data / name).exists():
            raise ExperimentError(f"{data}/{name} not found: {data} is not {dataset.name} data binarized "
                                  f"for {dataset.src}->{dataset.tgt}")
