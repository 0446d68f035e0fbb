#!/usr/bin/env python
"""GPU training speed as users run it: fairseq's own ``Trainer.train_step``.

Every configuration is parsed by fairseq's option parser from a fairseq-train command
line (``--user-dir resnmt``; for ``--bf16`` also resnmt-train's untying of bf16 from
TPUs) and trained by ``fairseq.trainer.Trainer``: its FP16/bf16 optimizer with float32
master weights, loss scaling, gradient norm, criterion and metrics, the code
``fairseq-train`` runs per update. Nothing of the update is our own loop.

Method (docs/benchmarks.md, "GPU training through fairseq's trainer"):

* the data is the first ``--batches`` training batches of the binarized corpus at the
  given ``--max-tokens`` (fairseq's batching, seed 1), the same batches for every
  configuration, cycled; reported tokens are target tokens actually trained on;
* each configuration is built once per token budget, warmed up (``--warmup`` updates,
  which includes any compilation), then timed ``--updates`` updates at a time with
  ``torch.cuda.synchronize()`` before and after, once per round; within a round the
  configurations run interleaved, the order reversed every other round; ``--rounds``
  rounds; a row reports the median tokens/s with min and max, and its ratio to its
  reference as the median (min-max) of the per-round ratios;
* model FLOPs per update are counted with ``torch.utils.flop_counter`` over one forward
  and backward of the first batch (matrix products and attention; what the matrix units
  do) and reported as a fraction of the card's bf16 matrix rate measured by this script
  (``--matmul-size`` cubed products), and as the ratio each row's FLOPs predict;
* ``--profile FILE``: a torch.profiler trace summary of one update (top kernels, kernel
  launches, host-device synchronisations) of the stock fp16 row and of the recipes;
* ``--whole-process``: complete ``fairseq-train`` runs, stock (``--arch transformer
  --fp16``) against ``--user-dir resnmt --arch transformer_postln_base --fp16`` and the
  recipe through resnmt-train, fairseq's own ``wps`` parsed from its json log and the
  per-update losses compared.

Rows are written to ``--out`` as JSON lines as each finishes; the markdown table goes to
stdout. ``--deadline S`` stops starting new work after S seconds (each phase writes what
it finished). ``--smoke`` is the CPU check the test suite runs: 2+2 layers, d=64, a few
updates, fp32 timing.

    python benchmarks/gpu_train.py --data .gpu/multi30k/bin --out $OUT/gpu_train.jsonl \\
        --profile $OUT/profile.json --whole-process          # on the GPU (benchmarks/gpu_job.sh)
    python benchmarks/gpu_train.py --smoke --cpu --data DIR --out /tmp/x.jsonl
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO_ROOT / "resnmt")
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@dataclass(frozen=True)
class Row:
    """A configuration: fairseq-train flags, and the row it is compared with."""

    arch: str
    extra: tuple = ()
    reference: Optional[str] = None  # None: a reference itself
    target: Optional[float] = None  # ratio to the reference to reach (at least), None: none fixed
    flops_target: Optional[float] = None  # at least this fraction of the ratio its FLOPs predict
    band: Optional[tuple] = None  # same-math rows: the ratio must lie in this band


ROWS: Dict[str, Row] = {
    "transformer": Row("transformer"),
    "post_ln": Row("transformer_postln_base", reference="transformer", band=(0.98, 1.02)),
    "transformer_prenorm": Row("transformer", ("--encoder-normalize-before", "--decoder-normalize-before")),
    "pre_ln": Row("transformer_preln_base", reference="transformer_prenorm", band=(0.98, 1.02)),
    "xskip_ln": Row("transformer_xskip_base", ("--skip-lambda", "2"), "transformer", 0.97),
    "rskip_ln": Row("transformer_rskip_base", ("--skip-lambda", "2"), "transformer", 0.97),
    "deepnorm": Row("transformer_deepnorm_base", (), "transformer", 0.97),
    "admin": Row("transformer_admin_base", (), "transformer", 0.97),
    "rezero": Row("transformer_rezero_base", (), "transformer", 0.97),
    "sas": Row("transformer_sas_base", (), "transformer", flops_target=0.95),  # the paper's gate
    "sas_gate64": Row("transformer_sas_base", ("--sas-gate-dim", "64"), "transformer", flops_target=0.95),
    "highway": Row("transformer_highway_base", (), "transformer", flops_target=0.95),  # a gate per sublayer
    # plain Swish: nswish with every FFN left unnormalized (fairseq 0.12 has no swish --activation-fn)
    "swish": Row("transformer_postln_base", ("--normalized-activation", "nswish", "--encoder-unnormalized-top-layers",
                                             "{L}", "--decoder-unnormalized-top-layers", "{L}")),
    "nswish": Row("transformer_postln_base", ("--normalized-activation", "nswish"), "swish", 0.95),
    "nrelu": Row("transformer_postln_base", ("--normalized-activation", "nrelu"), "transformer", 0.95),
}
# The methods that cross layers, Peri-LN and the normalizations: measured on their own
# (gpu_job.sh part 4, --rows), not by default, so that the rows above keep their rounds in
# a lease. Targets set by analogy before measuring: B2T and ResiDual add sums, DLCL and
# Peri-LN a weighted sum or a LayerNorm per sublayer, RMSNorm and DyT replace a LayerNorm.
CROSS_LAYER_ROWS: Dict[str, Row] = {
    "peri_ln": Row("transformer_periln_base", (), "transformer_prenorm", 0.93),
    "b2t": Row("transformer_b2t_base", (), "transformer", 0.97),
    "resi_dual": Row("transformer_resi_dual_base", (), "transformer", 0.97),
    "dlcl": Row("transformer_dlcl_base", (), "transformer_prenorm", 0.93),
    "dlcl_post": Row("transformer_dlcl_post_base", (), "transformer", 0.93),
    "pre_ln_rms_norm": Row("transformer_preln_base", ("--normalization", "rms_norm"), "pre_ln", 0.97),
    "post_ln_rms_norm": Row("transformer_postln_base", ("--normalization", "rms_norm"), "post_ln", 0.97),
    "pre_ln_dyt": Row("transformer_preln_base", ("--normalization", "dyt"), "pre_ln", 0.97),
    "post_ln_dyt": Row("transformer_postln_base", ("--normalization", "dyt"), "post_ln", 0.97),
    # the 2025 kinds (issue 44), targets by analogy as in speed.py; mix_ln and hybrid_norm
    # against pre-LN here (post-LN's row, transformer, is in the same part)
    "hyper": Row("transformer_hyper_base", (), "transformer_prenorm", 0.80),
    "mhc": Row("transformer_mhc_base", (), "transformer_prenorm", 0.70),
    "mix_ln": Row("transformer_mix_ln_base", (), "transformer_prenorm", 0.98),
    "ln_scaling": Row("transformer_ln_scaling_base", (), "transformer_prenorm", 0.97),
    "hybrid_norm": Row("transformer_hybrid_norm_base", (), "transformer_prenorm", 0.90),
    "denseformer": Row("transformer_denseformer_base", (), "transformer_prenorm", 0.93),
}
DEFAULT_ROWS = tuple(ROWS)
ROWS.update(CROSS_LAYER_ROWS)
# the recipe: resnmt-train --bf16 --optimizer adam_fused (and --compile-layers), against
# stock fairseq-train --fp16 with fairseq's adam
RECIPE_FLAGS = ("--optimizer", "adam_fused")
COMPILE_FLAGS = ("--task", "resnmt_translation", "--compile-layers")
STOCK = "stock_fp16"
RECIPES = {"recipe": RECIPE_FLAGS, "recipe_compiled": RECIPE_FLAGS + COMPILE_FLAGS}
WHOLE_RUNS = "stock_fairseq_train_fp16,resnmt_postln_fp16,resnmt_train_recipe_bf16,resnmt_train_recipe_compiled_bf16"
BASE = None  # the archs' own sizes: 6+6 layers, d=512, FFN 2048, 8 heads
SMOKE_SIZE = ("--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
              "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4")


@dataclass
class Config:
    """One measured configuration: a row at a precision (and the recipe's flags)."""

    name: str  # row name, or STOCK / a recipe
    row: str
    dtype: str  # fp16, bf16, fp32 (smoke)
    recipe: tuple = ()  # the recipe's flags
    trainer: object = None
    flops_per_update: float = 0.0
    tokens_per_update: float = 0.0
    warmup_s: float = 0.0  # the warm-up updates, compilation included
    samples: list = field(default_factory=list)  # (seconds, target tokens) per round

    @property
    def key(self):
        return f"{self.name}/{self.dtype}"


def train_argv(data, row: Row, dtype: str, max_tokens: int, recipe: tuple, smoke: bool, cpu: bool,
               compile_backend: str = "inductor") -> List[str]:
    layers = "2" if smoke else "6"
    extra = [e.replace("{L}", layers) for e in row.extra]
    argv = [str(data), "--user-dir", USER_DIR, "--task", "translation", "--arch", row.arch, *extra,
            "--share-all-embeddings", "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--max-tokens", str(max_tokens),
            "--seed", "1", "--num-workers", "0", "--no-progress-bar", "--log-format", "json"]
    if smoke:
        argv += SMOKE_SIZE
    if dtype in ("fp16", "bf16"):
        argv.append(f"--{dtype}")
    argv += list(recipe)
    if "--compile-layers" in recipe:
        argv += ["--compile-backend", compile_backend]
    if cpu:
        argv.append("--cpu")
    return argv


def build_trainer(argv: List[str]):
    """What fairseq_cli.train.main does up to the Trainer, from a fairseq-train command line."""
    import numpy as np
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    from resnmt.bf16 import untie_bf16_from_tpu

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)
    untie_bf16_from_tpu(args, argv)  # resnmt-train's parse
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion), task, cfg


def training_batches(task, cfg, n: int):
    """The first ``n`` batches of epoch 1 as fairseq-train builds them (seed 1)."""
    from fairseq import utils

    task.load_dataset("train", combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=cfg.dataset.max_tokens, max_sentences=None,
        max_positions=utils.resolve_max_positions(task.max_positions(), (1024, 1024)),
        ignore_invalid_inputs=True, required_batch_size_multiple=8, seed=1, num_workers=0,
    ).next_epoch_itr(shuffle=True)
    return [next(itr) for _ in range(n)]


def synchronize(cpu: bool):
    import torch

    if not cpu:
        torch.cuda.synchronize()


def run_updates(trainer, batches, start: int, n: int):
    """``n`` updates through Trainer.train_step; returns target tokens trained on."""
    tokens = 0
    for i in range(start, start + n):
        sample = batches[i % len(batches)]
        trainer.train_step([sample])
        tokens += int(sample["ntokens"])
    return tokens


def count_flops(trainer, sample) -> float:
    """Matrix-unit FLOPs of one forward and backward of ``sample`` (torch's flop counter).
    Counted in eval mode (no dropout, the same matrix products), where --compile-layers
    runs its layers eagerly: the counter sees every product, compiled or not."""
    from torch.utils.flop_counter import FlopCounterMode

    model, criterion = trainer.model, trainer.criterion
    sample = trainer._prepare_sample(sample)[0]
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            loss, _, _ = criterion(model, sample)
            loss.backward()
    finally:
        model.train()
        model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def matmul_rate(cpu: bool, size: int, reps: int = 10) -> dict:
    """The card's bf16 matrix-product rate, measured: ``size``-cubed products."""
    import torch

    device = "cpu" if cpu else "cuda"
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(cpu)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(cpu)
    seconds = (time.perf_counter() - t0) / reps
    return {"matmul_size": size, "bf16_tflops": 2 * size ** 3 / seconds / 1e12}


def write(out: Path, record: dict):
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


def median_min_max(values):
    return statistics.median(values), min(values), max(values)


def summarize(configs: List[Config], tokens_setting: int, peak_tflops: Optional[float]) -> List[dict]:
    """A record per configuration: tokens/s median (min-max), ratio to its reference."""
    by_key = {c.key: c for c in configs}
    rows = []
    for c in configs:
        rates = [tok / sec for sec, tok in c.samples]
        if not rates:
            continue
        med, lo, hi = median_min_max(rates)
        per_update = statistics.median(sec / (tok / c.tokens_per_update) for sec, tok in c.samples) \
            if c.tokens_per_update else None
        rec = {"kind": "row", "config": c.name, "dtype": c.dtype, "max_tokens": tokens_setting,
               "arch": ROWS[c.row].arch, "flags": list(ROWS[c.row].extra) + list(c.recipe),
               "rounds": len(rates), "tokens_per_s": med, "tokens_per_s_min": lo, "tokens_per_s_max": hi,
               "spread": (hi - lo) / med, "target_tokens_per_update": c.tokens_per_update,
               "flops_per_update": c.flops_per_update, "warmup_s": c.warmup_s}
        if peak_tflops and per_update:
            rec["mfu"] = c.flops_per_update / per_update / (peak_tflops * 1e12)
        ref = by_key.get(reference_of(c, configs))
        if ref is not None and ref is not c and len(ref.samples) == len(c.samples):
            ratios = [(tok / sec) / (rt / rs) for (sec, tok), (rs, rt) in zip(c.samples, ref.samples)]
            r_med, r_lo, r_hi = median_min_max(ratios)
            rec.update(reference=ref.key, ratio=r_med, ratio_min=r_lo, ratio_max=r_hi)
            if c.flops_per_update and ref.flops_per_update:
                rec["flops_ratio"] = ref.flops_per_update / c.flops_per_update  # the speed ratio FLOPs predict
            rec.update(verdict(c, rec))
        rows.append(rec)
    return rows


def reference_of(c: Config, configs: List[Config]) -> Optional[str]:
    if c.name in RECIPES:
        return next((s.key for s in configs if s.name == STOCK), None)
    ref = ROWS[c.row].reference
    return f"{ref}/{c.dtype}" if ref else None


def verdict(c: Config, rec: dict) -> dict:
    row = ROWS[c.row]
    if c.name in RECIPES:
        return {"target": ">= 3x stock fp16", "meets": rec["ratio"] >= 3.0}
    if row.band:
        lo, hi = row.band
        resolves = rec["spread"] < 0.02 and rec["ratio_max"] - rec["ratio_min"] < 0.02
        return {"target": f"{lo}-{hi}", "meets": lo <= rec["ratio"] <= hi, "resolves": resolves}
    if row.flops_target and "flops_ratio" in rec:
        goal = row.flops_target * rec["flops_ratio"]
        return {"target": f">= {row.flops_target} x FLOPs ratio = {goal:.3f}", "meets": rec["ratio"] >= goal}
    if row.target:
        return {"target": f">= {row.target}", "meets": rec["ratio"] >= row.target}
    return {}


def markdown(rows: List[dict]) -> str:
    lines = ["| config | dtype | max tokens | target tok/update | tokens/s median (min-max) | ratio (min-max) | "
             "reference | target | meets | MFU |", "|" + "---|" * 10]
    for r in rows:
        ratio = f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})" if "ratio" in r else ""
        mfu = f"{100 * r['mfu']:.1f} %" if "mfu" in r else ""
        lines.append(f"| {r['config']} | {r['dtype']} | {r['max_tokens']} | {r['target_tokens_per_update']:.0f} | "
                     f"{r['tokens_per_s']:,.0f} ({r['tokens_per_s_min']:,.0f}-{r['tokens_per_s_max']:,.0f}) | {ratio} | "
                     f"{r.get('reference', '')} | {r.get('target', '')} | {r.get('meets', '')} | {mfu} |")
    pair = [r for r in rows if r["config"] == "post_ln" and "resolves" in r]
    for r in pair:
        lines.append(f"\nsame-math pair post_ln/transformer ({r['dtype']}, {r['max_tokens']}): ratio {r['ratio']:.3f}, "
                     f"spread {100 * r['spread']:.1f} %: " + ("resolves (within 2 %, spread under 2 %)" if r["resolves"]
                                                                  else "does NOT resolve 2 %: rows within "
                                                                  f"{100 * (r['ratio_max'] - r['ratio_min']):.1f} % of "
                                                                  "each other cannot be separated"))
    return "\n".join(lines)


def profile_update(trainer, batches, cpu: bool) -> dict:
    """torch.profiler over one update (after warm-up): top kernels, launches, syncs."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if cpu else [ProfilerActivity.CUDA])
    synchronize(cpu)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        run_updates(trainer, batches, 0, 1)
        synchronize(cpu)
    wall = time.perf_counter() - t0
    events = prof.key_averages()

    def device_time(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) or 0

    def count(pattern):
        return sum(e.count for e in events if re.search(pattern, e.key))

    kernels = [e for e in events if device_time(e) > 0 and not e.key.startswith(("aten::", "autograd::"))]
    kernels.sort(key=device_time, reverse=True)
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "wall_ms": 1e3 * wall,
        "device_time_ms": sum(device_time(e) for e in kernels) / 1e3,
        "kernel_launches": count(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC)$"),
        "host_syncs": {k: count(rf"^{k}$") for k in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                    "cudaEventSynchronize")},
        "memcpy_dtoh_or_sync_copies": count(r"^Memcpy DtoH") + count(r"^aten::_local_scalar_dense$"),
        "item_calls": count(r"^aten::item$"),
        "top_kernels": [{"name": e.key[:160], "count": e.count, "device_ms": device_time(e) / 1e3}
                        for e in kernels[:15]],
        "top_cpu_ops": [{"name": e.key[:160], "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                        for e in ops[:15]],
    }


def whole_process(a, out: Path, deadline: float):
    """fairseq-train processes, stock against resnmt: fairseq's own wps from its json log."""
    runs = {
        "stock_fairseq_train_fp16": [sys.executable, "-m", "fairseq_cli.train", "--arch", "transformer"],
        "resnmt_postln_fp16": [sys.executable, "-m", "fairseq_cli.train", "--user-dir", USER_DIR,
                               "--arch", "transformer_postln_base"],
        "resnmt_train_recipe_bf16": [sys.executable, "-m", "resnmt.cli.train", "--user-dir", USER_DIR,
                                     "--arch", "transformer_postln_base", *RECIPE_FLAGS],
        "resnmt_train_recipe_compiled_bf16": [sys.executable, "-m", "resnmt.cli.train", "--user-dir", USER_DIR,
                                              "--arch", "transformer_postln_base", *RECIPE_FLAGS, *COMPILE_FLAGS,
                                              "--compile-backend", a.compile_backend],
    }
    dtype = {"stock_fairseq_train_fp16": "--fp16", "resnmt_postln_fp16": "--fp16", "resnmt_train_recipe_bf16": "--bf16",
             "resnmt_train_recipe_compiled_bf16": "--bf16"}
    runs = {name: cmd for name, cmd in runs.items() if name in a.whole_runs.split(",")}
    losses = {}
    for name, cmd in runs.items():
        if time.monotonic() > deadline:
            print(f"[gpu_train] deadline: whole-process run {name} not started", file=sys.stderr)
            break
        argv = [*cmd, str(a.data), "--share-all-embeddings", "--dropout", "0.1", "--criterion",
                "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
                "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", "4000", "--max-tokens", str(a.whole_tokens), "--seed", "1",
                "--max-update", str(a.whole_updates), "--log-interval", str(a.whole_interval), "--log-format", "json",
                "--no-progress-bar", "--disable-validation", "--no-save", "--num-workers", "0"]
        if "--optimizer" in cmd[4:]:  # the recipe's adam_fused replaces adam
            i = argv.index("--optimizer", argv.index(str(a.data)))
            del argv[i:i + 2]
        argv += list(SMOKE_SIZE) if a.smoke else []
        argv += ["--cpu"] if a.cpu else [dtype[name]]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=a.whole_timeout,
                                  env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                      [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])))
        except subprocess.TimeoutExpired:
            write(out, {"kind": "whole_process", "run": name, "error": f"timed out after {a.whole_timeout} s"})
            continue
        wall = time.perf_counter() - t0
        inner = [json.loads(line[line.index("{"):]) for line in (proc.stdout + proc.stderr).splitlines()
                 if "train_inner" in line and '"num_updates"' in line]
        if proc.returncode != 0 or not inner:
            write(out, {"kind": "whole_process", "run": name, "error": (proc.stderr or proc.stdout)[-2000:]})
            continue
        wps = [float(r["wps"]) for r in inner if int(r["num_updates"]) > a.whole_skip]
        losses[name] = {int(r["num_updates"]): float(r["loss"]) for r in inner}
        rec = {"kind": "whole_process", "run": name, "precision": "fp32" if a.cpu else dtype[name][2:],
               "argv": argv[1:], "wall_s": wall,
               "updates": max(losses[name]), "wps_median": statistics.median(wps) if wps else None,
               "wps_min": min(wps) if wps else None, "wps_max": max(wps) if wps else None,
               "wps_intervals": len(wps)}
        if "stock_fairseq_train_fp16" in losses and name != "stock_fairseq_train_fp16":
            ref = losses["stock_fairseq_train_fp16"]
            common = sorted(set(ref) & set(losses[name]))
            rec["max_abs_loss_diff_vs_stock"] = max(abs(ref[u] - losses[name][u]) for u in common)
            rec["loss_diff_updates"] = len(common)
        write(out, rec)
        print(json.dumps(rec), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--data", required=True, help="fairseq-binarized data (train split) with a joined dictionary")
    p.add_argument("--out", required=True, help="JSON lines, appended as each row finishes")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma-separated rows (default: {', '.join(DEFAULT_ROWS)}; also: {', '.join(CROSS_LAYER_ROWS)}, "
                   "which need their references in the same run)")
    p.add_argument("--dtypes", default="bf16,fp16", help="comma-separated precisions of the rows (default: bf16,fp16)")
    p.add_argument("--dtype-rows", default="", help="DTYPE:ROW,ROW;... limits a precision to some rows "
                   "(e.g. 'fp16:transformer,post_ln,transformer_prenorm,pre_ln'); default: every row at every dtype")
    p.add_argument("--tokens", default="4096,16384", help="comma-separated --max-tokens settings (default: 4096,16384)")
    p.add_argument("--tokens-rows", default="", help="TOKENS:ROW,ROW;... limits a token setting to some rows")
    p.add_argument("--no-recipe", action="store_true", help="leave out stock fp16 and the recipes")
    p.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipes measured against stock fp16: "
                   "recipe (bf16 + adam_fused), recipe_compiled (also --compile-layers) (default: both)")
    p.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager", "eager"),
                   help="torch.compile backend of the compiled recipe (default: inductor; the smoke test: eager)")
    p.add_argument("--warmup", type=int, default=20, help="updates before timing, per configuration (default: 20)")
    p.add_argument("--updates", type=int, default=100, help="timed updates per configuration per round (default: 100)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--batches", type=int, default=64, help="distinct training batches, cycled (default: 64)")
    p.add_argument("--matmul-size", type=int, default=8192, help="side of the bf16 products timed for the card's "
                   "rate (default: 8192)")
    p.add_argument("--profile", help="write a torch.profiler summary of one update (stock fp16, the recipes) to this "
                   "JSON file")
    p.add_argument("--whole-process", action="store_true", help="also time whole fairseq-train processes")
    p.add_argument("--whole-runs", default=WHOLE_RUNS, help=f"comma-separated whole-process runs (default: {WHOLE_RUNS})")
    p.add_argument("--whole-timeout", type=float, default=300, help="seconds a whole-process run may take (default: 300)")
    p.add_argument("--whole-updates", type=int, default=300, help="updates per whole-process run (default: 300)")
    p.add_argument("--whole-tokens", type=int, default=4096, help="--max-tokens of the whole-process runs (default: 4096)")
    p.add_argument("--whole-interval", type=int, default=10, help="fairseq's --log-interval in the whole-process runs "
                   "(default: 10; each logged wps and loss covers that many updates)")
    p.add_argument("--whole-skip", type=int, default=20, help="updates left out of the whole-process wps as warm-up "
                   "(default: 20)")
    p.add_argument("--deadline", type=float, default=None, help="seconds after which no new run or round starts "
                   "(the first round of each token setting always runs; default: none)")
    p.add_argument("--smoke", action="store_true", help="tiny model (2+2, d=64) for a quick check")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (with --smoke: the test suite's check; fp32)")
    a = p.parse_args(argv)

    rows = [r for r in a.rows.split(",") if r]
    bad = [r for r in rows if r not in ROWS]
    if bad:
        p.error(f"--rows {','.join(bad)}: unknown; choose from {', '.join(ROWS)}")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if any(d not in ("fp16", "bf16") for d in dtypes):
        p.error(f"--dtypes {a.dtypes}: choose from fp16, bf16")
    try:
        tokens = [int(t) for t in a.tokens.split(",") if t]
    except ValueError:
        p.error(f"--tokens {a.tokens}: comma-separated integers")
    limits = {}
    for spec, kind in ((a.dtype_rows, "dtype"), (a.tokens_rows, "tokens")):
        for part in filter(None, spec.split(";")):
            key, _, names = part.partition(":")
            unknown = [n for n in names.split(",") if n not in ROWS]
            if unknown or not names:
                p.error(f"--{kind}-rows {part}: rows must be among {', '.join(ROWS)}")
            limits[(kind, key)] = names.split(",")
    import torch

    if not a.cpu and not torch.cuda.is_available():
        p.error("no CUDA device here (torch.cuda.is_available() is False): run on a GPU, or --smoke --cpu")
    bad = [r for r in a.recipes.split(",") if r not in RECIPES]
    if bad:
        p.error(f"--recipes {','.join(bad)}: unknown; choose from {', '.join(RECIPES)}")
    if a.cpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        dtypes = ["fp32"]  # bf16 on the CPU is tested in tests/test_bf16.py; timing here is only the smoke check
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + a.deadline if a.deadline is not None else float("inf")

    device = "cpu" if a.cpu else torch.cuda.get_device_name(0)
    env = {"kind": "environment", "device": device, "torch": torch.__version__, "python": platform.python_version(),
           "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "settings": {k: v for k, v in vars(a).items()}}
    import fairseq

    env["fairseq"] = fairseq.__version__
    env.update(matmul_rate(a.cpu, 512 if a.smoke else a.matmul_size))
    write(out, env)
    print(json.dumps(env), flush=True)
    peak = env["bf16_tflops"]

    all_rows = []
    profiles = {}
    for max_tokens in tokens:
        if time.monotonic() > deadline:
            print(f"[gpu_train] deadline: --max-tokens {max_tokens} not started", file=sys.stderr)
            break
        configs = []
        allowed_tokens = limits.get(("tokens", str(max_tokens)), rows)
        for dtype in dtypes:
            allowed = limits.get(("dtype", dtype), rows)
            for name in rows:
                if name in allowed and name in allowed_tokens:
                    configs.append(Config(name, name, dtype))
        if not a.no_recipe:
            configs.append(Config(STOCK, "transformer", "fp32" if a.cpu else "fp16"))
            for name in a.recipes.split(","):
                configs.append(Config(name, "post_ln", "fp32" if a.cpu else "bf16", recipe=RECIPES[name]))
        batches = None

        def failed(c, stage, error):
            """One configuration's failure (a compiler error, say) is recorded and leaves the others."""
            c.trainer = None
            rec = {"kind": "error", "config": c.key, "max_tokens": max_tokens, "stage": stage,
                   "error": f"{type(error).__name__}: {error}"[-2000:]}
            write(out, rec)
            print(json.dumps(rec), file=sys.stderr, flush=True)

        ready = []
        for c in configs:
            try:
                argv_c = train_argv(a.data, ROWS[c.row], c.dtype, max_tokens, c.recipe, a.smoke, a.cpu,
                                    a.compile_backend)
                c.trainer, task, cfg = build_trainer(argv_c)
                if batches is None:
                    batches = training_batches(task, cfg, a.batches)
                c.tokens_per_update = statistics.mean(int(b["ntokens"]) for b in batches)
                first = int(batches[0]["ntokens"])
                c.flops_per_update = count_flops(c.trainer, batches[0]) * c.tokens_per_update / first
                synchronize(a.cpu)
                t0 = time.perf_counter()
                run_updates(c.trainer, batches, 0, a.warmup)  # warm-up (and any compilation)
                synchronize(a.cpu)
                c.warmup_s = time.perf_counter() - t0
                ready.append(c)
            except Exception as e:  # noqa: BLE001 (recorded, and the run goes on)
                failed(c, "build and warm-up", e)
        configs = ready
        graphs_after_warmup = compiled_graphs()
        if a.profile and max_tokens == tokens[0]:
            for c in configs:
                if c.name == STOCK or c.name in RECIPES:
                    try:
                        profiles[c.key] = profile_update(c.trainer, batches, a.cpu)
                    except Exception as e:  # noqa: BLE001
                        profiles[c.key] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
        for rnd in range(a.rounds):
            if time.monotonic() > deadline and rnd > 0:
                print(f"[gpu_train] deadline: stopped after {rnd} rounds at --max-tokens {max_tokens}", file=sys.stderr)
                break
            order = configs if rnd % 2 == 0 else list(reversed(configs))
            for c in order:
                if c.trainer is None:
                    continue
                try:
                    synchronize(a.cpu)
                    t0 = time.perf_counter()
                    tok = run_updates(c.trainer, batches, a.warmup + rnd * a.updates, a.updates)
                    synchronize(a.cpu)
                    c.samples.append((time.perf_counter() - t0, tok))
                except Exception as e:  # noqa: BLE001
                    failed(c, f"round {rnd + 1}", e)
        rows_here = summarize(configs, max_tokens, peak)
        graphs_at_end = compiled_graphs()
        for rec in rows_here:
            rec["device"] = device
            # torch.compile graphs made by then (all configurations): equal = none compiled while timed
            rec["compiled_graphs_after_warmup"], rec["compiled_graphs_at_end"] = graphs_after_warmup, graphs_at_end
            write(out, rec)
        all_rows += rows_here
        for c in configs:  # free this token setting's models before the next
            c.trainer = None
        if not a.cpu:
            torch.cuda.empty_cache()
    if a.profile:
        Path(a.profile).write_text(json.dumps({"device": device, "profiles": profiles}, indent=1))
    if a.whole_process:
        whole_process(a, out, deadline)
    print(markdown(all_rows))
    print(f"[gpu_train] {time.monotonic() - start:.0f} s; rows in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
