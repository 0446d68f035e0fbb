"""One NMT experiment, each step written once: prepare, train, average, decode, score, record.

``run_experiment`` chains the steps for one model (``resnmt-experiment``,
``scripts/run_experiment.sh``, the demo); ``TrainRequest``/``plan_training`` hold the
papers' training presets (``scripts/train.sh``); the benchmarks call the steps one by one
(``benchmarks/quality.py``: one budget per run, ``benchmarks/curves.py``: one run scored at
several budgets along the way). Each step writes its output atomically and can be re-run:
training resumes from ``checkpoint_last.pt``; the other steps are skipped when their
output exists.

The external programs (``data-prep/prepare-*.sh``, ``fairseq-train``,
``fairseq-generate``, ``resnmt-analyze``) run as subprocesses; averaging and scoring run
in-process through ``resnmt.cli.average_checkpoints`` and ``resnmt.cli.evaluate``.
Command-line front ends: ``resnmt.cli.experiment``.
"""
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from resnmt.atomic import atomic_open, atomic_write_text

USER_DIR = Path(__file__).resolve().parent
REPO_ROOT = USER_DIR.parent


class ExperimentError(RuntimeError):
    """A step failed or cannot start; printed as one error line (exit status 1)."""


class UsageError(ExperimentError):
    """A bad option value, found before any work (exit status 2)."""


class _CommandFailed(Exception):
    """Discards a failed command's partial stdout file (raised inside ``atomic_open``)."""


Log = Callable[[str], None]


def quiet(_message: str) -> None:
    """A ``Log`` that drops its messages."""


def check_int(flag: str, value, minimum: int) -> int:
    """``value`` (an int, or its digits as text) as an int >= ``minimum``, else a
    UsageError naming ``flag``."""
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or int(text) < minimum:
        raise UsageError(f"{flag} '{text}': must be an integer >= {minimum}")
    return int(text)


def check_number(flag: str, value, minimum: float) -> float:
    """``value`` (a number, or its text) as a float >= ``minimum``, else a UsageError naming ``flag``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not minimum <= number < float("inf"):
        raise UsageError(f"{flag} '{value}': must be a number >= {minimum:g}")
    return number


def flag_name(field_name: str) -> str:
    """The command-line flag of a request field: max_update -> --max-update."""
    return "--" + field_name.replace("_", "-")


def convert_fields(request, *, integers: Dict[str, int], numbers: Optional[Dict[str, float]] = None,
                   paths: Sequence[str] = ()) -> None:
    """Replaces each field of ``request`` named in ``integers`` or ``numbers`` (name ->
    minimum) by its checked value, and each named in ``paths`` by a Path; None stays None.
    A command line's text becomes a typed value here, once, and a bad value is a
    UsageError naming the flag."""

    def convert(names, to):
        for name in names:
            value = getattr(request, name)
            if value is not None:
                setattr(request, name, to(name, value))

    convert(integers, lambda name, value: check_int(flag_name(name), value, integers[name]))
    convert(numbers or {}, lambda name, value: check_number(flag_name(name), value, numbers[name]))
    convert(paths, lambda name, value: Path(value))


def check_choice(flag: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise UsageError(f"{flag} '{value}' is not one of: {' '.join(allowed)}")
    return value


def format_seconds(seconds: float) -> str:
    """12s / 3m05s / 1h02m."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# --------------------------------------------------------------------------- datasets

@dataclass(frozen=True)
class Dataset:
    """A corpus of ``data-prep/prepare-NAME.sh``: its pair, the papers' training budget
    (tokens per update; updates for base and big models) and how its test set is scored."""

    name: str
    src: str
    tgt: str
    tokens_per_update: int
    max_update: Dict[str, int]
    detok: str = "none"
    compound_split: bool = False

    @property
    def score_options(self) -> dict:
        """``score``'s keywords: Moses detokenization (and compound splitting) for WMT."""
        if self.detok == "none":
            return {}
        return {"detok": self.detok, "lang": self.tgt, "compound_split": self.compound_split}


DATASETS = {d.name: d for d in (
    Dataset("iwslt15-en-vi", "en", "vi", 4096, {"base": 50000, "big": 50000}),
    Dataset("wmt14-en-de", "en", "de", 32768, {"base": 100000, "big": 300000}, detok="moses", compound_split=True),
    Dataset("wmt14-en-fr", "en", "fr", 32768, {"base": 100000, "big": 300000}, detok="moses"),
    Dataset("multi30k", "en", "de", 4096, {"base": 50000, "big": 50000}),
)}


def dataset_of(name: str) -> Dataset:
    check_choice("DATASET", name, list(DATASETS))
    return DATASETS[name]


@dataclass(frozen=True)
class ModelSize:
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
        return {"layers": self.layers, "dim": self.dim, "ffn": self.ffn, "heads": self.heads}


# The sizes the CPU benchmarks and the small preset train; the papers' sizes are the named archs (``*_base``).
SIZES = {
    "tiny": ModelSize(1, 16, 32, 2),      # tests
    "small": ModelSize(2, 128, 512, 4),   # the demo size (train.sh --preset small)
    "deep": ModelSize(6, 128, 512, 4),    # the demo's width at the papers' depth
    "base": ModelSize(6, 512, 2048, 8),   # transformer_wmt_en_de
}


# ------------------------------------------------------------------------------ files

def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON line with a single write (concurrent writers append whole lines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> List[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def repo_relative(path: Path, root: Path = REPO_ROOT) -> str:
    """``path`` relative to ``root`` when inside it (committed results hold no machine paths)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def settings_key(settings: dict) -> str:
    """The 10-hex-digit name of a benchmark's settings (its run directories and JSON lines)."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def posix_cksum(data: bytes) -> int:
    """The CRC that POSIX ``cksum`` prints (names outputs after --gen-args as the shell pipeline did)."""
    crc = 0

    def feed(byte):
        nonlocal crc
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF

    for byte in data:
        feed(byte)
    n = len(data)
    while n:
        feed(n & 0xFF)
        n >>= 8
    return ~crc & 0xFFFFFFFF


# ------------------------------------------------------------------------ subprocesses

# glibc's malloc hands every freed buffer above its mmap threshold (which adapts up to
# 32 MiB) back to the kernel, which faults it in again page by page at the next step. On
# the CPU that is most of a training step's big tensors (a 2+2 model's logits over a
# 4096-token batch are ~100 MiB, their gradient as much): over a quarter of fairseq-train's CPU
# time went to the kernel (benchmarks/malloc.py measures it). These two keep freed memory
# in the process for reuse; the results are the same to the bit. Other C libraries ignore
# them, and a value already in the environment wins.
KEEP_FREED_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def tool_env(threads: Optional[int] = None, cpu_only: bool = False) -> Dict[str, str]:
    """The environment for the subprocesses: this Python's scripts first on PATH,
    ``threads`` OpenMP/MKL threads when given, and glibc's malloc told to keep freed
    memory (``KEEP_FREED_MEMORY_ENV``) unless the environment already says otherwise."""
    env = {**KEEP_FREED_MEMORY_ENV, **os.environ}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def cpu_description() -> Dict[str, str]:
    """The CPU the numbers were measured on, for the JSON records."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": "cpu", "device_name": f"{name} ({os.cpu_count()} CPUs)"}


def cuda_description() -> Dict[str, str]:
    """The GPU the numbers were measured on (the first visible one), for the JSON records."""
    import torch

    return {"device": "cuda", "device_name": f"{torch.cuda.get_device_name(0)} "
                                              f"({torch.cuda.device_count()} visible, torch {torch.__version__})"}


def run_logged(cmd: Sequence, log_path: Optional[Path], env: Optional[Dict[str, str]] = None,
               stdout_path: Optional[Path] = None) -> None:
    """Run ``cmd``; its stderr (and stdout unless ``stdout_path``) is appended to ``log_path``
    (or passed through when None). ``stdout_path`` is written atomically: it exists only
    if the command succeeded."""
    cmd = [str(c) for c in cmd]
    log = None
    if log_path is not None:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8")
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
    try:
        if stdout_path is None:
            proc = subprocess.run(cmd, stdout=log, stderr=log, env=env)
        else:
            try:
                with atomic_open(stdout_path, "w") as out:
                    proc = subprocess.run(cmd, stdout=out, stderr=log, env=env)
                    if proc.returncode != 0:
                        raise _CommandFailed
            except _CommandFailed:
                pass
    finally:
        if log is not None:
            log.close()
    if proc.returncode != 0:
        where = ""
        if log_path is not None:
            where = f"; log {log_path}:\n" + log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise ExperimentError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}){where}")


# ------------------------------------------------------------------------------ prepare

def is_prepared(data_root: Path, dataset: Dataset) -> bool:
    return (Path(data_root) / "bin" / f"dict.{dataset.tgt}.txt").exists() and \
        (Path(data_root) / "raw" / f"test.{dataset.tgt}").exists()


def prepare(dataset: Dataset, data_root: Path, mirror: Optional[Path] = None, options: Sequence[str] = ()) -> None:
    """``bash data-prep/prepare-DATASET.sh [--mirror DIR] OPTIONS DATA_ROOT`` (its messages on stderr)."""
    cmd = ["bash", REPO_ROOT / "data-prep" / f"prepare-{dataset.name}.sh"]
    cmd += ["--mirror", mirror] if mirror else []
    run_logged([*cmd, *options, data_root], None, tool_env())


# ---------------------------------------------------------------------------- train

@dataclass
class TrainRequest:
    """The options of ``scripts/train.sh`` (its --help documents each); None: the preset's.

    Checked on construction (UsageError naming the flag): integers may be given as their
    digits (a command line's text) and are stored as ints; paths are stored as Paths."""

    dataset: str
    arch: str
    data: Optional[Path] = None
    save_dir: Optional[Path] = None
    tag: Optional[str] = None
    preset: Optional[str] = None
    gpus: Optional[int] = None
    nodes: int = 1
    launcher: str = "none"
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    seed: int = 1
    max_update: Optional[int] = None
    max_epoch: Optional[int] = None
    max_tokens: Optional[int] = None
    tokens_per_update: Optional[int] = None
    extra: Sequence[str] = ()

    PRESETS = ("paper", "small", "cpu")
    LAUNCHERS = ("none", "torchrun", "slurm")
    MINIMA = {"gpus": 0, "nodes": 1, "node_rank": 0, "master_port": 1, "seed": 0, "max_update": 1, "max_epoch": 1,
              "max_tokens": 1, "tokens_per_update": 1}

    def __post_init__(self):
        if self.preset is not None:
            check_choice("--preset", self.preset, self.PRESETS)
        check_choice("--launcher", self.launcher, self.LAUNCHERS)
        convert_fields(self, integers=self.MINIMA, paths=("data", "save_dir"))
        self.extra = list(self.extra)
        bf16_problem = fairseq_bf16_problem(self.extra)
        if bf16_problem:
            raise UsageError(bf16_problem)
        if self.node_rank >= self.nodes:
            raise UsageError(f"--node-rank {self.node_rank} must be < --nodes {self.nodes}")
        if self.nodes > 1 and self.launcher == "none":
            raise UsageError(f"--nodes {self.nodes} needs --launcher torchrun or --launcher slurm")
        if self.preset == "cpu" and self.gpus not in (None, 0):
            raise UsageError(f"--preset cpu runs on the CPU; it cannot take --gpus {self.gpus}")


@dataclass
class TrainPlan:
    """What ``plan_training`` resolved: the command and where it writes."""

    cmd: List[str]
    data: Path
    save_dir: Path


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
            "torch_xla, not installed here); on a GPU train in float32 or with --fp16")


def default_save_dir(dataset: str, arch: str, tag: Optional[str]) -> Path:
    return Path("runs") / dataset / (f"{arch}-{tag}" if tag else arch)


def count_gpus() -> int:
    """CUDA GPUs this process can use: 0 without nvidia-smi (fast path), else torch's count
    (which honours CUDA_VISIBLE_DEVICES)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count()


def check_arch(arch: str) -> None:
    """``arch`` must be an arch of resnmt_transformer or fairseq's ``transformer``."""
    import resnmt  # noqa: F401  registers the archs
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    allowed = sorted(a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m == "resnmt_transformer") + ["transformer"]
    if arch not in allowed:
        raise UsageError(f"ARCH '{arch}' is not a resnmt_transformer arch or 'transformer'; allowed: {' '.join(allowed)}")


def plan_training(req: TrainRequest, log: Log = quiet, *, dry_run: bool = False) -> TrainPlan:
    """The ``fairseq-train`` command of the papers' presets for ``req``. ``req`` checked its
    values when it was built; here, before any work (UsageError), the dataset, the arch,
    the GPUs asked for against those visible and, unless ``dry_run``, the data."""
    dataset = dataset_of(req.dataset)
    nodes, gpus = req.nodes, req.gpus
    trainer = shlex.split(os.environ.get("RESNMT_FAIRSEQ_TRAIN", "fairseq-train"))
    if not trainer:
        raise UsageError("RESNMT_FAIRSEQ_TRAIN is set but empty")
    require_commands(trainer[0])
    check_arch(req.arch)

    # hardware
    preset = req.preset
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
    if gpus == 0 and (nodes > 1 or req.launcher != "none"):
        raise UsageError(f"--launcher {req.launcher} / --nodes {nodes} need GPUs (--gpus N > 0)")
    preset = preset or ("paper" if gpus > 0 else "small")
    preset = "small" if preset == "cpu" else preset
    world = nodes * max(gpus, 1)

    # preset
    size = "big" if req.arch.endswith("_big") else "base"
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
    target = req.tokens_per_update or target
    cap = req.max_tokens or cap
    # update-freq = max(1, round(target / (world * cap))); when one step over all GPUs
    # already holds more than 4/3 of the target, shrink the per-GPU batch instead:
    # max-tokens = ceil(target / world).
    update_freq = max(1, (target + world * cap // 2) // (world * cap))
    if update_freq == 1 and 3 * world * cap > 4 * target:
        cap = -(-target // world)
    flags += ["--max-tokens", str(cap), "--update-freq", str(update_freq)]
    if req.max_update is not None:
        flags += ["--max-update", str(req.max_update)]
    elif req.max_epoch is None:
        flags += ["--max-update", str(preset_max_update)]
    flags += ["--max-epoch", str(req.max_epoch)] if req.max_epoch is not None else []
    flags += ["--cpu"] if gpus == 0 else (["--fp16"] if preset == "paper" else [])

    # paths
    data = req.data or Path(f"data/{dataset.name}/bin")
    save_dir = req.save_dir or default_save_dir(dataset.name, req.arch, req.tag)
    if not dry_run:
        if not data.is_dir():
            raise ExperimentError(f"data directory {data} not found (prepare it: data-prep/prepare-{dataset.name}.sh "
                                  f"data/{dataset.name}, or --data DIR)")
        pair = f"{dataset.src}-{dataset.tgt}"
        for name in (f"dict.{dataset.src}.txt", f"dict.{dataset.tgt}.txt", f"train.{pair}.{dataset.src}.idx",
                     f"train.{pair}.{dataset.tgt}.idx", f"valid.{pair}.{dataset.src}.idx"):
            if not (data / name).exists():
                raise ExperimentError(f"{data}/{name} not found: {data} is not {dataset.name} data binarized "
                                      f"for {dataset.src}->{dataset.tgt}")

    # launcher
    launch, dist = [], []
    if gpus > 1 or nodes > 1:
        dist = ["--distributed-world-size", str(world)]
        if req.launcher == "torchrun":
            # torchrun sets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK; fairseq reads
            # them (infer_init_method) when no --distributed-init-method is given.
            require_commands("torchrun")
            launch = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(gpus), "--node-rank", str(req.node_rank),
                      "--master-addr", req.master_addr, "--master-port", str(req.master_port)]
            trainer = [which(trainer[0]), *trainer[1:]]
        elif req.launcher == "slurm":
            # One task per node; fairseq reads SLURM_* (scontrol for the first host) and
            # spawns one process per GPU, ranks node_id*gpus + local.
            require_commands("srun")
            launch = ["srun", "--nodes", str(nodes), "--ntasks-per-node", "1"]
            dist += ["--distributed-port", str(req.master_port)]
    cmd = [*launch, *trainer, str(data), "--user-dir", str(USER_DIR), *flags, *dist,
           "--save-dir", str(save_dir), "--log-format", "simple", *req.extra]
    log(f"{dataset.name} {dataset.src}->{dataset.tgt}, {req.arch} ({size}), preset {preset}, {world} process(es) "
        f"({gpus} GPU(s) x {nodes} node(s))")
    log(f"batch: {world} x max-tokens {cap} x update-freq {update_freq} = {world * cap * update_freq} tokens per "
        f"update (target {target})")
    return TrainPlan(cmd=cmd, data=data, save_dir=save_dir)


def which(name: str) -> Optional[str]:
    """``name`` on the PATH the subprocesses get (``tool_env``: this Python's scripts first)."""
    return shutil.which(name, path=tool_env()["PATH"])


def require_commands(*names: str) -> None:
    for name in names:
        if which(name) is None:
            raise ExperimentError(f"'{name}' not found on PATH (install the environment with 'make venv' and "
                                  "activate it: . .venv/bin/activate)")


def checkpoint_complete(path: Path) -> bool:
    """A complete torch zip file (its central directory, at the end, is intact); reads
    only the directory, not the tensors."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(name.endswith("data.pkl") for name in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def repair_checkpoint_last(save_dir: Path, log: Log) -> None:
    """fairseq writes checkpointN.pt atomically but then *copies* it to checkpoint_last.pt;
    a run killed during the copy leaves a truncated checkpoint_last.pt that stops every
    restart. Replace it by the newest complete checkpoint and keep the broken file aside."""
    last = Path(save_dir) / "checkpoint_last.pt"
    if not last.exists() or checkpoint_complete(last):
        return
    numbered = sorted((p for p in Path(save_dir).glob("checkpoint[0-9]*.pt")), key=lambda p: p.stat().st_mtime)
    broken = last.with_name(last.name + ".broken")
    last.replace(broken)
    if numbered and checkpoint_complete(numbered[-1]):
        with atomic_open(last, "wb") as out, open(numbered[-1], "rb") as src:
            shutil.copyfileobj(src, out)
        log(f"warning: {last} was incomplete (a run killed while fairseq copied it); kept as {broken}, "
            f"replaced by {numbered[-1]}")
    else:
        log(f"warning: {last} was incomplete and no other complete checkpoint exists; kept as {broken}, "
            "training starts from scratch")


def train(plan: TrainPlan, log: Log, threads: Optional[int] = None, label: str = "") -> None:
    """Run ``plan.cmd`` (resuming from checkpoint_last.pt), its output on stdout (each line
    after ``label``, which tells concurrent runs apart) and appended to SAVE_DIR/train.log,
    the command to SAVE_DIR/train.cmd; ``threads``: its torch threads (None: torch's default)."""
    save_dir = plan.save_dir
    save_dir.mkdir(parents=True, exist_ok=True)
    repair_checkpoint_last(save_dir, log)
    last = save_dir / "checkpoint_last.pt"
    if last.exists():
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.stat().st_mtime))
        log(f"resuming from {last} (written {written})")
    else:
        log(f"starting a new run in {save_dir}")
    cmd_text = shlex.join(plan.cmd)
    cmd_file = save_dir / "train.cmd"
    if cmd_file.exists() and cmd_file.read_text().splitlines()[-1:] != [cmd_text]:
        log(f"warning: this command differs from the last one used in {save_dir} (see {cmd_file})")
    with open(cmd_file, "a", encoding="utf-8") as f:
        f.write(cmd_text + "\n")
    log(f"running: {cmd_text}")
    start = time.time()
    # fairseq's own output, appended to SAVE_DIR/train.log as well (all restarts in one file)
    with open(save_dir / "train.log", "ab") as train_log:
        proc = subprocess.Popen(plan.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=tool_env(threads))
        prefix = label.encode()
        for line in iter(proc.stdout.readline, b""):
            sys.stdout.buffer.write(prefix + line)
            sys.stdout.flush()
            train_log.write(line)
            train_log.flush()
        returncode = proc.wait()
    if returncode != 0:
        raise ExperimentError(f"{Path(plan.cmd[0]).name} failed (exit {returncode}); its output: {save_dir}/train.log")
    log(f"done in {format_seconds(time.time() - start)}: {save_dir}")


# What ``train_to`` has done in a save_dir: {"updates": U, "seconds": S}, plus "started"
# (a time stamp) while a call is training.
TRAINED_STAMP = "trained_updates.json"


def _trained_stamp(save_dir: Path) -> dict:
    stamp = Path(save_dir) / TRAINED_STAMP
    return json.loads(stamp.read_text()) if stamp.exists() else {}


def trained_updates(save_dir: Path) -> int:
    """Updates reached by the last finished ``train_to`` call in ``save_dir`` (0 if none)."""
    return _trained_stamp(save_dir).get("updates", 0)


def trained_seconds(save_dir: Path) -> float:
    """Seconds ``train_to`` has trained the model in ``save_dir``, over all its calls.

    A call stopped mid-way (a session's end, a killed job) counts up to the newest
    ``checkpoint_last.pt``, the one the next call resumes from: the updates after it are
    trained again and counted then."""
    stamp = _trained_stamp(save_dir)
    seconds = stamp.get("seconds", 0.0)
    last = Path(save_dir) / "checkpoint_last.pt"
    if "started" in stamp and last.exists():
        seconds += max(0.0, last.stat().st_mtime - stamp["started"])
    return seconds


def train_to(updates: int, train_argv: Sequence, save_dir: Path, log_path: Path, env: Dict[str, str]) -> float:
    """Train until ``updates`` updates with ``fairseq-train`` (``train_argv`` without
    ``--max-update`` and ``--save-dir``), resuming from ``save_dir/checkpoint_last.pt``.

    fairseq resumed at its ``--max-update`` would still take one more step, so a run that
    already reached ``updates`` is not started again. Returns ``trained_seconds``: the
    seconds the model has trained in all, this call and every earlier one included."""
    save_dir = Path(save_dir)
    if trained_updates(save_dir) >= updates:
        return trained_seconds(save_dir)
    before = {"updates": trained_updates(save_dir), "seconds": trained_seconds(save_dir)}
    save_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    atomic_write_text(save_dir / TRAINED_STAMP, json.dumps({**before, "started": started}) + "\n")
    run_logged([*train_argv, "--save-dir", save_dir, "--max-update", updates], log_path, env)
    seconds = before["seconds"] + time.time() - started
    atomic_write_text(save_dir / TRAINED_STAMP, json.dumps({"updates": updates, "seconds": seconds}) + "\n")
    return seconds


def benchmark_train_argv(bin_dir: Path, arch: str, flags: Sequence[str], size: ModelSize, *, seed: int,
                         max_tokens: int, lr: float, warmup: int, dropout: float, save_every: int,
                         keep: int, validate: bool) -> List[str]:
    """``fairseq-train`` for the CPU benchmarks: ``size``, the papers' optimizer (Adam
    0.9/0.98, inverse-sqrt warm-up, label smoothing 0.1, shared embeddings), a checkpoint
    every ``save_every`` updates of which the newest ``keep`` are kept, and validation at
    each epoch end when ``validate``. A row's ``flags`` come last, so a row may also
    override a shared setting (argparse keeps the last value)."""
    argv = [
        "fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", arch, *size.fairseq_flags(),
        "--share-all-embeddings", "--dropout", dropout,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", warmup,
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", max_tokens, "--seed", seed,
        "--save-interval-updates", save_every, "--keep-interval-updates", keep, "--no-epoch-checkpoints",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "50", "--no-progress-bar",
    ]
    argv += [] if validate else ["--disable-validation"]
    return [str(a) for a in [*argv, *flags]]


# ------------------------------------------------------------------------------- average

def checkpoints_until(save_dir: Path, n: int, updates: int) -> List[Path]:
    """The newest ``n`` update checkpoints (``checkpoint_E_U.pt``) with U <= ``updates``,
    oldest first (``resnmt-average --num-update-checkpoints``'s selection). fairseq writes
    no ``checkpoint_E_U.pt`` when U ends an epoch; the model after ``updates`` is then
    ``checkpoint_last.pt`` (if training stopped there)."""
    from resnmt.cli.average_checkpoints import numbered_checkpoints

    save_dir = Path(save_dir)
    found = numbered_checkpoints(save_dir, "update", updates)
    paths = [p for _, p in found]
    if (not found or found[-1][0] < updates) and trained_updates(save_dir) == updates:
        paths.append(save_dir / "checkpoint_last.pt")
    if len(paths) < n:
        raise ExperimentError(f"{save_dir}: {len(paths)} checkpoints up to update {updates}, {n} wanted for averaging")
    return paths[-n:]


def average(paths: Sequence[Path], output: Path) -> None:
    """``resnmt-average`` of ``paths`` into ``output`` (written atomically)."""
    from resnmt.cli.average_checkpoints import average_checkpoints, save_atomic

    save_atomic(average_checkpoints([Path(p) for p in paths]), Path(output))


# -------------------------------------------------------------------------- decode, score

def decode(bin_dir: Path, checkpoint: Path, output: Path, log_path: Optional[Path], env: Optional[Dict[str, str]], *,
           subset: str = "test", beam: int = 4, lenpen: float = 0.6, batch_size: int = 128,
           max_len_a: float = 0, max_len_b: int = 200, extra: Sequence[str] = ()) -> None:
    """``fairseq-generate`` with the papers' search (beam ``beam``, GNMT length penalty
    ``lenpen``) into ``output`` (written only if decoding succeeded); ``extra`` flags last."""
    run_logged(
        ["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--task", "resnmt_translation", "--path", checkpoint,
         "--gen-subset", subset, "--beam", beam, "--lenpen-form", "gnmt", "--lenpen", lenpen,
         "--batch-size", batch_size, "--num-workers", "0", "--max-len-a", max_len_a, "--max-len-b", max_len_b,
         *extra],
        log_path, env, stdout_path=output)


def score(hyp: Path, ref: Path, *, remove_bpe: str = "none", detok: str = "none", lang: Optional[str] = None,
          compound_split: bool = False) -> dict:
    """``resnmt-evaluate``'s result for a fairseq-generate output against ``ref``."""
    from resnmt.cli.evaluate import build_parser, evaluate

    argv = ["--hyp", str(hyp), "--ref", str(ref), "--remove-bpe", remove_bpe, "--detok", detok]
    argv += ["--lang", lang] if lang else []
    argv += ["--compound-split"] if compound_split else []
    return evaluate(build_parser().parse_args(argv))


def analyze(checkpoint: Path, bin_dir: Path, out_dir: Path, log_path: Optional[Path], env: Optional[Dict[str, str]],
            *, split: str = "valid", num_sentences: int = 500) -> dict:
    """``resnmt-analyze`` of ``checkpoint`` on the CPU; returns its ``analysis.json``."""
    run_logged(["resnmt-analyze", checkpoint, "--data", bin_dir, "--split", split,
                "--num-sentences", num_sentences, "--out", out_dir, "--no-progress-bar", "--cpu"], log_path, env)
    return json.loads((Path(out_dir) / "analysis.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- fairseq log

_VALID_RE = re.compile(r"\| valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \|.*?\| num_updates (\d+)")
_TRAIN_RE = re.compile(r"\| train_inner \|.*?loss=([\d.]+).*?num_updates=(\d+)")
_EPOCH_RE = re.compile(r"\| train \| epoch (\d+) \| loss ([\d.]+) \|.*?\| num_updates (\d+)")
_PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
_DONE_RE = re.compile(r"done training in ([\d.]+) seconds")


@dataclass
class FairseqLog:
    """What ``fairseq-train --log-format simple`` printed: validation points
    ``(updates, loss, nll_loss)``, training-loss points ``(updates, loss)``, end-of-epoch
    points ``(epoch, updates, loss)``, the parameter count and the seconds of all finished
    runs. A restarted run repeats no point (later lines win)."""

    valid: List[tuple]
    train: List[tuple]
    epochs: List[tuple] = field(default_factory=list)
    params: Optional[int] = None
    train_seconds: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "FairseqLog":
        valid = {int(u): (int(u), float(loss), float(nll)) for loss, nll, u in _VALID_RE.findall(text)}
        train = {int(u): (int(u), float(loss)) for loss, u in _TRAIN_RE.findall(text)}
        epochs = {int(e): (int(e), int(u), float(loss)) for e, loss, u in _EPOCH_RE.findall(text)}
        params = _PARAMS_RE.findall(text)
        return cls(valid=[valid[k] for k in sorted(valid)], train=[train[k] for k in sorted(train)],
                   epochs=[epochs[k] for k in sorted(epochs)],
                   params=int(params[-1].replace(",", "")) if params else None,
                   train_seconds=round(sum(float(s) for s in _DONE_RE.findall(text)), 1))

    @classmethod
    def read(cls, path: Path) -> "FairseqLog":
        return cls.parse(Path(path).read_text(encoding="utf-8", errors="replace"))


# ------------------------------------------------------------------------ the pipeline

@dataclass
class ExperimentRequest:
    """The options of ``resnmt-experiment`` (its --help documents each); checked and
    converted (numbers, paths) on construction, like ``TrainRequest``."""

    train: TrainRequest
    data_root: Optional[Path] = None
    mirror: Optional[Path] = None
    prep_args: str = ""
    average: int = 10
    beam: int = 4
    lenpen: float = 0.6
    batch_size: int = 128
    gen_args: str = ""
    results: Path = Path("runs/results.jsonl")
    threads: Optional[int] = None  # torch threads of its training and decoding (None: torch's default; the demo sets it)

    MINIMA = {"average": 1, "beam": 1, "batch_size": 1, "threads": 1}

    def __post_init__(self):
        convert_fields(self, integers=self.MINIMA, numbers={"lenpen": 0.0}, paths=("data_root", "mirror", "results"))
        if self.mirror is not None and not self.mirror.is_dir():
            raise UsageError(f"--mirror {self.mirror}: no such directory")


# The Multi30k files on this project's machines (a sibling checkout's shared/data); the
# prepare script downloads them when no mirror is given.
_SIBLING_MULTI30K_MIRROR = REPO_ROOT.parent / "shared" / "data" / "multi30k"


class Experiment:
    """``run``: prepare -> train -> average -> decode -> score for one model, each step
    skipped when its output exists. All options are checked on construction."""

    STEPS = 5

    def __init__(self, req: ExperimentRequest, log: Log, train_log: Log, label: str = ""):
        """``label`` starts each line of fairseq's output (to tell concurrent experiments apart)."""
        self.req, self.log, self.train_log, self.label = req, log, train_log, label
        self.dataset = dataset_of(req.train.dataset)
        require_commands("fairseq-generate")
        self.data_root = req.data_root or Path(f"data/{self.dataset.name}")
        self.save_dir = req.train.save_dir or default_save_dir(self.dataset.name, req.train.arch, req.train.tag)
        self.mirror = req.mirror
        if not self.mirror and self.dataset.name == "multi30k" and _SIBLING_MULTI30K_MIRROR.is_dir():
            self.mirror = _SIBLING_MULTI30K_MIRROR
        self.train_request = replace(req.train, data=self.data_root / "bin", save_dir=self.save_dir)
        try:  # every option of the training step is checked now, before any heavy work
            plan_training(self.train_request, dry_run=True)
        except ExperimentError as e:
            train_log(f"error: {e}")
            raise ExperimentError("scripts/train.sh refused the training options (message above)") from None

    def step(self, number: int, message: str) -> None:
        self.log(f"step {number}/{self.STEPS}: {message}")

    def run(self) -> dict:
        """The experiment's record (also in SAVE_DIR/result.json)."""
        self.prepare()
        self.train()
        checkpoint, n, kind, label = self.average()
        key = f"{label}.beam{self.req.beam}.lenpen{self.req.lenpen:g}"
        if self.req.gen_args:
            key += f".gen{posix_cksum(self.req.gen_args.encode())}"
        gen = self.decode(checkpoint, key)
        return self.score(gen, key, checkpoint, n, kind)

    def prepare(self) -> None:
        if is_prepared(self.data_root, self.dataset):
            self.step(1, f"prepare: {self.data_root}/bin exists, skipped")
            return
        self.step(1, f"prepare {self.data_root}")
        prepare(self.dataset, self.data_root, self.mirror, shlex.split(self.req.prep_args))

    def train(self) -> None:
        done = self.save_dir / "train.done"
        if done.exists():
            self.step(2, f"train: {done} exists, skipped")
            return
        self.step(2, f"train {self.req.train.arch} into {self.save_dir}")
        t0 = time.time()
        train(plan_training(self.train_request, self.train_log), self.train_log, self.req.threads, self.label)
        atomic_write_text(done, json.dumps({"wall_seconds": int(time.time() - t0)}) + "\n")

    def average(self) -> Tuple[Path, int, str, str]:
        """(checkpoint to decode, number averaged, their kind, label): the newest
        ``--average`` update checkpoints or, without any, epoch checkpoints; fewer if
        fewer exist; checkpoint_last.pt alone if training saved no numbered one."""
        from resnmt.cli.average_checkpoints import numbered_checkpoints

        kind, found = "update", numbered_checkpoints(self.save_dir, "update")
        if not found:
            kind, found = "epoch", numbered_checkpoints(self.save_dir, "epoch")
        if not found:
            last = self.save_dir / "checkpoint_last.pt"
            if not last.exists():
                raise ExperimentError(f"no checkpoints in {self.save_dir}")
            # training stopped (--max-update) before the end of epoch 1 and saved no numbered checkpoint
            self.step(3, f"average: no epoch or update checkpoints in {self.save_dir}, decoding checkpoint_last.pt alone")
            return last, 1, "last", "last"
        n = min(len(found), self.req.average)
        output = self.save_dir / f"checkpoint.avg{n}.pt"
        if output.exists():
            self.step(3, f"average: {output} exists, skipped")
        else:
            self.step(3, f"average the last {n} {kind} checkpoints -> {output}")
            if n < self.req.average:
                self.log(f"note: {len(found)} {kind} checkpoint(s) in {self.save_dir}, fewer than --average "
                         f"{self.req.average}: averaging {n}")
            average([p for _, p in found[-n:]], output)
        return output, n, kind, f"avg{n}"

    def decode(self, checkpoint: Path, key: str) -> Path:
        gen = self.save_dir / f"gen.test.{key}.out"
        if gen.exists():
            self.step(4, f"decode: {gen} exists, skipped")
            return gen
        self.step(4, f"decode test with beam {self.req.beam}, GNMT length penalty {self.req.lenpen:g} -> {gen}")
        post = "sentencepiece" if (self.data_root / "spm" / "spm.model").exists() else "subword_nmt"
        t0 = time.time()
        decode(self.data_root / "bin", checkpoint, gen, None, tool_env(self.req.threads), beam=self.req.beam,
               lenpen=self.req.lenpen,
               batch_size=self.req.batch_size,
               extra=["--source-lang", self.dataset.src, "--target-lang", self.dataset.tgt, "--post-process", post,
                      *shlex.split(self.req.gen_args)])
        sentences = sum(line.startswith("D-") for line in gen.read_text(encoding="utf-8").splitlines())
        self.log(f"decoded {sentences} sentences in {format_seconds(time.time() - t0)}")
        return gen

    def score(self, gen: Path, key: str, checkpoint: Path, n: int, kind: str) -> dict:
        result_path = self.save_dir / f"result.{key}.json"
        if result_path.exists():
            self.step(5, f"score: {result_path} exists, skipped")
            record = json.loads(result_path.read_text(encoding="utf-8"))
        else:
            ref = self.data_root / "raw" / f"test.{self.dataset.tgt}"
            self.step(5, f"score against {ref}")
            from resnmt.cli.evaluate import summary

            result = score(gen, ref, **self.dataset.score_options)
            print(summary(result), flush=True)
            fairseq_log = FairseqLog.read(self.save_dir / "train.log")
            last_epoch = fairseq_log.epochs[-1] if fairseq_log.epochs else (None, None, None)
            record = {
                "dataset": self.dataset.name, "arch": self.req.train.arch, "save_dir": os.path.abspath(self.save_dir),
                "params": fairseq_log.params, "num_updates": last_epoch[1], "epochs": last_epoch[0],
                "train_seconds": fairseq_log.train_seconds,
                "train_wall_seconds": json.loads((self.save_dir / "train.done").read_text()).get("wall_seconds"),
                "checkpoint": os.path.abspath(checkpoint), "averaged": n, "averaged_kind": kind,
                "beam": self.req.beam, "lenpen": self.req.lenpen, "lenpen_form": "gnmt",
                **dict(sorted(result.items())),
            }
            atomic_write_text(result_path, json.dumps(record) + "\n")
            results = self.req.results
            results.parent.mkdir(parents=True, exist_ok=True)
            with open(results, "a", encoding="utf-8") as f:  # one write: concurrent runs append whole lines
                f.write(json.dumps(record) + "\n")
            self.log(f"appended the result to {self.req.results}")
        # result.json: the result of the latest settings (rewritten only when they changed)
        latest = self.save_dir / "result.json"
        text = result_path.read_text(encoding="utf-8")
        if not latest.exists() or latest.read_text(encoding="utf-8") != text:
            atomic_write_text(latest, text)
        print(describe(record), flush=True)
        return record


def describe(r: dict) -> str:
    """One line: the scores, the size and the training of an experiment's record."""
    parts = [f"BLEU {r['bleu']:.2f} ({r['signature']})", f"tokenized intl BLEU {r['tok_intl_bleu']:.2f}"]
    if r.get("compound_split_bleu") is not None:
        parts.append(f"compound-split BLEU {r['compound_split_bleu']:.2f}")
    if r.get("params"):
        parts.append(f"{r['params']:,} parameters")
    parts.append(f"{r['num_updates']} updates, averaged {r['averaged']} {r['averaged_kind']} checkpoints")
    return f"{r['dataset']} {r['arch']}: " + ", ".join(parts)
