"""The rows the study trains, each named once: a connection kind as an arch and its flags
(``QUALITY_ROWS``, the quality table's; ``CURVES_ROWS``, the curves study's, its controls
included), the groups they were added in, the runs that are another row's bit for bit, and
each size's milestones (the verdict protocol's, resnmt.study.verdict, extended).
"""
from dataclasses import dataclass
from typing import Dict, Tuple

from resnmt.study.rows import Row, slug  # noqa: F401  (slug: the campaign's modules name runs by it)
from resnmt.study.verdict import CPU, CUDA


QUALITY_ROWS: Dict[str, Row] = {
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
    # the 2025 kinds, one seed each so far
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
# lowest int(0.25 * 2) = 0 of 2 (tests/test_depth_and_stream_kinds.py::test_mix_ln_at_two_layers_is_pre_ln)
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
CONTROL_ROWS: Dict[str, Row] = {
    name: Row(QUALITY_ROWS[c.row].arch, (*QUALITY_ROWS[c.row].flags, *c.flags), seeds=1)
    for name, c in CONTROLS.items()}
CURVES_ROWS: Dict[str, Row] = {**QUALITY_ROWS, **CONTROL_ROWS}

# Each size's milestones in the curves study (updates): the last is the run's length; each
# size's first milestones are the verdict protocol's (resnmt.study.verdict.CPU, CUDA). The
# 2+2 final budget is where post-LN's curve flattens: seed 2 gained 1.00 BLEU from 9600 to
# 12000 updates, 0.19 to 14400, then 0.01 and 0.15 over the next two 2400-update steps
# (36.79, 36.80, 36.95), its validation loss 0.035, then 0.015 and 0.012 (4.118 at 14400).
# A 6+6 run costs about 3 times as much per update: 2400 updates is what two of them side
# by side (1 thread each) reach within one 3-hour session on this CPU. The papers' sizes
# (GPU only, benchmarks/gpu_job.sh parts 5-6) are scored every 1000 updates to 4000: each
# milestone restarts fairseq-train and decodes test2016 (about 30-50 s on a shared GPU), and
# a run must end within one GPU lease, which its checkpoints cannot outlive.
DEFAULT_MILESTONES = {
    "small": (*CPU.milestones["small"], 3600, 4800, 7200, 9600, 12000, 14400),
    "deep": (*CPU.milestones["deep"], 1800, 2400),
    "base": CUDA.milestones["base"],
    "base12": CUDA.milestones["base"],
}
