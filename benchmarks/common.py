"""The benchmarks' library, which every script in benchmarks/ is a command over: the rows
they train (named records) and the study's milestones; settings keys, run names and the
machine a number was measured on; training to a budget and resuming (fairseq-train's
command for a benchmark run), the checkpoints at a budget and their average decoded and
scored (resnmt's steps); the measured model configs and what each is compared with
(speed.py, gpu_train.py; profile_ops.py profiles them), their training batches and step;
the verdicts on what was measured. fairseq's own Trainer, built and timed, is
fairseq_trainer.py's; the tables of the results are result_tables.py's and
study_tables.py's (make_tables.py writes them into the documents); fairseq's log is read
by ``resnmt.experiment.steps.FairseqLog``. The scripts import these modules, never each
other.
"""
import datetime
import hashlib
import json
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from resnmt.atomic import atomic_write_text
from resnmt.decoding.averaging import numbered_checkpoints
from resnmt.experiment import steps
from resnmt.experiment.errors import ExperimentError
from resnmt.experiment.presets import ModelSize
from resnmt.experiment.runtime import USER_DIR, run_logged

REPO_ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    """A connection kind as the quality and curves benchmarks train it."""

    arch: str
    flags: Tuple[str, ...] = ()
    seeds: int = 2  # seeds the quality table wants


ROWS: Dict[str, Row] = {
    "transformer": Row("transformer"),
    "post_ln": Row("transformer_postln_base", seeds=3),
    "pre_ln": Row("transformer_preln_base"),
    "xskip (λ=1)": Row("transformer_postln_base", ("--residual", "xskip", "--skip-lambda", "1")),
    "xskip_ln (λ=2)": Row("transformer_xskip_base", ("--skip-lambda", "2")),
    "rskip_ln (λ=2)": Row("transformer_rskip_base", ("--skip-lambda", "2"), seeds=3),
    "rskip_ln (λ=3)": Row("transformer_rskip_base", ("--skip-lambda", "3")),
    "sas": Row("transformer_sas_base", seeds=3),
    "highway": Row("transformer_highway_base"),
    "rskip_ln (λ=2) + nswish": Row("transformer_rskip_base",
                                   ("--skip-lambda", "2", "--normalized-activation", "nswish")),
    "xskip_ln (learned λ from 2)": Row("transformer_xskip_base", ("--skip-lambda", "2", "--skip-lambda-learned")),
    "deepnorm": Row("transformer_deepnorm_base"),
    "rezero": Row("transformer_rezero_base"),
    "admin": Row("transformer_admin_base"),
    # the methods that cross layers, Peri-LN and the normalization (one seed each so far)
    "peri_ln": Row("transformer_periln_base", seeds=1),
    "b2t": Row("transformer_b2t_base", seeds=1),
    "resi_dual": Row("transformer_resi_dual_base", seeds=1),
    "dlcl": Row("transformer_dlcl_base", seeds=1),
    "dlcl_post": Row("transformer_dlcl_post_base", seeds=1),
    "pre_ln + rms_norm": Row("transformer_preln_base", ("--normalization", "rms_norm"), seeds=1),
    "post_ln + rms_norm": Row("transformer_postln_base", ("--normalization", "rms_norm"), seeds=1),
    "pre_ln + dyt": Row("transformer_preln_base", ("--normalization", "dyt"), seeds=1),
    "post_ln + dyt": Row("transformer_postln_base", ("--normalization", "dyt"), seeds=1),
    # the 2025 kinds (issue 44), one seed each so far
    "hyper": Row("transformer_hyper_base", seeds=1),
    "mhc": Row("transformer_mhc_base", seeds=1),
    "mix_ln": Row("transformer_mix_ln_base", seeds=1),
    "ln_scaling": Row("transformer_ln_scaling_base", seeds=1),
    "hybrid_norm": Row("transformer_hybrid_norm_base", seeds=1),
    "denseformer": Row("transformer_denseformer_base", seeds=1),
    "hybrid_norm_star": Row("transformer_hybrid_norm_base", ("--hybrid-norm-star",), seeds=1),
}
# the rows above that the quality table (benchmarks/quality.py) does not train: the
# methods that cross layers and the normalizations, then the 2025 kinds (studied after them)
NEW_KINDS = ("b2t", "resi_dual", "dlcl", "peri_ln", "dlcl_post", "pre_ln + rms_norm", "post_ln + rms_norm",
             "pre_ln + dyt", "post_ln + dyt")
GEN2025_KINDS = ("hyper", "mhc", "mix_ln", "ln_scaling", "hybrid_norm", "denseformer")
# their papers' variants, asked where the kind itself fails: HybridNorm* (pre-LN in each
# stack's first layer, the paper's best) at 6+6, where HybridNorm trains as post-LN does
GEN2025_VARIANTS = ("hybrid_norm_star",)
# (size, row) -> the row whose run it is, bit for bit (same weights, same computation), so
# the study reads that run instead of training it again: Mix-LN's post-LN layers are the
# lowest int(0.25 * 2) = 0 of 2 (tests/test_gen2025_kinds.py::test_mix_ln_at_two_layers_is_pre_ln)
SAME_RUN = {("small", "mix_ln"): "pre_ln"}


@dataclass(frozen=True)
class Control:
    """A control of the curves study: one shared setting changed for one row (its flags
    come last on fairseq-train's command line, so they win)."""

    row: str
    flags: Tuple[str, ...]


# The shared 300 warm-up updates at lr 1e-3 are harsh for a 6+6 post-LN model; these runs
# say whether post-LN's slow start at 6+6 is that setting, and whether rSkip's lead
# survives a gentler one.
CONTROLS: Dict[str, Control] = {
    "post_ln (warm-up 1000)": Control("post_ln", ("--warmup-updates", "1000")),
    "rskip_ln (λ=2, warm-up 1000)": Control("rskip_ln (λ=2)", ("--warmup-updates", "1000")),
    "b2t (warm-up 1000)": Control("b2t", ("--warmup-updates", "1000")),
    "resi_dual (warm-up 1000)": Control("resi_dual", ("--warmup-updates", "1000")),
}
CONTROL_ROWS: Dict[str, Row] = {name: Row(ROWS[c.row].arch, (*ROWS[c.row].flags, *c.flags), seeds=1)
                                for name, c in CONTROLS.items()}
CURVES_ROWS: Dict[str, Row] = {**ROWS, **CONTROL_ROWS}

# Each size's milestones in the curves study (updates): the last is the run's length. The
# 2+2 final budget is where post-LN's curve flattens: seed 2 gained 1.00 BLEU from 9600 to
# 12000 updates, 0.19 to 14400, then 0.01 and 0.15 over the next two 2400-update steps
# (36.79, 36.80, 36.95), its validation loss 0.035, then 0.015 and 0.012 (4.118 at 14400).
# A 6+6 run costs about 3 times as much per update: 2400 updates is what two of them side
# by side (1 thread each) reach within one 3-hour session on this CPU.
DEFAULT_MILESTONES = {
    "small": (200, 600, 1200, 1800, 2400, 3600, 4800, 7200, 9600, 12000, 14400),
    "deep": (200, 600, 1200, 1800, 2400),
    "base": (200, 600, 1200, 1800, 2400, 3600, 4800),
}


def slug(row: str) -> str:
    """A row's name as a file name and a command-line word: "rskip_ln (λ=2)" -> "rskip_ln_2"."""
    return re.sub(r"[^a-z0-9]+", "_", row.lower()).strip("_")

# ------------------------------------------------------------------------------ records


def run_id() -> str:
    """A run's name: the UTC time it started (or finished), e.g. 2026-11-24T09:30:00Z."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def settings_key(settings: dict) -> str:
    """The 10-hex-digit name of a benchmark's settings (its run directories and JSON lines)."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def repo_relative(path: Path, root: Path = REPO_ROOT) -> str:
    """``path`` relative to ``root`` when inside it (committed results hold no machine paths)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


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

# ------------------------------------------------------------------- training to a budget


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


def average_and_score(checkpoints: Sequence[Path], avg: Path, gen: Path, bin_dir: Path, ref: Path,
                      log_path: Path, env: Dict[str, str], *, remove_bpe: str, **decode) -> Tuple[dict, float]:
    """The model averaged from ``checkpoints`` (into ``avg``), the test set decoded into
    ``gen`` with the papers' search (``decode``: more of ``steps.decode``'s options) and
    scored against ``ref``: (resnmt-evaluate's result, the seconds decoding took)."""
    steps.average(checkpoints, avg)
    started = time.time()
    steps.decode(bin_dir, avg, gen, log_path, env, **decode)
    seconds = time.time() - started
    return steps.score(gen, ref, remove_bpe=remove_bpe), seconds


def checkpoints_until(save_dir: Path, n: int, updates: int) -> List[Path]:
    """The newest ``n`` update checkpoints (``checkpoint_E_U.pt``) with U <= ``updates``,
    oldest first (``resnmt-average --num-update-checkpoints``'s selection). fairseq writes
    no ``checkpoint_E_U.pt`` when U ends an epoch; the model after ``updates`` is then
    ``checkpoint_last.pt`` (if training stopped there)."""
    save_dir = Path(save_dir)
    found = numbered_checkpoints(save_dir, "update", updates)
    paths = [p for _, p in found]
    if (not found or found[-1][0] < updates) and trained_updates(save_dir) == updates:
        paths.append(save_dir / "checkpoint_last.pt")
    if len(paths) < n:
        raise ExperimentError(f"{save_dir}: {len(paths)} checkpoints up to update {updates}, {n} wanted for averaging")
    return paths[-n:]

# --------------------------------- speed measurements (speed.py, gpu_train.py, profile_ops.py)

# measurement name -> (arch, extra flags); {L} is replaced by the number of layers
CONFIGS = {
    "transformer": ("transformer", []),
    "transformer_prenorm": ("transformer", ["--encoder-normalize-before", "--decoder-normalize-before"]),
    "post_ln": ("transformer_postln_base", []),
    "pre_ln": ("transformer_preln_base", []),
    "xskip_ln2": ("transformer_xskip_base", ["--skip-lambda", "2"]),
    "rskip_ln2": ("transformer_rskip_base", ["--skip-lambda", "2"]),
    "sas": ("transformer_sas_base", []),
    "sas_gate64": ("transformer_sas_base", ["--sas-gate-dim", "64"]),
    "highway": ("transformer_highway_base", []),
    "deepnorm": ("transformer_deepnorm_base", []),
    "rezero": ("transformer_rezero_base", []),
    "admin": ("transformer_admin_base", []),
    # plain Swish: nswish with every FFN kept unnormalized (fairseq has no swish --activation-fn)
    "swish": ("transformer_postln_base", ["--normalized-activation", "nswish",
                                          "--encoder-unnormalized-top-layers", "{L}",
                                          "--decoder-unnormalized-top-layers", "{L}"]),
    "nswish": ("transformer_postln_base", ["--normalized-activation", "nswish"]),
    "nrelu": ("transformer_postln_base", ["--normalized-activation", "nrelu"]),
    # --fused-connections: SAS's combination and NReLU/NSwish compiled (resnmt/fused.py)
    "sas_fused": ("transformer_sas_base", ["--fused-connections"]),
    "sas_gate64_fused": ("transformer_sas_base", ["--sas-gate-dim", "64", "--fused-connections"]),
    "nswish_fused": ("transformer_postln_base", ["--normalized-activation", "nswish", "--fused-connections"]),
    "nrelu_fused": ("transformer_postln_base", ["--normalized-activation", "nrelu", "--fused-connections"]),
    "peri_ln": ("transformer_periln_base", []),
    "b2t": ("transformer_b2t_base", []),
    "resi_dual": ("transformer_resi_dual_base", []),
    "dlcl": ("transformer_dlcl_base", []),
    "dlcl_post": ("transformer_dlcl_post_base", []),
    "pre_ln_rms_norm": ("transformer_preln_base", ["--normalization", "rms_norm"]),
    "post_ln_rms_norm": ("transformer_postln_base", ["--normalization", "rms_norm"]),
    "pre_ln_dyt": ("transformer_preln_base", ["--normalization", "dyt"]),
    "post_ln_dyt": ("transformer_postln_base", ["--normalization", "dyt"]),
    "hyper": ("transformer_hyper_base", []),
    "mhc": ("transformer_mhc_base", []),
    "mix_ln": ("transformer_mix_ln_base", []),
    "ln_scaling": ("transformer_ln_scaling_base", []),
    "hybrid_norm": ("transformer_hybrid_norm_base", []),
    "denseformer": ("transformer_denseformer_base", []),
}

@dataclass(frozen=True)
class Comparison:
    """A config of ``CONFIGS`` measured against its reference, and the ratios to the
    reference it should reach (None: no fixed target)."""

    config: str
    reference: Optional[str] = None  # None: a reference itself
    train: Optional[float] = None  # training throughput over the reference's, at least
    decode: Optional[float] = None  # decoding throughput over the reference's, at least
    memory: Optional[float] = None  # peak memory over the reference's, at most
    flops: Optional[float] = None  # training ratio: at least this fraction of the one its FLOPs predict
    band: Optional[Tuple[float, float]] = None  # same-math pairs: the training ratio lies in this band
    times: Optional[float] = None  # training ratio: at least this many times the reference's


def fairseq_argv(data, config, size, max_tokens):
    """fairseq's training command line (without the program) for ``config`` at ``size``
    ((layers, dim, ffn, heads)): label-smoothed cross-entropy, dropout 0.1, seed 1."""
    arch, extra = CONFIGS[config]
    extra = [e.replace("{L}", str(size[0])) for e in extra]
    return [
        str(data), "--arch", arch, "--user-dir", str(USER_DIR), *ModelSize(*size).fairseq_flags(),
        "--share-all-embeddings", "--dropout", "0.1", "--max-tokens", str(max_tokens),
        "--seed", "1", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        *extra,
    ]


def training_batches(task, max_tokens, n, *, seed=1, max_positions=(1024, 1024), max_sentences=None,
                     required_batch_size_multiple=8):
    """The first ``n`` training batches of epoch 1 (the train split loaded) as fairseq-train
    batches them: shuffled with ``seed``, sentences longer than ``max_positions`` left out."""
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens, max_sentences=max_sentences,
        max_positions=max_positions, ignore_invalid_inputs=True,
        required_batch_size_multiple=required_batch_size_multiple, seed=seed,
    ).next_epoch_itr(shuffle=True)
    return [next(itr) for _ in range(n)]


# fp16's initial loss scale (fairseq's dynamic scaler starts at 128 too); halved at each
# overflow, never raised (a measurement is a few dozen updates)
FP16_LOSS_SCALE = 128.0


class Optimizer:
    """Adam (0.9/0.98) on the model's weights; for a half-precision model, fairseq's
    ``--fp16``/``--bf16`` scheme: float32 master weights stepped by Adam, gradients copied
    up (and unscaled for fp16), the half weights copied back after each step."""

    def __init__(self, model, dtype):
        import torch

        self.params = [p for p in model.parameters() if p.requires_grad]
        self.half = dtype != torch.float32
        self.loss_scale = FP16_LOSS_SCALE if dtype == torch.float16 else 1.0
        self.overflows = 0
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params] if self.half else self.params
        self.adam = torch.optim.Adam(self.masters, lr=1e-4, betas=(0.9, 0.98), eps=1e-8)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def backward(self, loss):
        (loss * self.loss_scale).backward() if self.loss_scale != 1.0 else loss.backward()

    def step(self):
        """Adam's step; in fp16 an update whose gradients overflowed is skipped and the loss
        scale halved, as fairseq's dynamic loss scaler does (so the weights stay finite)."""
        import torch

        if self.half:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    m.grad = None if p.grad is None else p.grad.float().div_(self.loss_scale)
                grads = [m.grad for m in self.masters if m.grad is not None]
                if self.loss_scale != 1.0 and not all(torch.isfinite(g).all() for g in grads):
                    self.loss_scale /= 2
                    self.overflows += 1
                    return
        self.adam.step()
        if self.half:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)


def train_step(model, optimizer, batch, pad):
    """One update: label-smoothed (0.1) cross-entropy, backward, optimizer step."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    model.train()
    optimizer.zero_grad()
    net_output = model(**batch["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), batch["target"].view(-1), 0.1,
                                      ignore_index=pad, reduce=True)
    optimizer.backward(loss)
    optimizer.step()


# -------------------------------------------------------------------------------- verdicts

# SAS rows: measured training ratio over the one the gates' multiply-adds predict (the
# SAS overhead table); 0.95 where no issue set another.
PREDICTION_TARGETS = {"sas (gate h) fused": 1.0}
PREDICTION_TARGET_DEFAULT = 0.95


def verdict(value, target, higher_is_better=True):
    """``pass`` or ``MISS`` of a measured ratio against its target ("" without either)."""
    if target is None or value is None:
        return ""
    ok = value >= target if higher_is_better else value <= target
    return "pass" if ok else "MISS"


def judge_training(c: Comparison, rec: dict) -> dict:
    """gpu_train.py's verdict on a row's training ratio to its reference (``rec``: its
    ``ratio`` with min, max and spread over rounds, and ``flops_ratio``): the ``target`` as
    text and whether it ``meets`` it; for a same-math pair also whether the measurement
    ``resolves`` 2 % (spread and ratio range under 2 %)."""
    if c.times:
        return {"target": f">= {c.times:g}x {c.reference.replace('_', ' ')}", "meets": rec["ratio"] >= c.times}
    if c.band:
        lo, hi = c.band
        resolves = rec["spread"] < 0.02 and rec["ratio_max"] - rec["ratio_min"] < 0.02
        return {"target": f"{lo}-{hi}", "meets": lo <= rec["ratio"] <= hi, "resolves": resolves}
    if c.flops and "flops_ratio" in rec:
        goal = c.flops * rec["flops_ratio"]
        return {"target": f">= {c.flops} x FLOPs ratio = {goal:.3f}", "meets": rec["ratio"] >= goal}
    if c.train:
        return {"target": f">= {c.train}", "meets": rec["ratio"] >= c.train}
    return {}


def fp16_log_record(log) -> dict:
    """What fp16.py records of a ``fairseq-train --fp16`` run's log (a ``FairseqLog``): the
    updates skipped for overflowing gradients, the last loss scale and training loss
    logged, and whether the loss scale reached its minimum (which stops the run)."""
    last = next((f for f in reversed(log.inner) if {"loss", "loss_scale", "num_updates"} <= set(f)), None)
    scales = log.overflow_scales
    return {
        "overflows": len(scales),
        "loss_scale": float(last["loss_scale"]) if last else (scales[-1] if scales else None),
        "train_loss": float(last["loss"]) if last else None,
        "updates_logged": int(last["num_updates"]) if last else 0,
        "min_scale_reached": log.min_scale_reached,
    }


def fp16_verdicts(records, baseline: str = "post_ln"):
    """Each fp16.py record's ``passed``: it finished with a finite loss and no more
    overflows than the ``baseline`` row's."""
    base = next((r for r in records if r["row"] == baseline), None)
    for r in records:
        finite = r["train_loss"] is not None and r["train_loss"] == r["train_loss"] and r["train_loss"] != float("inf")
        ok = r["exit_code"] == 0 and not r["min_scale_reached"] and finite
        r["baseline_overflows"] = base["overflows"] if base else None
        r["passed"] = bool(ok and (base is None or r["overflows"] <= base["overflows"]))
    return records
