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
import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from sacremoses import MosesDetokenizer

from resnmt.cli.common import OneLineErrorParser

PROG = "resnmt-evaluate"

_GEN_LINE_RE = re.compile(r"^([HD])-(\d+)\t")
_COMPOUND_RE = re.compile(r"(\S)-(\S)")
_DROPPED_BATCH_HINT = (
    "; fairseq-generate drops a last partial batch unless run with --required-batch-size-multiple 1 "
    "or --task resnmt_translation (fairseq issue #5036)"
)


class EvaluateError(Exception):
    """A refusal: printed as one line, exit status 1, nothing appended."""


# ---------------------------------------------------------------- text processing

def unescape_moses(line: str) -> Tuple[str, int]:
    """Undo Moses's XML escaping with sacremoses' own table (``MosesDetokenizer.unescape_xml``,
    ``&amp;`` last, so ``&amp;quot;`` becomes ``&quot;``); returns the text and the number replaced."""
    replaced = 0
    for pattern, replacement in MosesDetokenizer.MOSES_UNESCAPE_XML_REGEXES:
        line, n = pattern.subn(replacement, line)
        replaced += n
    return line, replaced


def split_compounds(line: str) -> str:
    """``a-b`` -> ``a ##AT##-##AT## b``, tensor2tensor/fairseq's ``compound_split_bleu.sh``.

    Same as ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, quirk included: matches
    do not overlap, so a one-character part between two hyphens is consumed by the first
    match and ``a-b-c`` becomes ``a ##AT##-##AT## b-c`` (``Nord-Süd-Achse`` splits twice).
    """
    return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def read_lines(path: Path) -> List[str]:
    """Lines of a UTF-8 file split on "\\n" only (like ``wc -l``; no Unicode line breaks)."""
    text = path.read_text(encoding="utf-8")
    if text.endswith("\n"):
        text = text[:-1]
    return [] if text == "" else [line.rstrip("\r") for line in text.split("\n")]


def is_generate_output(lines: Sequence[str]) -> bool:
    return any(_GEN_LINE_RE.match(line) for line in lines)


def parse_generate_output(lines: Sequence[str], field: str = "D", source: str = "") -> List[str]:
    """Hypotheses of a ``fairseq-generate`` output, ordered by sentence id.

    Takes the ``field`` lines (``D``: detokenized, ``H``: as generated after
    ``--post-process``); with ``--nbest`` > 1 the first (best) line of each id.
    Every id from 0 to the largest must be present.
    """
    by_id: Dict[int, str] = {}
    other = "H" if field == "D" else "D"
    n_other = 0
    for line in lines:
        m = _GEN_LINE_RE.match(line)
        if not m:
            continue
        if m.group(1) != field:
            n_other += 1
            continue
        sid = int(m.group(2))
        parts = line.split("\t", 2)  # "D-<id>", score, text (empty text: no third field)
        if sid not in by_id:
            by_id[sid] = parts[2] if len(parts) > 2 else ""
    if not by_id:
        hint = f" (it has {other}- lines: pass --generate-field {other})" if n_other else ""
        raise EvaluateError(f"no {field}-<id> lines in {source}{hint}")
    n = max(by_id) + 1
    if len(by_id) != n:
        missing = [i for i in range(n) if i not in by_id]
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise EvaluateError(
            f"{source} has {field}- lines for {len(by_id)} ids but ids run to {n - 1}: missing {shown}"
            + _DROPPED_BATCH_HINT
        )
    return [by_id[i] for i in range(n)]


# ---------------------------------------------------------------- scoring

def _bleu(hyps, refs, **kwargs):
    from sacrebleu.metrics import BLEU

    metric = BLEU(force=True, **kwargs)  # resnmt warns about tokenized input itself, once
    score = metric.corpus_score(hyps, [refs])
    return score, str(metric.get_signature())


def moses_tokenize(lines: Sequence[str], lang: str) -> List[str]:
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, return_str=True, escape=False, aggressive_dash_splits=False) for line in lines]


def score_all(hyps, refs, *, lowercase=False, tokenize="13a", compound_split=False, lang=None) -> dict:
    """The three BLEU scores of post-processed hypotheses against references."""
    main, main_sig = _bleu(hyps, refs, tokenize=tokenize, lowercase=lowercase)
    intl, intl_sig = _bleu(hyps, refs, tokenize="intl", lowercase=lowercase)
    result = {
        "bleu": main.score,
        "signature": main_sig,
        "bleu_details": main.format(),
        "tok_intl_bleu": intl.score,
        "tok_intl_signature": intl_sig,
        "compound_split_bleu": None,
        "compound_split_signature": None,
    }
    if compound_split:
        hyp_tok = [split_compounds(x) for x in moses_tokenize(hyps, lang)]
        ref_tok = [split_compounds(x) for x in moses_tokenize(refs, lang)]
        cs, cs_sig = _bleu(hyp_tok, ref_tok, tokenize="none", lowercase=lowercase)
        result["compound_split_bleu"] = cs.score
        result["compound_split_signature"] = f"{cs_sig}|moses-tok:{lang}|compound-split:##AT##"
    return result


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    from sacrebleu.metrics import BLEU

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
    p.add_argument("--hyp", required=True, metavar="FILE",
                   help="fairseq-generate output (D-/H- lines) or plain hypotheses, one per line")
    p.add_argument("--ref", required=True, metavar="FILE",
                   help="reference translations, one per line, as published (untokenized, or "
                   "pre-tokenized like IWSLT'15 EN-VI)")
    p.add_argument("--input-format", choices=("auto", "generate", "plain"), default="auto",
                   help="how to read --hyp; auto: fairseq-generate output if any line starts with "
                   "'H-<id><TAB>' or 'D-<id><TAB>', else plain (default: %(default)s)")
    p.add_argument("--generate-field", choices=("D", "H"), default="D",
                   help="which fairseq-generate lines hold the hypotheses: D (after the model's "
                   "--tokenizer/--bpe decoding) or H (after --post-process only) (default: %(default)s)")
    p.add_argument("--remove-bpe", choices=("none", "subword_nmt", "sentencepiece"), default="none",
                   help="undo subword segmentation: subword_nmt removes '@@ ', sentencepiece joins "
                   "pieces and turns '\u2581' into spaces; none if fairseq-generate already did "
                   "(--post-process) (default: %(default)s)")
    p.add_argument("--detok", choices=("none", "moses"), default="none",
                   help="detokenize the hypotheses with sacremoses (needs --lang); none if they are "
                   "already detokenized or the references are tokenized too (default: %(default)s)")
    p.add_argument("--lang", metavar="LANG",
                   help="target language code for --detok moses and --compound-split (e.g. de, vi)")
    p.add_argument("--unescape", choices=("moses", "none"), default="moses",
                   help="turn Moses escapes (&apos; &quot; &amp; &lt; &gt; &#91; &#93; &#124;) back "
                   "into characters in hypotheses AND references before scoring (default: %(default)s)")
    p.add_argument("--lowercase", action="store_true",
                   help="case-insensitive BLEU (all scores); the papers report cased BLEU")
    p.add_argument("--sacrebleu-tokenize", choices=sorted(BLEU.TOKENIZERS), default="13a",
                   help="sacreBLEU tokenizer of the main score (default: %(default)s)")
    p.add_argument("--compound-split", action="store_true",
                   help="also report tokenized BLEU with compound splitting (WMT'14 EN-DE "
                   "convention; needs --lang)")
    p.add_argument("--json-out", metavar="FILE",
                   help="append the result as one JSON line to FILE")
    p.add_argument("--quiet", action="store_true", help="print only the sacreBLEU score")
    return p


def _read(flag: str, path: Path) -> List[str]:
    try:
        return read_lines(path)
    except UnicodeDecodeError as e:
        raise EvaluateError(f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


# Distinct words above which hypotheses without a single '\u2581' are taken for decoded
# text. A model that has collapsed (the same few pieces, or nothing, for every sentence)
# writes no '\u2581' either; its output is scored as it is (near 0), not refused.
DECODED_TEXT_MIN_TYPES = 50


def looks_decoded(hyps: List[str]) -> bool:
    """True when sentencepiece hypotheses hold no '\u2581' yet read like real text."""
    if any("\u2581" in h for h in hyps):
        return False
    return len({w for h in hyps for w in h.split()}) >= DECODED_TEXT_MIN_TYPES


def evaluate(args) -> dict:
    hyp_path, ref_path = Path(args.hyp), Path(args.ref)
    for flag, path in (("--hyp", hyp_path), ("--ref", ref_path)):
        if not path.is_file():
            raise EvaluateError(f"{flag} {path}: no such file")
    if args.detok == "moses" and not args.lang:
        raise EvaluateError("--detok moses needs --lang (the target language, e.g. --lang de)")
    if args.compound_split and not args.lang:
        raise EvaluateError("--compound-split needs --lang (the language of the Moses tokenizer, e.g. de)")

    hyp_lines, refs = _read("--hyp", hyp_path), _read("--ref", ref_path)
    fmt = args.input_format
    if fmt == "auto":
        fmt = "generate" if is_generate_output(hyp_lines) else "plain"
    hyps = parse_generate_output(hyp_lines, args.generate_field, str(hyp_path)) if fmt == "generate" else hyp_lines
    if len(hyps) != len(refs):
        what = "sentences (by id) in the fairseq-generate output" if fmt == "generate" else "lines"
        hint = _DROPPED_BATCH_HINT if fmt == "generate" and len(hyps) < len(refs) else ""
        raise EvaluateError(
            f"--hyp {hyp_path} has {len(hyps)} {what} but --ref {ref_path} has {len(refs)} lines{hint}"
        )
    if not refs:
        raise EvaluateError(f"--ref {ref_path} is empty")
    if args.remove_bpe == "sentencepiece" and looks_decoded(hyps):
        raise EvaluateError(
            f"--remove-bpe sentencepiece: no '\u2581' in the hypotheses of {hyp_path}; they look "
            "decoded already (removing would delete every space): use --remove-bpe none"
        )

    if args.remove_bpe != "none":
        from fairseq.data.data_utils import post_process

        hyps = [post_process(h, args.remove_bpe) for h in hyps]
    n_hyp_esc = n_ref_esc = 0
    if args.unescape == "moses":
        hyps, counts = zip(*(unescape_moses(h) for h in hyps))
        n_hyp_esc = sum(counts)
        refs, counts = zip(*(unescape_moses(r) for r in refs))
        n_ref_esc = sum(counts)
        hyps, refs = list(hyps), list(refs)
    if args.detok == "moses":
        detok = MosesDetokenizer(lang=args.lang)
        hyps = [detok.detokenize(h.split(), unescape=False) for h in hyps]

    if args.detok == "none" and sum(h.endswith(" .") for h in hyps) >= max(1, len(hyps) // 10):
        print(f"{PROG}: note: many hypotheses end in ' .' (tokenized?); sacreBLEU expects detokenized "
              "text (--detok moses --lang L) unless the references are tokenized too", file=sys.stderr)
    result = score_all(
        hyps, refs, lowercase=args.lowercase, tokenize=args.sacrebleu_tokenize,
        compound_split=args.compound_split, lang=args.lang,
    )
    import sacrebleu

    result.update({
        "n_sentences": len(refs),
        "hyp": os.path.abspath(hyp_path),
        "ref": os.path.abspath(ref_path),
        "escapes_replaced": {"hyp": n_hyp_esc, "ref": n_ref_esc},
        "options": {
            "input_format": fmt,
            "generate_field": args.generate_field if fmt == "generate" else None,
            "remove_bpe": args.remove_bpe,
            "unescape": args.unescape,
            "detok": args.detok,
            "lang": args.lang,
            "lowercase": args.lowercase,
            "sacrebleu_tokenize": args.sacrebleu_tokenize,
            "compound_split": args.compound_split,
        },
        "sacrebleu_version": sacrebleu.__version__,
    })
    return result


def summary(r: dict) -> str:
    o = r["options"]
    cs = (f"{r['compound_split_bleu']:6.2f}  {r['compound_split_signature']}"
          if r["compound_split_bleu"] is not None else "   n/a  (--compound-split --lang de for WMT'14 EN-DE)")
    return "\n".join([
        f"{PROG}: {r['n_sentences']} sentences  hyp={r['hyp']}  ref={r['ref']}",
        f"  input={o['input_format']}" + (f"({o['generate_field']})" if o["generate_field"] else "")
        + f"  remove-bpe={o['remove_bpe']}  unescape={o['unescape']} (replaced hyp {r['escapes_replaced']['hyp']},"
        f" ref {r['escapes_replaced']['ref']})  detok={o['detok']}"
        + (f"({o['lang']})" if o["detok"] == "moses" else "") + f"  lowercase={o['lowercase']}",
        f"  sacreBLEU        {r['bleu']:6.2f}  {r['signature']}",
        f"                           {r['bleu_details']}",
        f"  tokenized intl   {r['tok_intl_bleu']:6.2f}  {r['tok_intl_signature']}  (t2t-bleu tokenization)",
        f"  compound-split   {cs}",
    ])


def append_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(result, ensure_ascii=False, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as f:  # one write: concurrent runs append whole lines
        f.write(line)


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
        append_json(Path(args.json_out), result)
    print(f"{result['bleu']:.2f}" if args.quiet else summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
