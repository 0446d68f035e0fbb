"""What the speed benchmarks measure, each named once (the rows the study trains are
campaign.rows'): the measured model configurations (``CONFIGS``: what speed.py, gpu_train.py and
profile_ops.py build), fairseq's command line of each, and the rows each of speed.py
(``SPEED_ROWS``) and gpu_train.py (``TRAINER_ROWS``, its recipes and whole processes)
compares with a reference.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from resnmt.experiment.presets import ModelSize
from resnmt.experiment.runtime import USER_DIR


# ------------------------------------------------------------------- the measured configurations

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
    # --fused-connections: SAS's combination and NReLU/NSwish compiled (resnmt/training/compile.py)
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
    """A config of ``CONFIGS`` (or a run of ``WHOLE_PROCESSES``) measured against its
    reference, and the ratios to the reference it should reach (None: no fixed target)."""

    config: str
    reference: Optional[str] = None  # None: a reference itself
    train: Optional[float] = None  # training throughput over the reference's, at least
    decode: Optional[float] = None  # decoding throughput over the reference's, at least
    memory: Optional[float] = None  # peak memory over the reference's, at most
    flops: Optional[float] = None  # training ratio: at least this fraction of the one its FLOPs predict
    band: Optional[Tuple[float, float]] = None  # same-math pairs: the training ratio lies in this band
    times: Optional[float] = None  # training ratio: at least this many times the reference's


def fairseq_argv(data, config, size, max_tokens) -> List[str]:
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


# speed.py's rows: a config against its reference, the train, decode and memory targets
SPEED_ROWS: Dict[str, Comparison] = {
    "post_ln": Comparison("post_ln", "transformer", 0.98, 0.98, 1.05),
    "pre_ln": Comparison("pre_ln", "transformer_prenorm", 0.98, 0.98, 1.05),
    "xskip_ln (λ=2)": Comparison("xskip_ln2", "transformer", 0.97, 0.97, 1.05),
    "rskip_ln (λ=2)": Comparison("rskip_ln2", "transformer", 0.93, 0.93, 1.05),
    "sas (gate h)": Comparison("sas", "transformer", None, None, None),
    "sas (gate 64)": Comparison("sas_gate64", "transformer", 0.90, 0.90, None),
    "highway": Comparison("highway", "transformer", None, None, 1.05),
    # targets by analogy (set before measuring): deepnorm and admin cost what xskip_ln costs
    # (plus a per-dimension multiply for admin); rezero is post-LN's work without the LayerNorm
    "deepnorm": Comparison("deepnorm", "transformer", 0.97, 0.97, 1.05),
    "admin": Comparison("admin", "transformer", 0.97, 0.97, 1.05),
    "rezero": Comparison("rezero", "transformer", 0.98, 0.98, 1.05),
    "nswish vs swish": Comparison("nswish", "swish", 0.93, 0.93, 1.05),
    "nrelu vs relu": Comparison("nrelu", "post_ln", 0.93, 0.93, 1.05),
    # the targets set for --fused-connections (SAS with the paper's gate: >= 1.0 of
    # its MAC prediction, reported as sas_overhead.measured_over_predicted)
    "sas (gate h) fused": Comparison("sas_fused", "transformer", None, None, None),
    "sas (gate 64) fused": Comparison("sas_gate64_fused", "transformer", 0.86, None, None),
    "nswish vs swish (fused)": Comparison("nswish_fused", "swish", 0.97, 0.95, 1.05),
    "nrelu vs relu (fused)": Comparison("nrelu_fused", "post_ln", 0.97, 0.95, 1.05),
    # targets by analogy, set before measuring: B2T adds one sum per layer; ResiDual one sum
    # per sublayer and a final LN; Peri-LN one LN per sublayer over pre-LN; DLCL a weighted
    # sum of up to N+1 tensors and an LN per layer; RMSNorm and DyT do what a LayerNorm does
    "peri_ln": Comparison("peri_ln", "transformer_prenorm", 0.93, 0.93, 1.05),
    "b2t": Comparison("b2t", "transformer", 0.98, 0.98, 1.05),
    "resi_dual": Comparison("resi_dual", "transformer", 0.97, 0.97, 1.05),
    "dlcl": Comparison("dlcl", "transformer_prenorm", 0.93, 0.93, 1.05),
    "dlcl_post": Comparison("dlcl_post", "transformer", 0.93, 0.93, 1.05),
    "pre_ln + rms_norm": Comparison("pre_ln_rms_norm", "pre_ln", 0.98, 0.98, 1.05),
    "post_ln + rms_norm": Comparison("post_ln_rms_norm", "post_ln", 0.98, 0.98, 1.05),
    "pre_ln + dyt": Comparison("pre_ln_dyt", "pre_ln", 0.98, 0.98, 1.05),
    "post_ln + dyt": Comparison("post_ln_dyt", "post_ln", 0.98, 0.98, 1.05),
    # the 2025 kinds; targets by analogy, set before measuring: hyper and mhc
    # carry n = 4 streams (a mix of n+1 by n per sublayer; mhc adds a (nC, n²+2n) projection
    # and 20 Sinkhorn iterations per position), memory for the n-wide activations; mix_ln
    # and ln_scaling are pre-LN's work; hybrid_norm adds three per-head norms per attention
    # and one LN per FFN; denseformer a weighted sum of up to N+1 tensors per layer
    "hyper": Comparison("hyper", "transformer_prenorm", 0.80, 0.85, 1.30),
    "mhc": Comparison("mhc", "transformer_prenorm", 0.70, 0.75, 1.35),
    "ln_scaling": Comparison("ln_scaling", "transformer_prenorm", 0.97, 0.97, 1.05),
    "denseformer": Comparison("denseformer", "transformer_prenorm", 0.93, 0.93, 1.05),
    "mix_ln vs post_ln": Comparison("mix_ln", "transformer", 0.97, 0.97, 1.05),
    "mix_ln vs pre_ln": Comparison("mix_ln", "transformer_prenorm", 0.98, 0.98, 1.05),
    "hybrid_norm vs post_ln": Comparison("hybrid_norm", "transformer", 0.90, 0.90, 1.10),
    "hybrid_norm vs pre_ln": Comparison("hybrid_norm", "transformer_prenorm", 0.90, 0.90, 1.10),
}


# gpu_train.py's rows: a config of CONFIGS against its reference row, and the ratio to reach
# (a same-math pair: a band; SAS: a fraction of the ratio its FLOPs predict)
TRAINER_ROWS: Dict[str, Comparison] = {
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
    # the 2025 kinds, targets by analogy as in speed.py; mix_ln and hybrid_norm
    # against pre-LN here (post-LN's row, transformer, is in the same part)
    "hyper": Comparison("hyper", "transformer_prenorm", train=0.80),
    "mhc": Comparison("mhc", "transformer_prenorm", train=0.70),
    "mix_ln": Comparison("mix_ln", "transformer_prenorm", train=0.98),
    "ln_scaling": Comparison("ln_scaling", "transformer_prenorm", train=0.97),
    "hybrid_norm": Comparison("hybrid_norm", "transformer_prenorm", train=0.90),
    "denseformer": Comparison("denseformer", "transformer_prenorm", train=0.93),
}
TRAINER_DEFAULT_ROWS = tuple(TRAINER_ROWS)
TRAINER_ROWS.update(CROSS_LAYER_ROWS)
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
RESNMT_POST_LN_BIG = ("--user-dir", str(USER_DIR), "--arch", "transformer_postln_big")
# the fast path (resnmt/training/fast/): static-shape buckets, the update without host
# syncs, each step captured as a CUDA graph per shape (--no-step-capture: the steps eagerly)
FAST_FLAGS = RECIPE_FLAGS + RESNMT_TASK + ("--fast-path",)
STOCK_RUN, STOCK_BIG_RUN = "stock_fairseq_train_fp16", "stock_fairseq_train_big_fp16"
WHOLE_PROCESSES = {
    STOCK_RUN: ("fairseq_cli.train", ("--arch", "transformer")),
    "resnmt_postln_fp16": ("fairseq_cli.train", RESNMT_POST_LN),
    "resnmt_train_recipe_bf16": ("resnmt.cli.train", RESNMT_POST_LN + RECIPES["recipe"]),
    "resnmt_train_recipe_compiled_bf16": ("resnmt.cli.train", RESNMT_POST_LN + RECIPES["recipe_compiled"]),
    "resnmt_train_recipe_flash_bf16": ("resnmt.cli.train", RESNMT_POST_LN + RECIPES["recipe_flash"]),
    "resnmt_train_fast_bf16": ("resnmt.cli.train", RESNMT_POST_LN + FAST_FLAGS),
    "resnmt_train_fast_eager_bf16": ("resnmt.cli.train", RESNMT_POST_LN + FAST_FLAGS + ("--no-step-capture",)),
    # plan B where the captured step fails: the fast path's eager steps, each layer compiled
    # and replayed as CUDA graphs by torch.compile (reduce-overhead) instead
    "resnmt_train_fast_compiled_graphs_bf16": ("resnmt.cli.train", RESNMT_POST_LN + FAST_FLAGS + (
        "--no-step-capture", "--compile-layers", "--compile-mode", "reduce-overhead")),
    # transformer-big (d=1024, FFN 4096, 16 heads): stock's and resnmt's post-LN (its model)
    STOCK_BIG_RUN: ("fairseq_cli.train", ("--arch", "transformer_wmt_en_de_big")),
    "resnmt_train_fast_big_bf16": ("resnmt.cli.train", RESNMT_POST_LN_BIG + FAST_FLAGS),
}
WHOLE_RUN_NAMES = tuple(WHOLE_PROCESSES)
WHOLE_RUNS = ",".join(WHOLE_RUN_NAMES[:4])
# each whole process against stock fairseq-train of its size, round by round (a stock run is
# the reference of none: repeated in its job, it is the noise floor); the same-math pair in a
# band, the fast path at its 3x target
WHOLE_TARGETS: Dict[str, Comparison] = {
    "resnmt_postln_fp16": Comparison("resnmt_postln_fp16", STOCK_RUN, band=(0.98, 1.02)),
    **{name: Comparison(name, STOCK_RUN) for name in (
        "resnmt_train_recipe_bf16", "resnmt_train_recipe_compiled_bf16", "resnmt_train_recipe_flash_bf16",
        "resnmt_train_fast_eager_bf16", "resnmt_train_fast_compiled_graphs_bf16")},
    "resnmt_train_fast_bf16": Comparison("resnmt_train_fast_bf16", STOCK_RUN, times=3.0),
    "resnmt_train_fast_big_bf16": Comparison("resnmt_train_fast_big_bf16", STOCK_BIG_RUN),
}
