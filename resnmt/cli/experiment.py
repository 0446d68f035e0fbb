"""Command lines of the experiment pipeline (``resnmt.experiment``).

* ``resnmt-experiment DATASET ARCH`` (also ``scripts/run_experiment.sh``): prepare ->
  train -> average -> decode -> score for one model, one JSON record;
* ``scripts/train.sh DATASET ARCH``: one training run with the papers' presets;
* ``scripts/demo.sh`` (``make demo``): two small models on Multi30k and a BLEU table.

The scripts are one-line wrappers of ``python -m resnmt.cli.experiment {train,run,demo}``.
The options are declared once, in ``resnmt.experiment.presets.TrainRequest`` and
``resnmt.experiment.pipeline.ExperimentRequest``; the parsers and the help lists below
are built from them. Messages go to stderr as ``[NAME] ...``; a bad option is one
``[NAME] error:`` line (the last) and exit status 2, a failed step exit status 1.
"""
import argparse
import concurrent.futures
import os
import shlex
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from resnmt.atomic import atomic_write_text
from resnmt.data.corpora import DATASETS
from resnmt.experiment import presets, steps
from resnmt.experiment.errors import ExperimentError, UsageError
from resnmt.experiment.options import add_options, check_choice, given, options_help
from resnmt.experiment.pipeline import EXPERIMENT_OPTIONS, Experiment, ExperimentRequest
from resnmt.experiment.runtime import format_seconds, tool_env, which

TRAIN_OPTIONS = ("data", "save_dir", *presets.SHARED_TRAIN_OPTIONS, *presets.TRAIN_ONLY_OPTIONS[2:])
RUN_OPTIONS = ("save_dir", *presets.SHARED_TRAIN_OPTIONS)

DATASET_HELP = f"""\
DATASET   {textwrap.fill(', '.join(f"{d.name} ({d.src}->{d.tgt})" for d in DATASETS.values()) + ':', 78,
                         subsequent_indent=' ' * 10)}
          the built-in corpora (resnmt-prepare DATASET prepares them); or the
          directory of a corpus of your own, prepared by resnmt-prepare custom
          (it holds prepared.json; trained with the iwslt15-en-vi budget)
ARCH      a registered arch of model resnmt_transformer (resnmt_transformer, or
          transformer_FAMILY_{{base,big}} for each connection kind's family, e.g.
          transformer_sas_base; python -m resnmt.cli.arch_table lists them all), or
          fairseq's 'transformer' for a baseline"""

TRAIN_HELP = f"""\
Train ARCH on DATASET with fairseq-train --user-dir resnmt. Re-running the same
command resumes from SAVE_DIR/checkpoint_last.pt (fairseq's default restore file).

{DATASET_HELP}

Options:
{options_help(presets.TrainRequest, TRAIN_OPTIONS)}
  --dry-run             print the command and exit (nothing is checked on disk
                        beyond the options, nothing is written)
  --verbose             print fairseq's configuration and model dumps too
                        (SAVE_DIR/train.log keeps them either way)
  -h, --help            this help

Flags after -- go to fairseq-train after the preset's, so they override them
(argparse keeps the last value), e.g. -- --lr 1e-3 --skip-lambda 3.

Presets (paper): Adam (0.9, 0.98, eps 1e-9), inverse_sqrt with 4000 warm-up
updates, peak lr 7e-4 (base) / 5e-4 (big), label smoothing 0.1,
--share-all-embeddings, the arch's dropout (0.1 base, 0.3 big; 0.1 for big on
EN-FR as in Vaswani et al.), fp16 on GPU, --keep-last-epochs 10, and a
checkpoint every 1000 updates (the last 10 kept) for averaging;
  iwslt15-en-vi: 4096 tokens per update (1 GPU x 4096), 50k updates
  wmt14-*:       32768 tokens per update, base 100k / big 300k updates
Preset small: 4096 tokens per update, lr 1e-3, 500 warm-up updates, dropout 0.1,
2000 updates.
Environment: RESNMT_FAIRSEQ_TRAIN replaces the fairseq-train command (a wrapper).
"""

EXPERIMENT_HELP = f"""\
Runs the papers' pipeline for one model, each step skipped when its output exists
(re-running the same command resumes an interrupted experiment or does nothing):

  1. prepare  resnmt-prepare DATASET DATA_ROOT           (skipped if DATA_ROOT/bin exists)
  2. train    the papers' presets (below; resumes from checkpoint_last.pt)
                                                                    -> SAVE_DIR/train.done
  3. average  resnmt-average, the last N update checkpoints (checkpoint_E_U.pt,
              saved by the paper presets every 1000 updates) or, without them, the
              last N epoch checkpoints; checkpoint_last.pt the newest where training
              stopped mid-epoch (--max-update)     -> SAVE_DIR/checkpoint.avgN.pt (avgN-last.pt)
  4. decode   fairseq-generate --task resnmt_translation --gen-subset test
              --beam 4 --lenpen-form gnmt --lenpen 0.6              -> SAVE_DIR/gen.test.KEY.out
  5. score    resnmt-evaluate against DATA_ROOT/raw/test.TGT        -> SAVE_DIR/result.KEY.json,
              the same JSON object appended as one line to the --results file, and
              copied to SAVE_DIR/result.json (the latest settings' result)

KEY names the decoding settings, e.g. avg10.beam4.lenpen0.6 (plus .gen-FLAGS with
--gen-args, e.g. .gen-max-len-b50): re-running with another --average, --beam, --lenpen
or --gen-args averages, decodes and scores again, keeping the earlier outputs.

{DATASET_HELP}

Your own corpus:
  resnmt-prepare custom --train corpus/train --valid corpus/dev --test corpus/test \\
      --source-lang en --target-lang de data/my-corpus
  resnmt-experiment data/my-corpus transformer_rskip_base

Options:
{options_help(ExperimentRequest, EXPERIMENT_OPTIONS)}
{options_help(presets.TrainRequest, RUN_OPTIONS)}
  --dry-run             check the options, print what each step would run, and exit
                        (nothing is run or written)
  -h, --help            this help

Flags after -- go to fairseq-train after the preset's (see Presets), e.g.
-- --lr 1e-3 --skip-lambda 3.

Presets: paper (the default with GPUs) trains the papers' settings for DATASET; small
and cpu train 2+2 layers, d=128, FFN 512, 4096 tokens per update, lr 1e-3, 500 warm-up
updates, 2000 updates.

A score that means nothing (subword pieces left, a length ratio outside 0.5-2, most
hypotheses the same) and a schedule that cannot train (a warm-up not shorter than the
run, fewer checkpoints than --average) end the output as warning lines, and are in the
JSON result ("warnings"); --strict exits 1 on the former.

Scoring: the data's subword model, read from DATA_ROOT/prepared.json, is undone by
fairseq-generate --post-process (sentencepiece or subword_nmt); wmt14-en-de adds
--detok moses --lang de --compound-split, wmt14-en-fr --detok moses --lang fr (the
three BLEUs it reports: resnmt-evaluate --help).
To redo a step, delete its output (e.g. SAVE_DIR/train.done after raising --max-update).
"""

DEMO_HELP = """\
Prepares Multi30k EN-DE (from a local mirror when one is found, else the network),
trains two small Transformers (2+2 layers, d=128, FFN 512: the train.sh 'small'
preset), post-LN and 2rSkip+LN (lambda = 2), averages the last epoch checkpoints of
each, decodes test2016 with beam 4 and the GNMT length penalty 0.6, and prints a
table: arch, parameters, sacreBLEU (with its signature), training time. About 17
minutes on 2 idle CPU cores (the two models train side by side, one core each).
Re-running reuses the prepared data and every finished step (the pipeline of
resnmt-experiment).

Options (environment variables in brackets):
  --budget B        full (default) or tiny: 40 updates per model, decoding capped
                    at 1.2 x source length + 10 tokens; for smoke tests [DEMO_BUDGET]
  --max-epoch N     epochs per model (default 6) [DEMO_MAX_EPOCH]
  --max-update N    stop each model after N updates instead [DEMO_MAX_UPDATE]
  --average N       epoch checkpoints to average (default 2) [DEMO_AVERAGE]
  --archs "A B"     the models (default "transformer_postln_base transformer_rskip_base")
  --out DIR         runs, results.jsonl and table.md (default runs/demo) [DEMO_OUT]
  --data-root DIR   prepared Multi30k (default data/multi30k) [DEMO_DATA]
  --mirror DIR      the published Multi30k files (default: ../shared/data/multi30k when it
                    exists, else they are downloaded) [DEMO_MIRROR]
  -h, --help        this help
"""

DEMO_NOTE = """\
What to expect (measured, docs/study.md): at this size (2+2
layers) rSkip+LN λ=2 is about 1 BLEU behind post-LN from 600 to 2400 updates (3 seeds),
still 0.6-1.0 behind at 4800 to 12000 updates (2 seeds) and 0.6 behind at the final
budget, 14400 updates (2 seeds). With 6+6 layers the order reverses: rSkip+LN leads
post-LN at every budget from 600 updates on, by up to 15 BLEU (three seeds agree to 2400
updates, +8.2 there; 3.8 at 3600 updates in one seed, narrowing), where post-LN's lower
layers get 5-18x smaller gradients; pre-LN and SAS lead by as much, so the gain is
repairing deep post-LN, not rSkip's own. With 1000 warm-up updates instead of 300, 6+6
post-LN gets most of the way (31.6 at 2400 updates) and rSkip+LN still leads it by 3.4
BLEU (35.0). At the papers' base size (6+6, d=512, on a GPU) post-LN diverges under the
same schedule while rSkip+LN and pre-LN peak at 38.3 and 38.2 (1800 updates); with 1000
warm-up updates post-LN trains but stays 14 BLEU behind (24.1 at 3600; one seed each).
This demo shows the pipeline at a size a CPU trains in minutes, not a paper's win. Curves:
docs/figures/curves-bleu.png; longer and deeper runs: benchmarks/curves.py."""


def logger(name: str) -> Callable[[str], None]:
    return lambda message: print(f"[{name}] {message}", file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the option (exit status 2); help is the text above."""

    def __init__(self, prog: str, usage: str, text: str):
        super().__init__(prog=prog, usage=usage, add_help=False, allow_abbrev=False)
        self.text = text
        self.add_argument("-h", "--help", action="store_true")

    def format_help(self) -> str:
        return f"Usage: {self.usage}\n\n{self.text}"

    def error(self, message):
        usage_error(self.prog, message)


def command_name(prog: str) -> str:
    """The [NAME] of a command's messages: resnmt-experiment, train (scripts/train.sh, or
    python -m resnmt.cli.experiment train)."""
    return prog.split()[-1] if " " in prog else Path(prog).stem


def usage_error(prog: str, message: str):
    name = command_name(prog)
    print(f"[{name}] error: {message} (see {prog} --help)", file=sys.stderr)
    sys.exit(2)


def split_extra(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Options before the first ``--``, and the fairseq-train flags after it."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse(parser: Parser, argv: Sequence[str]):
    own, extra = split_extra(argv)
    args = parser.parse_args(own)
    if args.help:
        print(parser.format_help(), end="")
        sys.exit(0)
    args.extra = extra
    return args


def positional_dataset_arch(args) -> Tuple[str, str]:
    if len(args.positional) != 2:
        raise UsageError(f"expected DATASET and ARCH, got {len(args.positional)} argument(s): "
                         f"{' '.join(args.positional) or 'none'}")
    return args.positional[0], args.positional[1]


def train_request(args, names: Sequence[str]) -> presets.TrainRequest:
    dataset, arch = positional_dataset_arch(args)
    return presets.TrainRequest(dataset=dataset, arch=arch, extra=args.extra,
                                **given(args, presets.TrainRequest, names))


def report_warnings(records: Sequence[dict], log) -> None:
    """The warnings of finished experiments, after everything else: the last lines printed."""
    for r in records:
        for warning in r.get("warnings") or ():
            log(f"warning: {r['arch']}: {warning}" if len(records) > 1 else f"warning: {warning}")


def run_guarded(prog: str, body: Callable[[], int]) -> int:
    """``body()``, with a UsageError as a usage error and an ExperimentError as one error line."""
    try:
        return body()
    except UsageError as e:
        usage_error(prog, str(e))
    except ExperimentError as e:
        print(f"[{command_name(prog)}] error: {e}", file=sys.stderr)
        return 1


# ------------------------------------------------------------------------------- train

def train_main(argv: Optional[Sequence[str]] = None, prog: str = "scripts/train.sh") -> int:
    p = Parser(prog, f"{prog} [options] DATASET ARCH [-- FAIRSEQ-TRAIN FLAGS...]", TRAIN_HELP)
    add_options(p, presets.TrainRequest, TRAIN_OPTIONS)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("positional", nargs="*")
    args = parse(p, sys.argv[1:] if argv is None else argv)
    log = logger("train")

    def body():
        plan = presets.plan_training(train_request(args, TRAIN_OPTIONS), log, dry_run=args.dry_run)
        for warning in plan.schedule.warnings():
            log(f"warning: {warning}")
        if args.dry_run:
            print(shlex.join(plan.cmd))
            return 0
        steps.train(plan, log, verbose=args.verbose)
        return 0

    return run_guarded(prog, body)


# -------------------------------------------------------------------------- experiment

def experiment_parser(prog: str) -> Parser:
    p = Parser(prog, f"{prog} [options] DATASET ARCH [-- FAIRSEQ-TRAIN FLAGS...]", EXPERIMENT_HELP)
    add_options(p, ExperimentRequest, EXPERIMENT_OPTIONS)
    add_options(p, presets.TrainRequest, RUN_OPTIONS)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("positional", nargs="*")
    return p


def main(argv: Optional[Sequence[str]] = None, prog: str = "resnmt-experiment") -> int:
    args = parse(experiment_parser(prog), sys.argv[1:] if argv is None else argv)
    log = logger(command_name(prog))

    def body():
        req = ExperimentRequest(train=train_request(args, RUN_OPTIONS),
                                **given(args, ExperimentRequest, EXPERIMENT_OPTIONS))
        started = time.time()
        experiment = Experiment(req, log, logger("train"))
        if args.dry_run:
            print("\n".join(experiment.plan()))
            return 0
        record = experiment.run()
        log(f"done in {format_seconds(time.time() - started)}: {experiment.save_dir}/result.json")
        report_warnings([record], log)
        return 1 if req.strict and record.get("score_meaningless") else 0

    return run_guarded(prog, body)


# -------------------------------------------------------------------------------- demo

def demo_main(argv: Optional[Sequence[str]] = None, prog: str = "scripts/demo.sh") -> int:
    env = os.environ.get
    p = Parser(prog, f"{prog} [options]     (make demo runs it with the venv on PATH)", DEMO_HELP)
    p.add_argument("--budget", default=env("DEMO_BUDGET", "full"))
    p.add_argument("--max-epoch", default=env("DEMO_MAX_EPOCH") or None)
    p.add_argument("--max-update", default=env("DEMO_MAX_UPDATE") or None)
    p.add_argument("--average", default=env("DEMO_AVERAGE", "2"))
    p.add_argument("--archs", default="transformer_postln_base transformer_rskip_base")
    p.add_argument("--out", default=env("DEMO_OUT", "runs/demo"))
    p.add_argument("--data-root", default=env("DEMO_DATA", "data/multi30k"))
    p.add_argument("--mirror", default=env("DEMO_MIRROR") or None)
    args = parse(p, sys.argv[1:] if argv is None else argv)
    if args.extra:
        p.error("unknown argument '--'")
    log = logger("demo")
    return run_guarded(prog, lambda: demo(args, log))


def demo(args, log) -> int:
    check_choice("--budget", args.budget, ("full", "tiny"))
    archs = args.archs.split()
    if not archs:
        raise UsageError("--archs is empty")
    # the published files on this project's machines (a sibling checkout's shared/data)
    sibling_mirror = Path("../shared/data/multi30k")
    mirror = args.mirror or (sibling_mirror if sibling_mirror.is_dir() else None)
    gen_args = ""
    if args.budget == "tiny":
        if args.max_update is None and args.max_epoch is None:
            args.max_update = 40
        gen_args = "--max-len-a 1.2 --max-len-b 10"
    if args.max_epoch is None and args.max_update is None:
        args.max_epoch = 6
    gpus = min(presets.count_gpus(), 1)  # a model this small gains nothing from more
    cores = os.cpu_count() or 1
    # On the CPU the models train side by side, each with its share of the cores: a model
    # this small uses a second thread poorly (1.96 updates/s with 2 threads, 1.37 with 1, and
    # two 1-thread runs side by side 1.22 each, measured on 2 idle cores).
    side_by_side = gpus == 0 and 1 < len(archs) <= cores
    threads = cores // len(archs) if side_by_side else None
    out = Path(args.out)
    experiments = [  # every option is checked here, before any work
        Experiment(ExperimentRequest(
            train=presets.TrainRequest("multi30k", arch, save_dir=out / arch, preset="small", gpus=gpus,
                                       max_epoch=args.max_epoch, max_update=args.max_update),
            data_root=args.data_root, mirror=mirror, average=args.average, gen_args=gen_args,
            results=out / "results.jsonl", threads=threads),
            logger(f"run_experiment {arch}" if side_by_side else "run_experiment"),
            logger(f"train {arch}" if side_by_side else "train"),
            label=f"[{arch}] " if side_by_side else "")
        for arch in archs]
    train = experiments[0].req.train
    limits = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in (("max_epoch", train.max_epoch),
                                                                   ("max_update", train.max_update)) if v)
    device = "1 GPU" if gpus else f"the CPU ({cores} cores" + (f", side by side, {threads} thread(s) each)"
                                                                if side_by_side else ")")
    log(f"Multi30k EN-DE, {len(archs)} models on {device}, {limits}, budget {args.budget}; results in {out}")
    started = time.time()
    if side_by_side:
        experiments[0].prepare()  # the models share the data: prepared once, before they start
        with concurrent.futures.ThreadPoolExecutor(len(experiments)) as pool:
            futures = [pool.submit(experiment.run) for experiment in experiments]
        records = [future.result() for future in futures]  # the first failure is raised, after both ended
    else:
        records = []
        for i, experiment in enumerate(experiments, 1):
            log(f"model {i}/{len(archs)}: {experiment.req.train.arch}")
            records.append(experiment.run())
    table = demo_table(records)
    atomic_write_text(out / "table.md", table + "\n")
    analyze_demo_models(records, out, Path(args.data_root), log)
    print(f"\n{table}\n\n{DEMO_NOTE}", flush=True)
    log(f"done in {format_seconds(time.time() - started)}; table in {out}/table.md, results in {out}/results.jsonl")
    report_warnings(records, log)
    return 0


def demo_table(records: Sequence[dict]) -> str:
    """The demo's Markdown table of the experiments' records."""
    head = ("arch", "parameters", "BLEU", "training time", "updates", "averaged")
    rows = [(r["arch"], f"{r['params']:,}" if r.get("params") else "?", f"{r['bleu']:.2f}",
             f"{int((r.get('train_seconds') or 0) // 60)}m{int((r.get('train_seconds') or 0) % 60):02d}s",
             str(r.get("num_updates")), f"{r['averaged']} {r['averaged_kind']}") for r in records]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows), "",
                      f"BLEU: sacreBLEU on Multi30k test2016 (1,000 sentences), {records[-1]['signature']}; "
                      "beam 4, GNMT length penalty 0.6."])


def analyze_demo_models(records: Sequence[dict], out: Path, data_root: Path, log) -> None:
    """resnmt-analyze of each model on test (learned gates, skip ratios); a failure only warns."""
    if which("resnmt-analyze") is None:
        log("note: resnmt-analyze is not available here; no plot of the learned gates/ratios")
        return
    for r in records:
        final = out / "analysis" / r["arch"]
        if final.is_dir():
            log(f"analysis of {r['arch']}: {final} exists, skipped")
            continue
        tmp = final.with_name(final.name + ".tmp")
        try:
            steps.analyze(r["checkpoint"], data_root / "bin", tmp, None, tool_env(), split="test", num_sentences=None)
        except ExperimentError:
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"warning: resnmt-analyze failed on {r['checkpoint']}; the table above is unaffected")
            continue
        tmp.rename(final)
        log(f"analysis of {r['arch']} (learned gates / skip ratios): {final}")


COMMANDS = {"train": train_main, "run": main, "demo": demo_main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m resnmt.cli.experiment {{{','.join(COMMANDS)}}} [options]")
    # the checkout's scripts/*.sh name themselves (RESNMT_PROG); run as a module, the usage names the module
    prog = os.environ.pop("RESNMT_PROG", None) or f"python -m resnmt.cli.experiment {sys.argv[1]}"
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:], prog))
