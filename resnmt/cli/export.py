"""resnmt-export: a trained translation model as a deployment artifact.

    resnmt-export --path checkpoints/checkpoint.avg10.pt --data data/multi30k \\
        --format ctranslate2 --output exports/m30k-ct2

``--format ctranslate2`` writes a CTranslate2 model (``ctranslate2.Translator(DIR)``) for
the kinds CTranslate2's Transformer computes exactly: post_ln, pre_ln and peri_ln, with LayerNorm
or RMSNorm and fairseq's ReLU, GELU or Swish; it decodes (float32) to fairseq-generate's
hypotheses. Any other model is refused in one line naming its kind and why.

``--format torch-export`` writes, for every kind, the encoder and one decoder step as
``torch.export`` programs (``encoder.pt2``, ``first_step.pt2``, ``next_step.pt2``), the
dictionaries and ``runner.py``, fairseq's beam search over the programs, which needs torch
only (no resnmt, no fairseq); it decodes to fairseq-generate's hypotheses:

    python exports/m30k-torch/runner.py exports/m30k-torch < test.spm.en > hypotheses.spm.de

The export is written into a temporary folder beside ``--output`` and renamed when
complete, so an interrupted run leaves nothing under that name; a finished export already
there is kept (``--force`` writes it again).
"""
import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from resnmt.cli.common import OneLineErrorParser
from resnmt.export import ExportError
from resnmt.options import Option, add_to_command

PROG = "resnmt-export"
FORMATS = ("ctranslate2", "torch-export")
# what a finished export of each format holds (the files written last)
FINISHED = {"ctranslate2": ("model.bin", "config.json"),
            "torch-export": ("encoder.pt2", "first_step.pt2", "next_step.pt2", "runner.py", "config.json")}
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16")

OPTIONS = (
    Option("path", required=True, metavar="CHECKPOINT", help=(
        "the checkpoint to export (a resnmt or fairseq Transformer translation model, e.g. checkpoint.avg10.pt)")),
    Option("data", required=True, metavar="DIR", help=(
        "its binarized data (the dict.*.txt), or the folder resnmt-prepare made (its bin/ is read)")),
    Option("format", required=True, kind="choice", choices=FORMATS, metavar="FORMAT", help=(
        "ctranslate2: a CTranslate2 model directory (post_ln, pre_ln and peri_ln; needs pip install ctranslate2); "
        "torch-export: torch.export programs of the encoder and the decoder step, for every kind, with runner.py, "
        "a beam search that needs torch only")),
    Option("output", required=True, metavar="DIR", help="the folder to write (created; must not hold another export)"),
    Option("quantization", kind="choice", choices=QUANTIZATIONS, metavar="TYPE", help=(
        "ctranslate2 only: store the weights as TYPE (" + ", ".join(QUANTIZATIONS) + "; default: float32, "
        "the only type whose hypotheses equal fairseq-generate's)")),
    Option("force", False, kind="switch", help="write the export again over a finished one at --output"),
)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(p, OPTIONS)
    return p


def finished(output: Path, fmt: str) -> bool:
    return output.is_dir() and all((output / name).is_file() for name in FINISHED[fmt])


def write(fmt: str, model, task, folder: Path, args, log) -> None:
    """The export of ``model`` in format ``fmt`` into the new folder ``folder``."""
    if fmt == "ctranslate2":
        from resnmt.export.ctranslate2 import export_ctranslate2

        export_ctranslate2(model, task, folder, quantization=args.quantization)
    else:
        from resnmt.export.torch_program import export_programs

        export_programs(model, task, folder, log=log)


def check_request(args) -> None:
    """What can be refused before the checkpoint is read."""
    if args.quantization and args.format != "ctranslate2":
        raise ExportError(f"--quantization {args.quantization} applies to --format ctranslate2 only")
    if args.format == "ctranslate2":
        from resnmt.export.ctranslate2 import require_ctranslate2

        require_ctranslate2()


def export(args, log) -> Optional[Path]:
    """The export the arguments ask for; None where a finished one is kept."""
    output = Path(args.output)
    if finished(output, args.format) and not args.force:
        log(f"{output} already holds a finished {args.format} export: kept (--force writes it again)")
        return None
    if output.exists() and not (output.is_dir() and (args.force or not any(output.iterdir()))):
        raise ExportError(f"--output {output} exists and is not a finished {args.format} export: "
                          "remove it or choose another folder")
    check_request(args)
    from resnmt.export.checkpoint import load_translation_model

    model, task = load_translation_model(args.path, args.data)
    log(f"loaded {args.path}: {sum(p.numel() for p in model.parameters()):,} parameters")
    output.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        folder = scratch / "export"
        write(args.format, model, task, folder, args, log)
        if output.exists():
            shutil.rmtree(output)
        os.replace(folder, output)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)

    def log(msg):
        print(f"{PROG}: {msg}", file=sys.stderr, flush=True)

    try:
        output = export(args, log)
    except ExportError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if output is not None:
        log(f"wrote {args.format} export to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
