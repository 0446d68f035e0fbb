"""Command lines of the experiment pipeline (``resnmt.experiment``).

* ``resnmt-experiment DATASET ARCH`` (also ``scripts/run_experiment.sh``): prepare ->
  train -> average -> decode -> score for one model, one JSON record;
* ``scripts/train.sh DATASET ARCH``: one training run with the papers' presets.

The scripts are one-line wrappers of ``python -m resnmt.cli.experiment {train,run}``; the
demo (``scripts/demo.sh``) is its own command, ``resnmt.cli.demo`` (``... experiment demo``
still runs it). The options are declared once, in ``resnmt.experiment.presets.TrainRequest``
and ``resnmt.experiment.pipeline.ExperimentRequest``; the parsers and the help lists below
are built from them. Messages go to stderr as ``[NAME] ...``; a bad option is one
``[NAME] error:`` line (the last) and exit status 2, a failed step exit status 1
(``resnmt.cli.common``).
"""
import os
import shlex
import sys
import textwrap
import time
from typing import Optional, Sequence, Tuple

from resnmt.cli.common import PipelineParser, command_name, logger, parse, report_warnings, run_guarded
from resnmt.data.corpora import DATASETS
from resnmt.experiment import presets, steps
from resnmt.experiment.command_options import add_options, declared, given, options_help
from resnmt.experiment.errors import ExperimentError, UsageError
from resnmt.experiment.pipeline import EXPERIMENT_OPTIONS, Experiment, ExperimentRequest
from resnmt.options import Option, add_to_command
from resnmt.progress import format_seconds

TRAIN_OPTIONS = (*presets.TRAIN_ONLY_OPTIONS, *presets.SHARED_TRAIN_OPTIONS)
RUN_OPTIONS = ("save_dir", *presets.SHARED_TRAIN_OPTIONS)
# each command's own switches, beside the requests' options, and the operands DATASET ARCH
TRAIN_SWITCHES = (
    Option("dry_run", False, "print the command and exit (nothing is checked on disk beyond the options, "
           "nothing is written)", kind="switch"),
    Option("verbose", False, "print fairseq's configuration and model dumps too (SAVE_DIR/train.log keeps "
           "them either way)", kind="switch"),
)
EXPERIMENT_SWITCHES = (
    Option("dry_run", False, "check the options, print what each step would run, and exit (nothing is run or "
           "written)", kind="switch"),
)
OPERANDS = Option("positional", nargs="*", positional=True, help="DATASET ARCH")

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
{options_help(declared(presets.TrainRequest, TRAIN_OPTIONS))}
{options_help(TRAIN_SWITCHES)}
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
{options_help(declared(ExperimentRequest, EXPERIMENT_OPTIONS))}
{options_help(declared(presets.TrainRequest, RUN_OPTIONS))}
{options_help(EXPERIMENT_SWITCHES)}
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

def positional_dataset_arch(args) -> Tuple[str, str]:
    if len(args.positional) != 2:
        raise UsageError(f"expected DATASET and ARCH, got {len(args.positional)} argument(s): "
                         f"{' '.join(args.positional) or 'none'}")
    return args.positional[0], args.positional[1]


def train_request(args, names: Sequence[str]) -> presets.TrainRequest:
    dataset, arch = positional_dataset_arch(args)
    return presets.TrainRequest(dataset=dataset, arch=arch, extra=args.extra,
                                **given(args, presets.TrainRequest, names))


# ------------------------------------------------------------------------------- train

def train_main(argv: Optional[Sequence[str]] = None, prog: str = "scripts/train.sh") -> int:
    p = PipelineParser(prog, f"{prog} [options] DATASET ARCH [-- FAIRSEQ-TRAIN FLAGS...]", TRAIN_HELP)
    add_options(p, presets.TrainRequest, TRAIN_OPTIONS)
    add_to_command(p, (*TRAIN_SWITCHES, OPERANDS))
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

def experiment_parser(prog: str) -> PipelineParser:
    p = PipelineParser(prog, f"{prog} [options] DATASET ARCH [-- FAIRSEQ-TRAIN FLAGS...]", EXPERIMENT_HELP)
    add_options(p, ExperimentRequest, EXPERIMENT_OPTIONS)
    add_options(p, presets.TrainRequest, RUN_OPTIONS)
    add_to_command(p, (*EXPERIMENT_SWITCHES, OPERANDS))
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
        if record is None:  # torchrun's node R > 0: trained, node 0 does the rest
            return 0
        log(f"done in {format_seconds(time.time() - started)}: {experiment.save_dir}/result.json")
        report_warnings([record], log)
        if req.strict and record.get("score_meaningless"):
            from resnmt.decoding.scoring import strict_failure

            raise ExperimentError(strict_failure(len(record["warnings"])))
        return 0

    return run_guarded(prog, body)


def demo_main(argv: Optional[Sequence[str]] = None, prog: str = "scripts/demo.sh") -> int:
    """``python -m resnmt.cli.experiment demo``, as scripts/demo.sh ran it before: the demo's command."""
    from resnmt.cli.demo import demo_main as demo

    return demo(argv, prog)


COMMANDS = {"train": train_main, "run": main, "demo": demo_main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m resnmt.cli.experiment {{{','.join(COMMANDS)}}} [options]")
    # the checkout's scripts/*.sh name themselves (RESNMT_PROG); run as a module, the usage names the module
    prog = os.environ.pop("RESNMT_PROG", None) or f"python -m resnmt.cli.experiment {sys.argv[1]}"
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:], prog))
