"""resnmt-evaluate: scores on the real IWSLT'15 references, escapes, parsing, BPE, compounds, errors."""
import json
from pathlib import Path

import pytest
import sacrebleu
from fairseq.data.data_utils import post_process as remove_bpe  # what --remove-bpe applies
from sacrebleu.metrics import BLEU

from conftest import run_cli, shared_data_dir
from resnmt.cli.evaluate import main
from resnmt.decoding.scoring import (EvaluateError, is_generate_output, parse_generate_output, read_lines,
                                     split_compounds, unescape_moses)


@pytest.fixture(scope="module")
def tst2013_vi() -> Path:
    return shared_data_dir("iwslt15-en-vi") / "tst2013.vi"


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json_lines(path: Path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def perturb(lines):
    """Drop the last word of every 3rd line, swap the first two words of every 5th."""
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i % 3 == 0 and len(words) > 1:
            words = words[:-1]
        if i % 5 == 0 and len(words) > 2:
            words[0], words[1] = words[1], words[0]
        out.append(" ".join(words))
    return out


def test_reference_against_itself_is_100(tmp_path, capsys, tst2013_vi):
    js = tmp_path / "res.jsonl"
    rc, out, _ = _run(capsys, "--hyp", tst2013_vi, "--ref", tst2013_vi, "--compound-split", "--lang", "vi",
                      "--json-out", js)
    assert rc == 0
    (r,) = _json_lines(js)
    assert r["n_sentences"] == 1268 == len(read_lines(tst2013_vi))
    assert r["bleu"] == pytest.approx(100.0)
    assert r["tok_intl_bleu"] == pytest.approx(100.0)
    assert r["compound_split_bleu"] == pytest.approx(100.0)
    assert r["signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert "tok:intl" in r["tok_intl_signature"] and "compound-split" in r["compound_split_signature"]
    # tst2013.vi holds 224 Moses escapes (212 &quot;, 5 &amp;, 5 &apos;, one &#91; and one &#93;)
    assert r["escapes_replaced"] == {"hyp": 224, "ref": 224}
    assert r["options"]["unescape"] == "moses" and r["ref"] == str(tst2013_vi)
    assert "sacreBLEU        100.00" in out


def test_perturbed_copy_scores_what_sacrebleu_gives_on_the_unescaped_text(tmp_path, capsys, tst2013_vi):
    refs = read_lines(tst2013_vi)
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("\n".join(perturb(refs)) + "\n", encoding="utf-8")
    js = tmp_path / "res.jsonl"
    assert _run(capsys, "--hyp", hyp, "--ref", tst2013_vi, "--json-out", js)[0] == 0
    assert _run(capsys, "--hyp", hyp, "--ref", tst2013_vi, "--json-out", js, "--unescape", "none")[0] == 0
    unescaped, raw = _json_lines(js)  # appended, one line per run

    def plain(lines):
        return [line.replace("&quot;", '"').replace("&apos;", "'").replace("&#91;", "[")
                .replace("&#93;", "]").replace("&amp;", "&") for line in lines]

    hyp_u, ref_u = plain(perturb(refs)), plain(refs)
    assert unescaped["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyp_u, [ref_u]).score, abs=1e-9)
    assert unescaped["tok_intl_bleu"] == pytest.approx(BLEU(tokenize="intl").corpus_score(hyp_u, [ref_u]).score, abs=1e-9)
    assert raw["bleu"] == pytest.approx(sacrebleu.corpus_bleu(perturb(refs), [refs]).score, abs=1e-9)
    assert raw["tok_intl_bleu"] == pytest.approx(BLEU(tokenize="intl").corpus_score(perturb(refs), [refs]).score)
    assert 40 < unescaped["bleu"] < 99
    # intl tokenization splits "&quot;" into "& quot ;" (13a unescapes &quot; itself), so only
    # the intl score sees the difference
    assert abs(raw["tok_intl_bleu"] - unescaped["tok_intl_bleu"]) > 0.05
    assert unescaped["compound_split_bleu"] is None


def test_apostrophe_matches_escaped_apostrophe(tmp_path, capsys):
    ref = tmp_path / "ref.txt"
    ref.write_text("it &apos;s a &quot; test &quot; &amp; more &#91;1&#93; a &#124; b &lt;x&gt;\n", encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("it 's a \" test \" & more [1] a | b <x>\n", encoding="utf-8")
    js = tmp_path / "r.jsonl"
    assert _run(capsys, "--hyp", hyp, "--ref", ref, "--json-out", js)[0] == 0
    assert _run(capsys, "--hyp", hyp, "--ref", ref, "--json-out", js, "--unescape", "none")[0] == 0
    matched, unmatched = _json_lines(js)
    assert matched["bleu"] == pytest.approx(100.0) and matched["escapes_replaced"] == {"hyp": 0, "ref": 9}
    assert unmatched["bleu"] < 50


def test_unescape_is_one_pass_and_exact():
    assert unescape_moses("&amp;quot; &apos;&apos; &#124;") == ("&quot; '' |", 4)
    assert unescape_moses("AT&T; &unknown;") == ("AT&T; &unknown;", 0)


def test_generate_output_out_of_order_ids_and_nbest(tmp_path, capsys):
    gen = tmp_path / "gen.out"
    gen.write_text("\n".join([
        "2026-01-01 | INFO | fairseq_cli.generate | loading model(s)",
        "S-2\tdrei",
        "T-2\tthree",
        "H-2\t-0.5\tthree@@ s",
        "D-2\t-0.5\tthrees",
        "P-2\t-0.1 -0.2 -0.2",
        "H-2\t-0.9\tthrice",  # second best of an n-best list: ignored
        "D-2\t-0.9\tthrice",
        "S-0\teins",
        "H-0\t-0.1\tone",
        "D-0\t-0.1\tone",
        "H-1\t-2.0\t",  # an empty hypothesis
        "D-1\t-2.0\t",
        "Generate test with beam=4: BLEU4 = 0.00",
    ]) + "\n", encoding="utf-8")
    lines = read_lines(gen)
    assert is_generate_output(lines)
    assert parse_generate_output(lines, "D") == ["one", "", "threes"]
    assert parse_generate_output(lines, "H") == ["one", "", "three@@ s"]
    ref = tmp_path / "ref.txt"
    ref.write_text("one\nnothing\nthrees\n", encoding="utf-8")
    js = tmp_path / "r.jsonl"
    assert _run(capsys, "--hyp", gen, "--ref", ref, "--json-out", js)[0] == 0
    assert _run(capsys, "--hyp", gen, "--ref", ref, "--json-out", js, "--generate-field", "H",
                "--remove-bpe", "subword_nmt")[0] == 0
    by_d, by_h = _json_lines(js)
    expected = sacrebleu.corpus_bleu(["one", "", "threes"], [["one", "nothing", "threes"]]).score
    assert by_d["bleu"] == pytest.approx(expected) and by_h["bleu"] == pytest.approx(expected)
    assert by_d["options"]["input_format"] == "generate" and by_h["options"]["generate_field"] == "H"

    with pytest.raises(EvaluateError, match=r"ids run to 3: missing 1, 2"):
        parse_generate_output(["H-0\t-1\ta", "H-3\t-1\tb"], "H", "x")
    with pytest.raises(EvaluateError, match="no D-<id> lines in x .*pass --generate-field H"):
        parse_generate_output(["H-0\t-1\ta"], "D", "x")
    assert not is_generate_output(["H-0 is a plain line", "D-day"])


def test_bpe_removal_both_forms():
    assert remove_bpe("the hou@@ se is gre@@ en@@", "subword_nmt") == "the house is green"
    assert remove_bpe("\u2581the \u2581hou se \u2581is \u2581green .", "sentencepiece") == "the house is green."
    assert remove_bpe("\u2581the \u2581green \u2581.", "sentencepiece") == "the green ."
    assert remove_bpe("a@@ b", "none") == "a@@ b"


def test_bpe_removal_through_the_cli(tmp_path, capsys, tst2013_vi):
    ref = tmp_path / "ref.txt"
    ref.write_text("the house is green.\nsmall dogs run\n", encoding="utf-8")
    sp = tmp_path / "sp.txt"
    sp.write_text("\u2581the \u2581hou se \u2581is \u2581green .\n\u2581small \u2581dog s \u2581run\n", encoding="utf-8")
    bpe = tmp_path / "bpe.txt"
    bpe.write_text("the hou@@ se is gre@@ en .\nsmall dog@@ s run\n", encoding="utf-8")
    js = tmp_path / "r.jsonl"
    for hyp, kind in ((sp, "sentencepiece"), (bpe, "subword_nmt")):
        assert _run(capsys, "--hyp", hyp, "--ref", ref, "--remove-bpe", kind, "--detok", "moses", "--lang", "en",
                    "--json-out", js)[0] == 0
    assert [r["bleu"] for r in _json_lines(js)] == [pytest.approx(100.0), pytest.approx(100.0)]
    # already-decoded text with --remove-bpe sentencepiece would lose its spaces: refused
    rc, _, err = _run(capsys, "--hyp", tst2013_vi, "--ref", tst2013_vi, "--remove-bpe", "sentencepiece")
    assert rc == 1 and "no '\u2581'" in err and "--remove-bpe none" in err
    # a collapsed model writes no '\u2581' either (the same piece, or nothing, every time):
    # its output is scored, near 0, rather than refused
    collapsed = tmp_path / "collapsed.txt"
    collapsed.write_text(". .\n\n", encoding="utf-8")
    assert _run(capsys, "--hyp", collapsed, "--ref", ref, "--remove-bpe", "sentencepiece", "--json-out", js)[0] == 0
    assert _json_lines(js)[-1]["bleu"] < 1.0


def test_compound_splitting_by_hand():
    assert split_compounds("ein Test-Fall") == "ein Test ##AT##-##AT## Fall"
    assert split_compounds("a-b c-d") == "a ##AT##-##AT## b c ##AT##-##AT## d"
    # like the perl one-liner s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: matches don't overlap
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("Nord-Süd-Achse") == "Nord ##AT##-##AT## Süd ##AT##-##AT## Achse"
    assert split_compounds("x - y -z w-") == "x - y -z w-"


def test_compound_split_bleu_counts_compound_parts(tmp_path, capsys):
    ref = tmp_path / "ref.de"
    ref.write_text("Das ist ein Test-Fall für die Nord-Süd-Verbindung.\n", encoding="utf-8")
    hyp = tmp_path / "hyp.de"
    hyp.write_text("Das ist ein Test-Ergebnis für die Nord-Süd-Verbindung.\n", encoding="utf-8")
    js = tmp_path / "r.jsonl"
    assert _run(capsys, "--hyp", hyp, "--ref", ref, "--compound-split", "--lang", "de", "--json-out", js)[0] == 0
    (r,) = _json_lines(js)
    # Moses-tokenized and split by hand:
    hyp_t = "Das ist ein Test ##AT##-##AT## Ergebnis für die Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung ."
    ref_t = "Das ist ein Test ##AT##-##AT## Fall für die Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung ."
    assert r["compound_split_bleu"] == pytest.approx(BLEU(tokenize="none").corpus_score([hyp_t], [[ref_t]]).score)
    assert r["compound_split_bleu"] > r["bleu"]  # "Test ##AT##-##AT##" still matches when split


def test_errors_are_one_line_and_append_nothing(tmp_path, capsys, tst2013_vi):
    js = tmp_path / "r.jsonl"
    short = tmp_path / "short.txt"
    short.write_text("a\nb\n", encoding="utf-8")
    gen = tmp_path / "gen.out"
    gen.write_text("H-0\t-1\ta\nD-0\t-1\ta\nD-2\t-1\tc\n", encoding="utf-8")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("eins\nzwei\ndrei Stra\u00dfen\n".encode("latin-1"))
    cases = [
        (["--hyp", latin1, "--ref", short], f"--hyp {latin1}, line 3: not valid UTF-8 at byte 19 of the file "
                                            "(invalid continuation byte)"),
        (["--hyp", tmp_path / "nope.txt", "--ref", short], "--hyp", "nope.txt: no such file"),
        (["--hyp", short, "--ref", tmp_path / "nope.ref"], "--ref", "nope.ref: no such file"),
        (["--hyp", short, "--ref", tst2013_vi], "has 2 lines", "has 1268 lines"),
        (["--hyp", gen, "--ref", short], "missing 1", "gen.out", "--required-batch-size-multiple 1"),
        (["--hyp", short, "--ref", short, "--detok", "moses"], "--detok moses needs --lang"),
        (["--hyp", short, "--ref", short, "--compound-split"], "--compound-split needs --lang"),
    ]
    for argv, *needles in cases:
        rc, out, err = _run(capsys, *argv, "--json-out", js)
        lines = err.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("resnmt-evaluate: error: "), err
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
        assert out == ""
    assert not js.exists()
    for bad, needle in ((["--detok", "nltk"], "argument --detok: invalid choice: 'nltk'"),
                        (["--tokenise", "13a"], "unrecognized arguments: --tokenise 13a")):
        with pytest.raises(SystemExit) as exc:
            main(["--hyp", str(short), "--ref", str(short), *bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_a_cut_short_hypothesis_file_is_named_as_such(tmp_path, capsys, tst2013_vi):
    """fairseq-generate's output (in its order: sentences by length, its closing line last)
    cut with ``head``, and plain hypotheses cut the same way: the error says how many are
    missing at the end, not that fairseq dropped a last partial batch."""
    refs = read_lines(tst2013_vi)[:300]
    ref = tmp_path / "ref.vi"
    ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    order = sorted(range(len(refs)), key=lambda i: (len(refs[i].split()), i))
    gen = [f"{kind}-{i}\t{text}" for i in order
           for kind, text in (("S", "src"), ("T", refs[i]), ("H", f"-0.5\t{refs[i]}"), ("D", f"-0.5\t{refs[i]}"))]
    gen.append("Generate test with beam=4: BLEU4 = 100.00, 100.0/100.0/100.0/100.0")
    whole, cut, plain = tmp_path / "gen.out", tmp_path / "gen.head.out", tmp_path / "hyp.head.txt"
    whole.write_text("\n".join(gen) + "\n", encoding="utf-8")
    cut.write_text("\n".join(gen[:4 * 200]) + "\n", encoding="utf-8")  # head -800: 200 sentences
    plain.write_text("".join(r + "\n" for r in refs[:200]), encoding="utf-8")
    assert _run(capsys, "--hyp", whole, "--ref", ref, "--quiet")[:2] == (0, "100.00\n")
    for hyp, message in ((cut, f"{cut} is cut short: it ends before fairseq-generate's closing line ('Generate ... "
                               "with beam=...'), with 200 of 300 sentences: 100 missing at the end"),
                         (plain, f"--hyp {plain} has 200 lines but --ref {ref} has 300 lines: 100 lines missing at "
                                 "the end of --hyp")):
        rc, _, err = _run(capsys, "--hyp", hyp, "--ref", ref)
        assert rc == 1 and len(err.splitlines()) == 1 and message in err and "partial batch" not in err, err


def test_console_script_on_fairseq_generate_output(tmp_path):
    # the installed entry point, and a real generate-style file with escapes in H lines
    gen = tmp_path / "gen.out"
    gen.write_text("H-1\t-1.0\tb &apos;s\nD-1\t-1.0\tb 's\nH-0\t-1.0\ta &quot;x&quot;\nD-0\t-1.0\ta \"x\"\n",
                   encoding="utf-8")
    ref = tmp_path / "ref.txt"
    ref.write_text("a &quot;x&quot;\nb &apos;s\n", encoding="utf-8")
    proc = run_cli(["resnmt-evaluate", "--hyp", gen, "--ref", ref, "--quiet"])
    assert proc.stdout.strip() == "100.00"


def test_a_score_that_means_nothing_is_flagged_after_it_and_fails_with_strict(tmp_path, capsys, tst2013_vi):
    """A model that has not learned yet: "." for most sentences (what 60 updates with the
    small preset's 500 warm-up updates gave), or a word repeated to the length limit. Each
    sign is one warning line after the score, in the JSON result too; --strict exits 1."""
    refs = read_lines(tst2013_vi)[:200]
    ref = tmp_path / "ref"
    ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    dots = tmp_path / "dots"
    dots.write_text("".join(("." if i % 100 else refs[i]) + "\n" for i in range(200)), encoding="utf-8")
    rc, out, err = _run(capsys, "--hyp", dots, "--ref", ref, "--json-out", tmp_path / "r.jsonl")
    result = _json_lines(tmp_path / "r.jsonl")[-1]
    assert rc == 0 and "sacreBLEU" in out and result["length_ratio"] < 0.5
    assert err.splitlines()[-2:] == [f"resnmt-evaluate: warning: {w}" for w in result["warnings"]]
    assert result["warnings"] == [
        f"the hypotheses are shorter than the references (length ratio {result['length_ratio']:.3f}, outside 0.5-2): "
        f"the model does not translate yet and BLEU {result['bleu']:.2f} measures nothing; train longer (or check "
        "the decoding's --max-len-a/--max-len-b)",
        f"198 of 200 hypotheses are the same sentence ('.'): the model does not translate yet and BLEU "
        f"{result['bleu']:.2f} measures nothing; train longer"]
    rc, out, err = _run(capsys, "--hyp", dots, "--ref", ref, "--strict", "--quiet")
    assert rc == 1 and out.strip() == f"{result['bleu']:.2f}"  # the score all the same, then why exit 1
    assert err.splitlines()[-3:] == [*(f"resnmt-evaluate: warning: {w}" for w in result["warnings"]),
                                     "resnmt-evaluate: error: --strict: the score is flagged as meaningless (the "
                                     "warnings above), so the exit status is 1"]

    repeated = tmp_path / "repeated"
    repeated.write_text("".join(" ".join([r] * 3) + "\n" for r in refs), encoding="utf-8")
    rc, _, err = _run(capsys, "--hyp", repeated, "--ref", ref, "--strict")
    # BLEU 32: a score that looks like one, from a sentence repeated three times
    assert rc == 1 and "are longer than the references (length ratio 3.0" in err.splitlines()[-2]
    assert err.splitlines()[-1] == ("resnmt-evaluate: error: --strict: the score is flagged as meaningless (the "
                                    "warning above), so the exit status is 1")
    assert sum("warning: " in line for line in err.splitlines()) == 1
    # a real translation (here the reference, perturbed): no warning, exit 0 with --strict
    good = tmp_path / "good"
    good.write_text("".join(h + "\n" for h in perturb(refs)), encoding="utf-8")
    rc, _, err = _run(capsys, "--hyp", good, "--ref", ref, "--strict", "--json-out", tmp_path / "r.jsonl")
    assert rc == 0 and "warning" not in err
    assert _json_lines(tmp_path / "r.jsonl")[-1]["warnings"] == []
