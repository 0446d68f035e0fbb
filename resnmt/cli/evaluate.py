"""resnmt-evaluate: BLEU of a translation the way the papers and sacreBLEU report it.

    resnmt-evaluate --hyp gen.out --ref tst2013.vi --remove-bpe subword_nmt \\
        --detok moses --lang vi --json-out results.jsonl

Input: a ``fairseq-generate`` output (its ``D-``/``H-`` lines, put back in sentence
order) or a plain file of hypotheses, one per line, and the reference file.
Post-processing, in order, applied to the hypotheses (and step 3 to the references too):

1. ``--remove-bpe``: fairseq's ``post_process``: ``subword_nmt`` joins "@@ " pieces,
   ``sentencepiece`` turns "▁" pieces back into words;
2. Moses entity unescaping (``--unescape moses``, the default) of hypotheses and
   references alike, with sacremoses' table: ``&apos; &quot; &amp; &lt; &gt; &#91; &#93;
   &#124;`` (and the older ``&bar; &bra; &ket;``) become ``' " & < > [ ] |``, ``&amp;``
   last, so ``&amp;quot;`` becomes ``&quot;`` (exactly undoing Moses's escaping);
3. ``--detok moses --lang L``: sacremoses detokenization of the hypotheses.

A score that means nothing is flagged after it, one warning line each on stderr (the
last lines), and in the JSON result's ``warnings``: hypotheses that still hold
sentencepiece pieces (``▁``) or BPE markers (``@@ ``) after step 1 (decoded without the
post-processing their data needs; the line names the fix, see ``resnmt/decoding/subword.py``), a
length ratio outside 0.5-2 (``length_ratio``, sacreBLEU's), most hypotheses the same
sentence. ``--strict`` makes them exit status 1.

Reported (``BLEU`` below is corpus BLEU with sacreBLEU's defaults, one reference):

* ``bleu``: sacreBLEU (``--sacrebleu-tokenize``, 13a by default) with its signature;
* ``tok_intl_bleu``: sacreBLEU with ``tokenize="intl"``, the mteval-v14
  ``--international`` tokenization that tensor2tensor's ``t2t-bleu`` uses (the
  papers' EN-VI numbers);
* ``compound_split_bleu`` (``--compound-split``): Moses-tokenize both sides
  (sacremoses, ``--lang``), split hyphenated compounds ``a-b`` -> ``a ##AT##-##AT## b``
  as tensor2tensor's and fairseq's ``compound_split_bleu.sh`` do, then BLEU with
  ``tokenize="none"`` (the WMT'14 EN-DE convention).

One JSON object per run is appended to ``--json-out``; a summary goes to stdout.
"""
import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from resnmt.cli.common import OneLineErrorParser
from resnmt.decoding.scoring import PROG, EvaluateError, score_files, strict_failure, summary
from resnmt.experiment.results import append_jsonl
from resnmt.options import Option, add_to_command

# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog=PROG,
        description=(
            "Score translations against a reference: sacreBLEU with its signature, tokenized BLEU\n"
            "with the 'intl' (t2t-bleu / mteval-v14) tokenization, and optionally tokenized BLEU\n"
            "with compound splitting (WMT'14 EN-DE). Post-processing order: --remove-bpe, then\n"
            "--unescape (hypotheses and references), then --detok (hypotheses). Appends one JSON\n"
            "line per run to --json-out and prints a summary."
        ),
        epilog=(
            "examples:\n"
            "  fairseq-generate ... > gen.out\n"
            "  resnmt-evaluate --hyp gen.out --ref tst2013.vi --detok moses --lang vi\n"
            "  resnmt-evaluate --hyp gen.out --ref newstest2014.de --remove-bpe subword_nmt \\\n"
            "      --detok moses --lang de --compound-split --json-out results.jsonl\n"
            "see docs/decoding-and-evaluation.md for which number matches which paper."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_to_command(p, (*INPUT_OPTIONS, *scoring_options()))
    return p


# what is scored: the hypotheses, how to read them, and the reference
INPUT_OPTIONS = (
    Option("hyp", required=True, metavar="FILE",
           help="fairseq-generate output (D-/H- lines) or plain hypotheses, one per line"),
    Option("ref", required=True, metavar="FILE", help="reference translations, one per line, as published "
           "(untokenized, or pre-tokenized like IWSLT'15 EN-VI)"),
    Option("input_format", "auto", "how to read --hyp; auto: fairseq-generate output if any line starts with "
           "'H-<id><TAB>' or 'D-<id><TAB>', else plain (default: %(default)s)",
           kind="choice", choices=("auto", "generate", "plain")),
    Option("generate_field", "D", "which fairseq-generate lines hold the hypotheses: D (after the model's "
           "--tokenizer/--bpe decoding) or H (after --post-process only) (default: %(default)s)",
           kind="choice", choices=("D", "H")),
)


def scoring_options():
    """How the texts are post-processed and scored, and where the result goes (sacreBLEU's
    tokenizers, imported here: not before the command line is read)."""
    from sacrebleu.metrics import BLEU

    return (
        Option("remove_bpe", "none", "undo subword segmentation: subword_nmt removes '@@ ', sentencepiece joins "
               "pieces and turns '\u2581' into spaces; none if fairseq-generate already did (--post-process); a "
               "warning names the fix when '\u2581' or '@@ ' is left (default: %(default)s)",
               kind="choice", choices=("none", "subword_nmt", "sentencepiece")),
        Option("detok", "none", "detokenize the hypotheses with sacremoses (needs --lang); none if they are "
               "already detokenized or the references are tokenized too (default: %(default)s)",
               kind="choice", choices=("none", "moses")),
        Option("lang", metavar="LANG",
               help="target language code for --detok moses and --compound-split (e.g. de, vi)"),
        Option("unescape", "moses", "turn Moses escapes (&apos; &quot; &amp; &lt; &gt; &#91; &#93; &#124;) back "
               "into characters in hypotheses AND references before scoring (default: %(default)s)",
               kind="choice", choices=("moses", "none")),
        Option("lowercase", False, "case-insensitive BLEU (all scores); the papers report cased BLEU",
               kind="switch"),
        Option("sacrebleu_tokenize", "13a", "sacreBLEU tokenizer of the main score (default: %(default)s)",
               kind="choice", choices=sorted(BLEU.TOKENIZERS)),
        Option("compound_split", False, "also report tokenized BLEU with compound splitting (WMT'14 EN-DE "
               "convention; needs --lang)", kind="switch"),
        Option("json_out", metavar="FILE", help="append the result as one JSON line to FILE"),
        Option("quiet", False, "print only the sacreBLEU score", kind="switch"),
        Option("strict", False, "exit status 1 when the score is flagged as meaningless (the warnings printed "
               "after it: subword pieces left, a length ratio outside 0.5-2, most hypotheses the same), for "
               "scripts; the result is printed and appended all the same", kind="switch"),
    )


def evaluate(args) -> dict:
    """resnmt.decoding.scoring.score_files with the command line's options."""
    return score_files(args.hyp, args.ref, input_format=args.input_format, generate_field=args.generate_field,
                       remove_bpe=args.remove_bpe, detok=args.detok, lang=args.lang, unescape=args.unescape,
                       lowercase=args.lowercase, sacrebleu_tokenize=args.sacrebleu_tokenize,
                       compound_split=args.compound_split)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.json_out and Path(args.json_out).is_dir():
            raise EvaluateError(f"--json-out {args.json_out} is a directory; expected a file to append to")
        result = evaluate(args)
    except EvaluateError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if args.json_out:
        append_jsonl(Path(args.json_out), result, sort_keys=True)
    print(f"{result['bleu']:.2f}" if args.quiet else summary(result), flush=True)
    for warning in result["warnings"]:  # after the score, where it is read
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if args.strict and result["warnings"]:
        print(f"{PROG}: error: {strict_failure(len(result['warnings']))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
