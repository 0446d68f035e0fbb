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
* the noise floor: where no two configurations of a token setting are the same command
  line, the first is measured twice (``NAME_twin``); identical configurations' largest
  per-round ratio (less 1) is stated beside every ratio. A same-math pair resolves 2 %
  only over at least 4 rounds with its ratios' range, its spread and the noise floor all
  under 2 % (``verdicts.pair_resolution``: one round never resolves);
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
  recipe through resnmt-train (also with ``--sdpa-backends flash,efficient,math``), and
  the fast path (``--fast-path``, with and without ``--no-step-capture``; base and big),
  fairseq's own ``wps`` parsed from its json log (the median over the logged intervals,
  and separately over the first epoch, where every batch shape is new, and the later
  ones), the fast path's padding and CUDA graphs from its log, and the per-update losses
  compared; ``--whole-rounds`` interleaved rounds, the order reversed every other round; a
  run named twice in ``--whole-runs`` is repeated in each round, the repeats' difference
  the noise floor of the processes' per-round ratios (whole_processes.py).

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
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # resnmt, where it is not installed (the GPU machine)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairseq_trainer import peak_rates  # noqa: E402
from result_tables import gpu_training_table  # noqa: E402
from rows import (CROSS_LAYER_ROWS, DEFAULT_RECIPES, RECIPES, TRAINER_DEFAULT_ROWS, TRAINER_ROWS,  # noqa: E402
                  WHOLE_RUN_NAMES, WHOLE_RUNS)
from trainer_rounds import configs_at, measure_setting, record  # noqa: E402
from whole_processes import time_whole_processes  # noqa: E402

from resnmt.options import Option, add_to_command  # noqa: E402
from resnmt.study import flags  # noqa: E402
from campaign import files  # noqa: E402
from resnmt.study.records import portable_path  # noqa: E402


OPTIONS = (
    Option("dtypes", "bf16,fp16", "comma-separated precisions of the rows (default: %(default)s)", metavar="D,D"),
    Option("dtype_rows", "", metavar="DTYPE:ROW,...;...", help=(
        "limits a precision to some rows (e.g. 'fp16:transformer,post_ln,transformer_prenorm,pre_ln'); default: "
        "every row at every dtype")),
    Option("tokens", "4096,16384", "comma-separated --max-tokens settings (default: %(default)s)", metavar="N,N"),
    Option("tokens_rows", "", "limits a token setting to some rows", metavar="TOKENS:ROW,...;..."),
    Option("no_recipe", False, "leave out stock fp16 and the recipes", kind="switch"),
    Option("recipes", DEFAULT_RECIPES, metavar="R,R,...", help=(
        "comma-separated recipes measured against stock fp16: recipe (bf16 + adam_fused), recipe_compiled (also "
        "--compile-layers), recipe_graphs (also --compile-mode reduce-overhead: CUDA graphs), recipe_flash (the "
        "recipe with --sdpa-backends flash,efficient,math), recipe_fused (the recipe with --fused-master-weights) "
        f"(default: {DEFAULT_RECIPES})")),
    Option("compile_backend", "inductor", kind="choice", choices=("inductor", "aot_eager", "eager"), help=(
        "torch.compile backend of the compiled recipe (default: %(default)s; the smoke test: eager)")),
    Option("warmup", 20, "updates before timing, per configuration (default: %(default)s)", kind="int", minimum=0,
           metavar="N"),
    Option("updates", 100, "timed updates per configuration per round (default: %(default)s)", kind="int",
           minimum=1, metavar="N"),
    Option("rounds", 3, "interleaved rounds (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("batches", 64, "distinct training batches, cycled (default: %(default)s)", kind="int", minimum=1,
           metavar="N"),
    Option("matmul_size", 8192, "side of the products timed for the card's rate in each dtype measured (default: "
           "%(default)s)", kind="int", minimum=1, metavar="N"),
    Option("profile", help="write a torch.profiler summary of one update (stock fp16, the recipes) to this JSON file",
           metavar="JSON"),
    Option("whole_process", False, "also time whole fairseq-train processes", kind="switch"),
    Option("whole_runs", WHOLE_RUNS, metavar="RUN,RUN,...", help=(
        f"comma-separated whole-process runs, of {', '.join(WHOLE_RUN_NAMES)}, in the order given; a run named again "
        f"is repeated, and the repeats' difference is the noise floor of the ratios (default: {WHOLE_RUNS})")),
    Option("whole_rounds", 1, kind="int", minimum=1, metavar="N", help=(
        "interleaved rounds of --whole-runs, the order reversed every other round (default: %(default)s; a ratio "
        "from one round never resolves)")),
    Option("whole_timeout", 300, "seconds a whole-process run may take (default: %(default)s)", kind="number",
           above=0, metavar="S"),
    Option("whole_updates", 300, "updates per whole-process run (default: %(default)s)", kind="int", minimum=1,
           metavar="N"),
    Option("whole_tokens", 4096, "--max-tokens of the whole-process runs (default: %(default)s)", kind="int",
           minimum=1, metavar="N"),
    Option("whole_interval", 10, kind="int", minimum=1, metavar="N", help=(
        "fairseq's --log-interval in the whole-process runs (default: %(default)s; each logged wps and loss covers "
        "that many updates)")),
    Option("whole_skip", 20, "updates left out of the whole-process wps as warm-up (default: %(default)s)",
           kind="int", minimum=0, metavar="N"),
    Option("deadline", None, kind="number", metavar="S", help=(
        "seconds after which no new run or round starts (the first round of each token setting always runs; "
        "default: none; 0 or less: only those)")),
    Option("smoke", False, "tiny model (2+2, d=64) for a quick check", kind="switch"),
    Option("cpu", False, "run on the CPU (with --smoke: the test suite's check; fp32)", kind="switch"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    files.add_data(p, binarized=True, required=True)
    files.add_out(p)
    flags.add_rows(p, TRAINER_ROWS, default=TRAINER_DEFAULT_ROWS,
                   what=f"rows (the rows after {TRAINER_DEFAULT_ROWS[-1]}, {', '.join(CROSS_LAYER_ROWS)}, need their "
                   "references in the same run)")
    add_to_command(p, OPTIONS)
    return p


def parse(argv=None):
    """``(a, rows, dtypes, tokens, limits)``: the command line, checked (a bad value: one
    error line, exit status 2); ``limits``: {("dtype" or "tokens", value): rows}."""
    p = parser()
    a = p.parse_args(argv)
    rows = flags.chosen_rows(p, a.rows, TRAINER_ROWS)
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
            unknown = [n for n in names.split(",") if n not in TRAINER_ROWS]
            if unknown or not names:
                p.error(f"--{kind}-rows {part}: rows must be among {', '.join(TRAINER_ROWS)}")
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


def portable_settings(a) -> dict:
    """The command line's settings as the environment line records them: its paths
    (``--data``, ``--out``, ``--profile``) holding no machine's folders."""
    settings = dict(vars(a))
    for name in ("data", "out", "profile"):
        if settings[name]:
            settings[name] = portable_path(settings[name], Path(a.data).parent)
    return settings


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
           "settings": portable_settings(a), "fairseq": fairseq.__version__}
    # the peak of each dtype that will train (the smoke test: fp32 on the CPU)
    trained = {c.dtype for t in tokens for c in configs_at(a, t, rows, dtypes, limits)}
    if a.whole_process:  # each whole process's precision is its name's last word
        trained |= {"fp32"} if a.cpu else {name.rsplit("_", 1)[1] for name in a.whole_runs.split(",")}
    trained = sorted(trained)
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
        time_whole_processes(a, out, deadline, env)
    print(gpu_training_table(all_rows))
    print(f"[gpu_train] {time.monotonic() - start:.0f} s; rows in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
