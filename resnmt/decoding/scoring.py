"""Scoring translations the way the papers and sacreBLEU report it: the library behind
``resnmt-evaluate`` (its module docstring describes the post-processing and the three
BLEU scores), which the experiment pipeline and the benchmarks call directly.
"""
import collections
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from sacremoses import MosesDetokenizer

from resnmt.decoding.subword import leftover_warning

PROG = "resnmt-evaluate"

_GEN_LINE_RE = re.compile(r"^([HD])-(\d+)\t")
# fairseq-generate's last line where the data has targets (T- lines): "Generate test with beam=4: BLEU4 = ..."
_GEN_CLOSING_RE = re.compile(r"^Generate \S+ with beam=\d+: ")
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


def cut_short(lines: Sequence[str]) -> bool:
    """True for a fairseq-generate output that ends before its closing line (``head -N`` of
    it): an output with targets (T- lines) always ends with ``Generate SUBSET with beam=K: ...``."""
    return any(line.startswith("T-") for line in lines) and not any(map(_GEN_CLOSING_RE.match, lines))


def parse_generate_output(lines: Sequence[str], field: str = "D", source: str = "",
                          expected: Optional[int] = None) -> List[str]:
    """Hypotheses of a ``fairseq-generate`` output, ordered by sentence id.

    Takes the ``field`` lines (``D``: detokenized, ``H``: as generated after
    ``--post-process``); with ``--nbest`` > 1 the first (best) line of each id.
    Every id from 0 to the largest (to ``expected - 1`` when given) must be present; an
    output cut short (``cut_short``) is refused as such.
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
    n = max(max(by_id) + 1, expected or 0)
    if len(by_id) != n and cut_short(lines):
        raise EvaluateError(f"{source} is cut short: it ends before fairseq-generate's closing line ('Generate ... "
                            f"with beam=...'), with {len(by_id)} of {n} sentences: {n - len(by_id)} missing at the "
                            "end (decode again, or score the whole output)")
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
        "length_ratio": main.sys_len / main.ref_len if main.ref_len else None,
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


# a length ratio (hypotheses : references, sacreBLEU's) outside these bounds: the model
# does not translate yet (one word per sentence, or a word repeated to the length limit)
LENGTH_RATIO_BOUNDS = (0.5, 2.0)


def strict_failure(n_warnings: int) -> str:
    """``--strict``'s last line (resnmt-evaluate's and resnmt-experiment's): why they exit 1."""
    return (f"--strict: the score is flagged as meaningless (the {'warning' if n_warnings == 1 else 'warnings'} "
            "above), so the exit status is 1")


def meaningless_score_warnings(hyps: Sequence[str], result: dict) -> List[str]:
    """One line for each sign that a score does not measure translation: a length ratio
    outside LENGTH_RATIO_BOUNDS, or most hypotheses the same sentence (a model that has not
    learned yet, whatever its BLEU). Subword pieces left in the text: ``leftover_warning``."""
    out = []
    ratio, (low, high) = result.get("length_ratio"), LENGTH_RATIO_BOUNDS
    if ratio is not None and not low <= ratio <= high:
        how = "shorter" if ratio < low else "longer"
        out.append(f"the hypotheses are {how} than the references (length ratio {ratio:.3f}, outside "
                   f"{low:g}-{high:g}): the model does not translate yet and BLEU {result['bleu']:.2f} "
                   "measures nothing; train longer (or check the decoding's --max-len-a/--max-len-b)")
    if hyps:
        (top, count), = collections.Counter(hyps).most_common(1)
        if count > len(hyps) / 2:
            shown = top if len(top) <= 40 else top[:37] + "..."
            out.append(f"{count} of {len(hyps)} hypotheses are the same sentence ({shown!r}): the model does not "
                       f"translate yet and BLEU {result['bleu']:.2f} measures nothing; train longer")
    return out


def _read(flag: str, path: Path) -> List[str]:
    try:
        return read_lines(path)
    except UnicodeDecodeError as e:  # e.object: the whole file
        line = e.object[:e.start].count(b"\n") + 1
        raise EvaluateError(f"{flag} {path}, line {line}: not valid UTF-8 at byte {e.start} of the file "
                            f"({e.reason})") from None


# Distinct words above which hypotheses without a single '\u2581' are taken for decoded
# text. A model that has collapsed (the same few pieces, or nothing, for every sentence)
# writes no '\u2581' either; its output is scored as it is (near 0), not refused.
DECODED_TEXT_MIN_TYPES = 50


def looks_decoded(hyps: List[str]) -> bool:
    """True when sentencepiece hypotheses hold no '\u2581' yet read like real text."""
    if any("\u2581" in h for h in hyps):
        return False
    return len({w for h in hyps for w in h.split()}) >= DECODED_TEXT_MIN_TYPES


def score_files(hyp, ref, *, input_format: str = "auto", generate_field: str = "D", remove_bpe: str = "none",
                detok: str = "none", lang: Optional[str] = None, unescape: str = "moses", lowercase: bool = False,
                sacrebleu_tokenize: str = "13a", compound_split: bool = False) -> dict:
    """The scores of the hypotheses in ``hyp`` (a fairseq-generate output or plain lines)
    against the references in ``ref``, post-processed as the keywords say (resnmt-evaluate's
    options of the same names); EvaluateError (one line) when they cannot be scored."""
    import sacrebleu

    hyp_path, ref_path = Path(hyp), Path(ref)
    check_score_options(hyp_path, ref_path, detok, lang, compound_split)
    hyps, refs, fmt = read_texts(hyp_path, ref_path, input_format, generate_field)
    hyps, refs, leftover, escapes = post_process_texts(hyps, refs, hyp_path, remove_bpe, unescape, detok, lang)
    if not leftover and detok == "none" and sum(h.endswith(" .") for h in hyps) >= max(1, len(hyps) // 10):
        print(f"{PROG}: note: many hypotheses end in ' .' (tokenized?); sacreBLEU expects detokenized "
              "text (--detok moses --lang L) unless the references are tokenized too", file=sys.stderr)
    result = score_all(
        hyps, refs, lowercase=lowercase, tokenize=sacrebleu_tokenize,
        compound_split=compound_split, lang=lang,
    )
    # subword pieces left explain any other sign (a length ratio of pieces): the one warning then
    result["warnings"] = [leftover] if leftover else meaningless_score_warnings(hyps, result)
    result.update({
        "n_sentences": len(refs),
        "hyp": os.path.abspath(hyp_path),
        "ref": os.path.abspath(ref_path),
        "escapes_replaced": escapes,
        "options": {
            "input_format": fmt,
            "generate_field": generate_field if fmt == "generate" else None,
            "remove_bpe": remove_bpe,
            "unescape": unescape,
            "detok": detok,
            "lang": lang,
            "lowercase": lowercase,
            "sacrebleu_tokenize": sacrebleu_tokenize,
            "compound_split": compound_split,
        },
        "sacrebleu_version": sacrebleu.__version__,
    })
    return result


def check_score_options(hyp_path: Path, ref_path: Path, detok: str, lang: Optional[str], compound_split: bool) -> None:
    """Both files exist; --detok moses and --compound-split have their --lang."""
    for flag, path in (("--hyp", hyp_path), ("--ref", ref_path)):
        if not path.is_file():
            raise EvaluateError(f"{flag} {path}: no such file")
    if detok == "moses" and not lang:
        raise EvaluateError("--detok moses needs --lang (the target language, e.g. --lang de)")
    if compound_split and not lang:
        raise EvaluateError("--compound-split needs --lang (the language of the Moses tokenizer, e.g. de)")


def read_texts(hyp_path: Path, ref_path: Path, input_format: str, generate_field: str):
    """(the hypotheses, the references, the format ``hyp_path`` was read in): one hypothesis
    per reference, and some references."""
    hyp_lines, refs = _read("--hyp", hyp_path), _read("--ref", ref_path)
    fmt = input_format
    if fmt == "auto":
        fmt = "generate" if is_generate_output(hyp_lines) else "plain"
    hyps = parse_generate_output(hyp_lines, generate_field, str(hyp_path), len(refs)) if fmt == "generate" \
        else hyp_lines
    if len(hyps) != len(refs):
        what = "sentences (by id) in the fairseq-generate output" if fmt == "generate" else "lines"
        if len(hyps) > len(refs):
            hint = ""
        elif fmt == "generate":
            hint = _DROPPED_BATCH_HINT
        else:
            hint = f": {len(refs) - len(hyps)} lines missing at the end of --hyp (a file cut short?)"
        raise EvaluateError(
            f"--hyp {hyp_path} has {len(hyps)} {what} but --ref {ref_path} has {len(refs)} lines{hint}"
        )
    if not refs:
        raise EvaluateError(f"--ref {ref_path} is empty")
    return hyps, refs, fmt


def post_process_texts(hyps, refs, hyp_path: Path, remove_bpe: str, unescape: str, detok: str, lang: Optional[str]):
    """The texts as scored: subwords removed, Moses escapes replaced (both sides),
    hypotheses detokenized; with the warning on pieces left (or None) and the escapes
    replaced per side."""
    if remove_bpe == "sentencepiece" and looks_decoded(hyps):
        raise EvaluateError(
            f"--remove-bpe sentencepiece: no '\u2581' in the hypotheses of {hyp_path}; they look "
            "decoded already (removing would delete every space): use --remove-bpe none"
        )
    if remove_bpe != "none":
        from fairseq.data.data_utils import post_process

        hyps = [post_process(h, remove_bpe) for h in hyps]
    leftover = leftover_warning(hyps, remove_bpe)  # pieces or '@@ ' still there: the wrong (or no) post-processing
    n_hyp_esc = n_ref_esc = 0
    if unescape == "moses":
        hyps, counts = zip(*(unescape_moses(h) for h in hyps))
        n_hyp_esc = sum(counts)
        refs, counts = zip(*(unescape_moses(r) for r in refs))
        n_ref_esc = sum(counts)
        hyps, refs = list(hyps), list(refs)
    if detok == "moses":
        detokenizer = MosesDetokenizer(lang=lang)
        hyps = [detokenizer.detokenize(h.split(), unescape=False) for h in hyps]
    return hyps, refs, leftover, {"hyp": n_hyp_esc, "ref": n_ref_esc}


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
