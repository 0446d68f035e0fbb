"""gpu_train.py's measurement through fairseq's own ``Trainer.train_step``: each configuration
(a row of ``rows.TRAINER_ROWS`` at a precision, stock fp16 and the recipes) built from its
fairseq-train command line, warmed up, then timed in interleaved rounds; after each round a
record per configuration (tokens/s median and each round's, the ratio to its reference per
round, MFU against the peak of the dtype it trained in, the verdict) is appended to the
results, so that a job stopped from outside keeps its finished rounds.
"""
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from fairseq_trainer import (build_trainer, compiled_graphs, count_flops, first_batches, profile_update, run_updates,
                             synchronize)
from rows import CONFIGS, RECIPE_TARGET, RECIPES, STOCK, TRAINER_ROWS, Comparison, fairseq_argv
from stats import identical_noise, median_min_max, middle_half, round_ratios
from verdicts import trainer_verdict

from resnmt.experiment.presets import SIZES, ModelSize
from resnmt.experiment.results import append_jsonl

BENCHMARK = "gpu_train"  # every line's "benchmark" (benchmarks/results/gpu_train.jsonl, make_tables.py)
SMOKE_SIZE = ModelSize(2, 64, 256, 4)
# fairseq-train's settings of every configuration (beside rows.fairseq_argv's)
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
    twin_of: Optional[str] = None  # the key of the configuration this one repeats (the noise floor)

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
    from resnmt import fairseq_patches
    from resnmt.training.attention import use_sdpa_backends

    cfg = c.trainer.task.cfg  # fairseq's translation task has neither flag: torch's defaults
    kernels = getattr(cfg, "sdpa_backends", "")
    use_sdpa_backends(kernels.split(",") if kernels else torch_default_kernels)
    if getattr(cfg, "fused_master_weights", False):
        fairseq_patches.apply("fused-master-weights")
    else:
        fairseq_patches.remove("fused-master-weights")


def trainer_records(configs: List[Config], tokens_setting: int, peak_tflops: Dict[str, float]) -> List[dict]:
    """A record per configuration: tokens/s median (min-max), ratio to its reference, MFU
    against ``peak_tflops`` of the dtype the configuration trained in; beside each ratio the
    noise floor of these rounds (identical configurations' ratio) and the verdict."""
    by_key = {c.key: c for c in configs}
    rows, judged = [], []
    for c in configs:
        rates = [tok / sec for sec, tok in c.samples]
        if not rates:
            continue
        med, lo, hi = median_min_max(rates)
        per_update = statistics.median(sec / (tok / c.tokens_per_update) for sec, tok in c.samples) \
            if c.tokens_per_update else None
        arch, flags = CONFIGS[TRAINER_ROWS[c.row].config]
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
        ref = by_key.get(reference_key(c, configs))
        if ref is not None and ref is not c and len(ref.samples) == len(c.samples):
            ratios = round_ratios(c.samples, ref.samples)
            r_med, r_lo, r_hi = median_min_max(ratios)
            rec.update(reference=ref.key, ratio=r_med, ratio_min=r_lo, ratio_max=r_hi, ratio_rounds=ratios)
            quartiles = middle_half(ratios)
            if quartiles:
                rec.update(ratio_q1=quartiles[0], ratio_q3=quartiles[1])
            if c.flops_per_update and ref.flops_per_update:
                rec["flops_ratio"] = ref.flops_per_update / c.flops_per_update  # the speed ratio FLOPs predict
            judged.append((c, rec))
        rows.append(rec)
    noise = identical_noise(rows)
    for c, rec in judged:
        rec["noise_floor"] = noise
        if c.twin_of:
            rec.update(twin_of=c.twin_of, target="identical: the noise floor")
        else:
            rec.update(trainer_verdict(RECIPE_TARGET if c.name in RECIPES else TRAINER_ROWS[c.row], rec, noise))
    return rows


def reference_key(c: Config, configs: List[Config]) -> Optional[str]:
    """The key of the configuration ``c`` is compared with: the one a twin repeats, stock
    fp16 for a recipe, else its row's reference at its own precision (None for a reference row)."""
    if c.twin_of:
        return c.twin_of
    if c.name in RECIPES:
        return next((s.key for s in configs if s.name == STOCK), None)
    ref = TRAINER_ROWS[c.row].reference
    return f"{ref}/{c.dtype}" if ref else None


def identity(c: Config) -> tuple:
    """What makes two configurations the same command line: the measured model, the
    precision and the recipe's flags (stock fp16 is the transformer row in fp16)."""
    return TRAINER_ROWS[c.row].config, c.dtype, c.recipe


def configs_at(a, max_tokens: int, rows, dtypes, limits) -> List[Config]:
    """The configurations measured at ``max_tokens``: each row at each precision (within
    ``limits``), then stock fp16 and the recipes; then, where no two of them are the same
    command line, the first again (``NAME_twin``: the last, so that within each round the two
    run farthest apart), so that every job measures its noise floor."""
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
    if configs and len({identity(c) for c in configs}) == len(configs):
        first = configs[0]
        configs.append(Config(f"{first.name}_twin", first.row, first.dtype, recipe=first.recipe, twin_of=first.key))
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
    from resnmt.training.attention import sdpa_backends_enabled

    default_kernels = sdpa_backends_enabled()
    configs, batches = build_and_warm_up(a, max_tokens, configs, out, deadline, default_kernels)
    graphs_after_warmup = compiled_graphs()
    if profile_path is not None:
        write_profiles(a, max_tokens, configs, batches, env, profile_path, default_kernels)
    updates = fit_updates(a, configs, deadline)
    rows = []
    for rnd in range(a.rounds):
        timed = timed_round(a, max_tokens, configs, batches, out, rnd, updates, deadline, default_kernels)
        if len(timed) < sum(c.trainer is not None for c in configs):  # the deadline cut this round short
            print(f"[gpu_train] deadline: stopped after {rnd} rounds at --max-tokens {max_tokens}", file=sys.stderr)
            break
        for c in configs:
            if c.key in timed:
                c.samples.append(timed[c.key])
        rows = trainer_records(configs, max_tokens, env["peak_tflops"])
        graphs_now = compiled_graphs()
        for rec in rows:
            # torch.compile graphs made by then (all configurations): equal = none compiled while timed
            rec.update(job=env["time"], device=env["device"], updates_per_round=updates,
                       compiled_graphs_after_warmup=graphs_after_warmup, compiled_graphs_at_end=graphs_now)
            record(out, rec)
    for c in configs:  # free this token setting's models before the next
        c.trainer = None
    return rows


def record_failure(out: Path, max_tokens: int, c: Config, stage: str, error: BaseException) -> None:
    """A configuration that failed at ``stage``: dropped (its trainer freed), recorded in ``out``
    and printed."""
    c.trainer = None
    rec = {"kind": "error", "config": c.key, "max_tokens": max_tokens, "stage": stage,
           "error": f"{type(error).__name__}: {error}"[-2000:]}
    record(out, rec)
    print(json.dumps(rec), file=sys.stderr, flush=True)


def build_and_warm_up(a, max_tokens: int, configs: List[Config], out: Path, deadline: float, default_kernels):
    """(the configurations built and warmed up, the batches they train on): each trainer
    built, its FLOPs per update counted, its warm-up updates run; one that fails or is not
    started by the deadline is recorded and left out."""
    batches = None
    ready, shapes_seen = [], set()
    for c in configs:
        if time.monotonic() > deadline:
            record_failure(out, max_tokens, c, "build", TimeoutError("the deadline passed before it was built"))
            continue
        try:
            argv_c = train_argv(a.data, TRAINER_ROWS[c.row], c.dtype, max_tokens, c.recipe, a.smoke, a.cpu,
                                a.compile_backend)
            c.trainer, task, cfg = build_trainer(argv_c)
            process_wide(c, default_kernels)
            if batches is None:
                batches = first_batches(task, cfg, a.batches)
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
            record_failure(out, max_tokens, c, "build and warm-up", e)
    return ready, batches


def write_profiles(a, max_tokens: int, configs: List[Config], batches, env: dict, profile_path: Path,
                   default_kernels) -> None:
    """One profiled update of stock fp16 and of each recipe, written to ``profile_path``."""
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


def timed_round(a, max_tokens: int, configs: List[Config], batches, out: Path, rnd: int, updates: int,
                deadline: float, default_kernels) -> dict:
    """Round ``rnd``: ``updates`` timed updates of each configuration on the same batches, in
    the configurations' order (reversed every other round); {config key: (seconds, tokens)}
    of those timed before the deadline (a failure is recorded and drops the configuration)."""
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
            record_failure(out, max_tokens, c, f"round {rnd + 1}", e)
    return timed
