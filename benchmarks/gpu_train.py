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
  which includes any compilation; the first configuration of each precision and each
  compiled one run every batch once, so that no timed round meets a batch shape first),
  then timed ``--updates`` updates at a time with
  ``torch.cuda.synchronize()`` before and after, once per round; within a round the
  configurations run interleaved, the order reversed every other round; ``--rounds``
  rounds; a row reports the median tokens/s with min and max, and its ratio to its
  reference as the median (min-max) of the per-round ratios (each round's values kept);
* model FLOPs per update are counted with ``torch.utils.flop_counter`` over one forward
  and backward of the first batch (matrix products and attention; what the matrix units
  do) and reported as a fraction of the card's matrix rate in the dtype the row trained in
  (MFU: bf16 rows against bf16 products, fp16 against fp16, the CPU's fp32 smoke run against
  fp32), measured by this script (``--matmul-size`` cubed products), and as the ratio each
  row's FLOPs predict;
* ``--profile FILE``: a torch.profiler trace summary of one update (top kernels, kernel
  launches, host-device synchronisations) of the stock fp16 row and of the recipes, and
  the Python lines where an update reads tensor values on the host (``host_reads``: on
  a GPU, where its synchronisations come from);
* ``--whole-process``: complete ``fairseq-train`` runs, stock (``--arch transformer
  --fp16``) against ``--user-dir resnmt --arch transformer_postln_base --fp16`` and the
  recipe through resnmt-train (also with ``--sdpa-backends flash,efficient,math``),
  fairseq's own ``wps`` parsed from its json log (the median over the logged intervals,
  and separately over the first epoch, where every batch shape is new, and the later
  ones) and the per-update losses compared.

Rows are written to ``--out`` as JSON lines after every round (the line with the most
rounds of a job counts; make_tables.py), the profile as soon as it is taken; the markdown
table goes to stdout. ``--deadline S`` stops starting new work after S seconds and fits the
timed updates per round to the time left (each phase writes what it finished).
``--smoke`` is the CPU check the test suite runs: 2+2 layers, d=64, a few updates, fp32
timing.

    python benchmarks/gpu_train.py --data .gpu/multi30k/bin --out $OUT/gpu_train.jsonl \\
        --profile $OUT/profile.json --whole-process          # on the GPU (benchmarks/gpu_job.sh)
    python benchmarks/gpu_train.py --smoke --cpu --data DIR --out /tmp/x.jsonl
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from common import CONFIGS, Comparison, fairseq_argv, judge_training  # noqa: E402
from fairseq_trainer import (build_trainer, compiled_graphs, count_flops, peak_rates, profile_update,  # noqa: E402
                             run_updates, synchronize, training_batches)
from result_tables import gpu_training_table  # noqa: E402

from resnmt.experiment.presets import SIZES, ModelSize  # noqa: E402
from resnmt.experiment.runtime import USER_DIR  # noqa: E402
from resnmt.experiment.steps import FairseqLog  # noqa: E402
from resnmt.shared import append_jsonl  # noqa: E402

BENCHMARK = "gpu_train"  # every line's "benchmark" (benchmarks/results/gpu_train.jsonl, make_tables.py)


# The rows: a config of common.CONFIGS against its reference row, and the ratio to reach
# (a same-math pair: a band; SAS: a fraction of the ratio its FLOPs predict)
ROWS: Dict[str, Comparison] = {
    "transformer": Comparison("transformer"),
    "post_ln": Comparison("post_ln", "transformer", band=(0.98, 1.02)),
    "transformer_prenorm": Comparison("transformer_prenorm"),
    "pre_ln": Comparison("pre_ln", "transformer_prenorm", band=(0.98, 1.02)),
    "xskip_ln": Comparison("xskip_ln2", "transformer", train=0.97),
    "rskip_ln": Comparison("rskip_ln2", "transformer", train=0.97),
    "deepnorm": Comparison("deepnorm", "transformer", train=0.97),
    "admin": Comparison("admin", "transformer", train=0.97),
    "rezero": Comparison("rezero", "transformer", train=0.97),
    "sas": Comparison("sas", "transformer", flops=0.95),  # the paper's gate
    "sas_gate64": Comparison("sas_gate64", "transformer", flops=0.95),
    "highway": Comparison("highway", "transformer", flops=0.95),  # a gate per sublayer
    "swish": Comparison("swish"),  # plain Swish (fairseq 0.12 has no swish --activation-fn)
    "nswish": Comparison("nswish", "swish", train=0.95),
    "nrelu": Comparison("nrelu", "transformer", train=0.95),
}
# The methods that cross layers, Peri-LN and the normalizations: measured on their own
# (gpu_job.sh part 4, --rows), not by default, so that the rows above keep their rounds in
# a lease. Targets set by analogy before measuring: B2T and ResiDual add sums, DLCL and
# Peri-LN a weighted sum or a LayerNorm per sublayer, RMSNorm and DyT replace a LayerNorm.
CROSS_LAYER_ROWS: Dict[str, Comparison] = {
    "peri_ln": Comparison("peri_ln", "transformer_prenorm", train=0.93),
    "b2t": Comparison("b2t", "transformer", train=0.97),
    "resi_dual": Comparison("resi_dual", "transformer", train=0.97),
    "dlcl": Comparison("dlcl", "transformer_prenorm", train=0.93),
    "dlcl_post": Comparison("dlcl_post", "transformer", train=0.93),
    "pre_ln_rms_norm": Comparison("pre_ln_rms_norm", "pre_ln", train=0.97),
    "post_ln_rms_norm": Comparison("post_ln_rms_norm", "post_ln", train=0.97),
    "pre_ln_dyt": Comparison("pre_ln_dyt", "pre_ln", train=0.97),
    "post_ln_dyt": Comparison("post_ln_dyt", "post_ln", train=0.97),
    # the 2025 kinds (issue 44), targets by analogy as in speed.py; mix_ln and hybrid_norm
    # against pre-LN here (post-LN's row, transformer, is in the same part)
    "hyper": Comparison("hyper", "transformer_prenorm", train=0.80),
    "mhc": Comparison("mhc", "transformer_prenorm", train=0.70),
    "mix_ln": Comparison("mix_ln", "transformer_prenorm", train=0.98),
    "ln_scaling": Comparison("ln_scaling", "transformer_prenorm", train=0.97),
    "hybrid_norm": Comparison("hybrid_norm", "transformer_prenorm", train=0.90),
    "denseformer": Comparison("denseformer", "transformer_prenorm", train=0.93),
}
DEFAULT_ROWS = tuple(ROWS)
ROWS.update(CROSS_LAYER_ROWS)
# the recipe: resnmt-train --bf16 --optimizer adam_fused (and --compile-layers), against
# stock fairseq-train --fp16 with fairseq's adam
RECIPE_FLAGS = ("--optimizer", "adam_fused")
RESNMT_TASK = ("--task", "resnmt_translation")
COMPILE_FLAGS = RESNMT_TASK + ("--compile-layers",)
# the lever for an update waiting on cuDNN's attention plans for each new batch shape
# (Hopper's default attention kernel; resnmt/training/attention.py)
FLASH_FLAGS = RESNMT_TASK + ("--sdpa-backends", "flash,efficient,math")
# the lever for the per-parameter copies (533 kernels of the recipe's 1,470 on the H200) and
# bf16 zeroings of fairseq's master weights (resnmt/training/master_sync.py)
FUSED_SYNC_FLAGS = RESNMT_TASK + ("--fused-master-weights",)
STOCK = "stock_fp16"
# the next lever for an update bound by launching kernels: each compiled layer replayed as a
# CUDA graph, batch lengths bucketed to multiples of 8 so that fewer shapes are recorded
GRAPH_FLAGS = ("--compile-mode", "reduce-overhead", "--required-seq-len-multiple", "8")
RECIPES = {"recipe": RECIPE_FLAGS, "recipe_compiled": RECIPE_FLAGS + COMPILE_FLAGS,
           "recipe_graphs": RECIPE_FLAGS + COMPILE_FLAGS + GRAPH_FLAGS, "recipe_flash": RECIPE_FLAGS + FLASH_FLAGS,
           "recipe_fused": RECIPE_FLAGS + FUSED_SYNC_FLAGS}
DEFAULT_RECIPES = "recipe,recipe_compiled"
RECIPE_TARGET = Comparison("post_ln", STOCK, times=3.0)
# whole fairseq-train processes: name -> (the program's module, its model flags); the
# precision is the name's last word
RESNMT_POST_LN = ("--user-dir", str(USER_DIR), "--arch", "transformer_postln_base")
WHOLE_PROCESSES = {
    "stock_fairseq_train_fp16": ("fairseq_cli.train", ("--arch", "transformer")),
    "resnmt_postln_fp16": ("fairseq_cli.train", RESNMT_POST_LN),
    "resnmt_train_recipe_bf16": ("resnmt.cli.train", RESNMT_POST_LN + RECIPES["recipe"]),
    "resnmt_train_recipe_compiled_bf16": ("resnmt.cli.train", RESNMT_POST_LN + RECIPES["recipe_compiled"]),
    "resnmt_train_recipe_flash_bf16": ("resnmt.cli.train", RESNMT_POST_LN + RECIPES["recipe_flash"]),
}
WHOLE_RUN_NAMES = tuple(WHOLE_PROCESSES)
WHOLE_RUNS = ",".join(WHOLE_RUN_NAMES[:4])
SMOKE_SIZE = ModelSize(2, 64, 256, 4)
# fairseq-train's settings of every configuration (beside common.fairseq_argv's)
TRAINING_FLAGS = ("--task", "translation", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
                  "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--num-workers", "0",
                  "--no-progress-bar", "--log-format", "json")


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
    warmup_updates: int = 0
    samples: list = field(default_factory=list)  # (seconds, target tokens) per round

    @property
    def key(self):
        return f"{self.name}/{self.dtype}"


def train_argv(data, row: Comparison, dtype: str, max_tokens: int, recipe: tuple, smoke: bool, cpu: bool,
               compile_backend: str = "inductor") -> List[str]:
    """fairseq-train's command line (without the program) of ``row`` at the papers' base
    size (6+6 layers, d=512, FFN 2048, 8 heads; ``smoke``: 2+2, d=64), in ``dtype``."""
    argv = [*fairseq_argv(data, row.config, SMOKE_SIZE if smoke else SIZES["base"], max_tokens), *TRAINING_FLAGS]
    if dtype in ("fp16", "bf16"):
        argv.append(f"--{dtype}")
    argv += list(recipe)
    if "--compile-layers" in recipe:
        argv += ["--compile-backend", compile_backend]
        if compile_backend != "inductor" and "--compile-mode" in argv:  # the rehearsal's backend takes no mode
            i = argv.index("--compile-mode")
            del argv[i:i + 2]
    if cpu:
        argv.append("--cpu")
    return argv


def process_wide(c: Config, torch_default_kernels) -> None:
    """Set the switches that resnmt's task flags set for the whole process
    (``--sdpa-backends``, ``--fused-master-weights``) as configuration ``c``'s parsed task
    asks, before anything of ``c`` runs: configurations share this process, and each must
    run as its own command line would, not with what the last one built left behind."""
    from resnmt.training import master_sync
    from resnmt.training.attention import use_sdpa_backends

    cfg = c.trainer.task.cfg  # fairseq's translation task has neither flag: torch's defaults
    kernels = getattr(cfg, "sdpa_backends", "")
    use_sdpa_backends(kernels.split(",") if kernels else torch_default_kernels)
    if getattr(cfg, "fused_master_weights", False):
        master_sync.install()
    else:
        master_sync.uninstall()


def median_min_max(values):
    return statistics.median(values), min(values), max(values)


def summarize(configs: List[Config], tokens_setting: int, peak_tflops: Dict[str, float]) -> List[dict]:
    """A record per configuration: tokens/s median (min-max), ratio to its reference, and
    MFU against ``peak_tflops`` of the dtype the configuration trained in."""
    by_key = {c.key: c for c in configs}
    rows = []
    for c in configs:
        rates = [tok / sec for sec, tok in c.samples]
        if not rates:
            continue
        med, lo, hi = median_min_max(rates)
        per_update = statistics.median(sec / (tok / c.tokens_per_update) for sec, tok in c.samples) \
            if c.tokens_per_update else None
        arch, flags = CONFIGS[ROWS[c.row].config]
        rec = {"kind": "row", "config": c.name, "dtype": c.dtype, "max_tokens": tokens_setting,
               "arch": arch, "flags": list(flags) + list(c.recipe),
               "rounds": len(rates), "tokens_per_s": med, "tokens_per_s_min": lo, "tokens_per_s_max": hi,
               "spread": (hi - lo) / med, "tokens_per_s_rounds": rates,
               "target_tokens_rounds": [tok for _, tok in c.samples],  # the same batches for all, round by round
               "target_tokens_per_update": c.tokens_per_update,
               "flops_per_update": c.flops_per_update, "warmup_s": c.warmup_s, "warmup_updates": c.warmup_updates}
        peak = peak_tflops.get(c.dtype)
        if peak and per_update:
            rec.update(mfu=c.flops_per_update / per_update / (peak * 1e12), peak_dtype=c.dtype, peak_tflops=peak)
        ref = by_key.get(reference_of(c, configs))
        if ref is not None and ref is not c and len(ref.samples) == len(c.samples):
            ratios = [(tok / sec) / (rt / rs) for (sec, tok), (rs, rt) in zip(c.samples, ref.samples)]
            r_med, r_lo, r_hi = median_min_max(ratios)
            rec.update(reference=ref.key, ratio=r_med, ratio_min=r_lo, ratio_max=r_hi, ratio_rounds=ratios)
            if len(ratios) >= 4:  # the middle half of the rounds: what one drifting round cannot move
                q1, _, q3 = statistics.quantiles(ratios, n=4)
                rec.update(ratio_q1=q1, ratio_q3=q3)
            if c.flops_per_update and ref.flops_per_update:
                rec["flops_ratio"] = ref.flops_per_update / c.flops_per_update  # the speed ratio FLOPs predict
            rec.update(judge_training(RECIPE_TARGET if c.name in RECIPES else ROWS[c.row], rec))
        rows.append(rec)
    return rows


def reference_of(c: Config, configs: List[Config]) -> Optional[str]:
    if c.name in RECIPES:
        return next((s.key for s in configs if s.name == STOCK), None)
    ref = ROWS[c.row].reference
    return f"{ref}/{c.dtype}" if ref else None


def whole_process(a, out: Path, deadline: float, env: dict):
    """fairseq-train processes, stock against resnmt: fairseq's own wps from its json log."""
    losses = {}
    # fairseq-train makes its --save-dir even with --no-save: a scratch one, not ./checkpoints
    with tempfile.TemporaryDirectory(prefix="gpu_train-") as scratch:
        for name in a.whole_runs.split(","):  # in the order given
            module, flags = WHOLE_PROCESSES[name]
            if "--compile-layers" in flags:
                flags += ("--compile-backend", a.compile_backend)
            cmd = [sys.executable, "-m", module, *flags]
            if time.monotonic() > deadline:
                print(f"[gpu_train] deadline: whole-process run {name} not started", file=sys.stderr)
                break
            argv = [*cmd, str(a.data), "--share-all-embeddings", "--dropout", "0.1", "--criterion",
                    "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
                    "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt",
                    "--warmup-updates", "4000", "--max-tokens", str(a.whole_tokens), "--seed", "1",
                    "--max-update", str(a.whole_updates), "--log-interval", str(a.whole_interval),
                    "--log-format", "json",
                    "--no-progress-bar", "--disable-validation", "--no-save", "--num-workers", "0",
                    "--save-dir", scratch]
            if "--optimizer" in flags:  # the recipe's adam_fused replaces adam
                i = argv.index("--optimizer", argv.index(str(a.data)))
                del argv[i:i + 2]
            argv += SMOKE_SIZE.fairseq_flags() if a.smoke else []
            precision = name.rsplit("_", 1)[1]
            argv += ["--cpu"] if a.cpu else [f"--{precision}"]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=a.whole_timeout,
                                      env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                          [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])))
            except subprocess.TimeoutExpired:
                record(out, {"kind": "whole_process", "run": name, "error": f"timed out after {a.whole_timeout} s"})
                continue
            wall = time.perf_counter() - t0
            inner = [r for r in FairseqLog.parse(proc.stdout + proc.stderr).inner if "num_updates" in r]
            if proc.returncode != 0 or not inner:
                record(out, {"kind": "whole_process", "run": name, "error": (proc.stderr or proc.stdout)[-2000:]})
                continue
            # fairseq's own per-interval figures after the warm-up: train_wall (time inside
            # train_step) against wall says whether the time goes to the update or around it;
            # the epoch, because the first meets every batch shape for the first time
            intervals = [{"num_updates": int(r["num_updates"]),
                          **{k: float(r[k]) for k in ("epoch", "loss", "wps", "ups", "wpb", "train_wall", "wall")
                             if k in r}}
                         for r in inner if int(r["num_updates"]) > a.whole_skip]
            wps = [i["wps"] for i in intervals]
            by_epoch = {"first_epoch": [i["wps"] for i in intervals if i.get("epoch") == 1],
                        "later_epochs": [i["wps"] for i in intervals if i.get("epoch", 1) > 1]}
            losses[name] = {int(r["num_updates"]): float(r["loss"]) for r in inner}
            rec = {"kind": "whole_process", "run": name, "device": env["device"], "job": env["time"],
                   "precision": "fp32" if a.cpu else precision,
                   "argv": argv[1:], "wall_s": wall,
                   "updates": max(losses[name]), "wps_median": statistics.median(wps) if wps else None,
                   "wps_min": min(wps) if wps else None, "wps_max": max(wps) if wps else None,
                   "wps_intervals": len(wps), "intervals": intervals,
                   **{f"wps_median_{part}": statistics.median(v) if v else None for part, v in by_epoch.items()},
                   **{f"wps_intervals_{part}": len(v) for part, v in by_epoch.items()}}
            if "stock_fairseq_train_fp16" in losses and name != "stock_fairseq_train_fp16":
                ref = losses["stock_fairseq_train_fp16"]
                common = sorted(set(ref) & set(losses[name]))
                rec["max_abs_loss_diff_vs_stock"] = max(abs(ref[u] - losses[name][u]) for u in common)
                rec["loss_diff_updates"] = len(common)
            record(out, rec)
            print(json.dumps(rec), flush=True)


def parser() -> argparse.ArgumentParser:
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
    p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes measured against stock fp16: "
                   "recipe (bf16 + adam_fused), recipe_compiled (also --compile-layers), recipe_graphs (also "
                   "--compile-mode reduce-overhead: CUDA graphs), recipe_flash (the recipe with --sdpa-backends "
                   "flash,efficient,math), recipe_fused (the recipe with --fused-master-weights) "
                   f"(default: {DEFAULT_RECIPES})")
    p.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager", "eager"),
                   help="torch.compile backend of the compiled recipe (default: inductor; the smoke test: eager)")
    p.add_argument("--warmup", type=int, default=20, help="updates before timing, per configuration (default: 20)")
    p.add_argument("--updates", type=int, default=100, help="timed updates per configuration per round (default: 100)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--batches", type=int, default=64, help="distinct training batches, cycled (default: 64)")
    p.add_argument("--matmul-size", type=int, default=8192, help="side of the products timed for the card's "
                   "rate in each dtype measured (default: 8192)")
    p.add_argument("--profile", help="write a torch.profiler summary of one update (stock fp16, the recipes) to this "
                   "JSON file")
    p.add_argument("--whole-process", action="store_true", help="also time whole fairseq-train processes")
    p.add_argument("--whole-runs", default=WHOLE_RUNS, help=f"comma-separated whole-process runs, of "
                   f"{', '.join(WHOLE_RUN_NAMES)} (default: {WHOLE_RUNS})")
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
    return p


def parse(argv=None):
    """``(a, rows, dtypes, tokens, limits)``: the command line, checked (a bad value: one
    error line, exit status 2); ``limits``: {("dtype" or "tokens", value): rows}."""
    p = parser()
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
    bad = [r for r in a.whole_runs.split(",") if r not in WHOLE_RUN_NAMES]
    if bad:
        p.error(f"--whole-runs {','.join(bad)}: unknown; choose from {', '.join(WHOLE_RUN_NAMES)}")
    if a.cpu:
        dtypes = ["fp32"]  # bf16 on the CPU is tested in tests/test_bf16.py; timing here is only the smoke check
    return a, rows, dtypes, tokens, limits


def configs_at(a, max_tokens: int, rows, dtypes, limits) -> List[Config]:
    """The configurations measured at ``max_tokens``: each row at each precision (within
    ``limits``), then stock fp16 and the recipes."""
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
    return configs


def record(out: Path, rec: dict):
    """Append one line to ``--out``, tagged as this benchmark's."""
    append_jsonl(out, {"benchmark": BENCHMARK, **rec})


def fit_updates(a, configs: List[Config], deadline: float) -> int:
    """Timed updates per configuration per round so that ``--rounds`` rounds of every
    configuration end before ``deadline``, at most ``--updates`` and at least 10 (the
    first round always runs): each update is priced at the median warm-up update (a warm-up
    update is slower than a timed one, so this errs on the short side)."""
    if deadline == float("inf") or not configs:
        return a.updates
    per_update = statistics.median(c.warmup_s / max(c.warmup_updates, 1) for c in configs)
    left = deadline - time.monotonic()
    fits = int(left / (a.rounds * len(configs) * per_update)) if per_update > 0 else a.updates
    updates = max(min(a.updates, fits), min(10, a.updates))
    if updates < a.updates:
        print(f"[gpu_train] {1e3 * per_update:.0f} ms per warm-up update, {left:.0f} s left: {updates} timed updates "
              f"per configuration per round (of --updates {a.updates})", file=sys.stderr, flush=True)
    return updates


def measure_setting(a, max_tokens: int, configs: List[Config], out: Path, deadline: float, env: dict,
                    profile_path: Optional[Path]) -> List[dict]:
    """Build and warm up ``configs`` at ``max_tokens``, profile one update of stock fp16
    and the recipes into ``profile_path`` (when given; written at once), time the
    interleaved rounds; after each round the rows so far (MFU against the card's measured
    rate) are appended to ``out`` (a later line of the same job and configuration holds
    more rounds), so that a job stopped from outside keeps its finished rounds.
    A configuration that fails (a compiler error, say) is recorded and leaves the others;
    one not started by the deadline is recorded as such."""
    batches = None

    def failed(c, stage, error):
        c.trainer = None
        rec = {"kind": "error", "config": c.key, "max_tokens": max_tokens, "stage": stage,
               "error": f"{type(error).__name__}: {error}"[-2000:]}
        record(out, rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)

    from resnmt.training.attention import sdpa_backends_enabled

    default_kernels = sdpa_backends_enabled()
    ready, shapes_seen = [], set()
    for c in configs:
        if time.monotonic() > deadline:
            failed(c, "build", TimeoutError("the deadline passed before it was built"))
            continue
        try:
            argv_c = train_argv(a.data, ROWS[c.row], c.dtype, max_tokens, c.recipe, a.smoke, a.cpu, a.compile_backend)
            c.trainer, task, cfg = build_trainer(argv_c)
            process_wide(c, default_kernels)
            if batches is None:
                batches = training_batches(task, cfg, a.batches)
            c.tokens_per_update = statistics.mean(int(b["ntokens"]) for b in batches)
            first = int(batches[0]["ntokens"])
            c.flops_per_update = count_flops(c.trainer, batches[0]) * c.tokens_per_update / first
            # warm-up (and any compilation); the first configuration of each precision, and
            # each compiled one, runs every batch once, so that no timed round is the first to
            # meet a batch shape (cuDNN's attention plans each new shape, the GPU libraries
            # load kernels lazily, a compiled layer may specialise and a CUDA graph is
            # recorded per shape)
            every_shape = c.dtype not in shapes_seen or "--compile-layers" in c.recipe
            c.warmup_updates = max(a.warmup, len(batches)) if every_shape else a.warmup
            synchronize(a.cpu)
            t0 = time.perf_counter()
            run_updates(c.trainer, batches, 0, c.warmup_updates)
            synchronize(a.cpu)
            c.warmup_s = time.perf_counter() - t0
            shapes_seen.add(c.dtype)
            ready.append(c)
        except Exception as e:  # noqa: BLE001 (recorded, and the run goes on)
            failed(c, "build and warm-up", e)
    configs = ready
    graphs_after_warmup = compiled_graphs()
    if profile_path is not None:
        profiles = {}
        for c in configs:
            if c.name == STOCK or c.name in RECIPES:
                try:
                    process_wide(c, default_kernels)
                    profiles[c.key] = profile_update(c.trainer, batches, a.cpu)
                except Exception as e:  # noqa: BLE001
                    profiles[c.key] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
        profile_path.write_text(json.dumps({"device": env["device"], "max_tokens": max_tokens,
                                            "profiles": profiles}, indent=1))
    updates = fit_updates(a, configs, deadline)
    rows = []
    for rnd in range(a.rounds):
        order = configs if rnd % 2 == 0 else list(reversed(configs))
        timed = {}
        for c in order:
            if rnd > 0 and time.monotonic() > deadline:
                break
            if c.trainer is None:
                continue
            try:
                process_wide(c, default_kernels)
                synchronize(a.cpu)
                t0 = time.perf_counter()
                # every configuration trains the same batches in a round, whatever its warm-up
                tok = run_updates(c.trainer, batches, a.warmup + rnd * updates, updates)
                synchronize(a.cpu)
                timed[c.key] = (time.perf_counter() - t0, tok)
            except Exception as e:  # noqa: BLE001
                failed(c, f"round {rnd + 1}", e)
        if len(timed) < sum(c.trainer is not None for c in configs):  # the deadline cut this round short
            print(f"[gpu_train] deadline: stopped after {rnd} rounds at --max-tokens {max_tokens}", file=sys.stderr)
            break
        for c in configs:
            if c.key in timed:
                c.samples.append(timed[c.key])
        rows = summarize(configs, max_tokens, env["peak_tflops"])
        graphs_now = compiled_graphs()
        for rec in rows:
            # torch.compile graphs made by then (all configurations): equal = none compiled while timed
            rec.update(job=env["time"], device=env["device"], updates_per_round=updates,
                       compiled_graphs_after_warmup=graphs_after_warmup, compiled_graphs_at_end=graphs_now)
            record(out, rec)
    for c in configs:  # free this token setting's models before the next
        c.trainer = None
    return rows


def main(argv=None):
    a, rows, dtypes, tokens, limits = parse(argv)
    import fairseq
    import torch

    if a.cpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + a.deadline if a.deadline is not None else float("inf")

    device = "cpu" if a.cpu else torch.cuda.get_device_name(0)
    env = {"kind": "environment", "device": device, "torch": torch.__version__, "python": platform.python_version(),
           "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "settings": dict(vars(a)), "fairseq": fairseq.__version__}
    # the peak of each dtype that will train (the smoke test: fp32 on the CPU)
    trained = sorted({c.dtype for t in tokens for c in configs_at(a, t, rows, dtypes, limits)})
    env.update(peak_rates(a.cpu, 512 if a.smoke else a.matmul_size, trained))
    record(out, env)
    print(json.dumps(env), flush=True)

    all_rows = []
    for max_tokens in tokens:
        if time.monotonic() > deadline:
            print(f"[gpu_train] deadline: --max-tokens {max_tokens} not started", file=sys.stderr)
            break
        configs = configs_at(a, max_tokens, rows, dtypes, limits)
        all_rows += measure_setting(a, max_tokens, configs, out, deadline, env,
                                    Path(a.profile) if a.profile and max_tokens == tokens[0] else None)
        if not a.cpu:
            torch.cuda.empty_cache()
    if a.whole_process:
        whole_process(a, out, deadline, env)
    print(gpu_training_table(all_rows))
    print(f"[gpu_train] {time.monotonic() - start:.0f} s; rows in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
