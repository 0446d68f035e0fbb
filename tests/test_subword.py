"""Decoding undoes the data's own subword model, and scoring says when nobody did: the
subword model read from a prepared directory, a mismatching --post-process refused, and
resnmt-evaluate's warning on real Multi30k references left in sentencepiece pieces or BPE."""
import gzip

import pytest

from conftest import run_cli, shared_data_dir
from subword_data import prepared_once, sentencepiece_of, subword_nmt_of

from resnmt.cli.evaluate import main as evaluate_main
from resnmt.decoding.subword import SubwordError, data_subword, decode_post_process, hub_overrides, post_process_flag


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    return prepared_once(tmp_path_factory, "sentencepiece")


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return prepared_once(tmp_path_factory, "subword_nmt")


@pytest.fixture(scope="module")
def references():
    """The first 200 references of the real Multi30k test2016 (German, untokenized)."""
    with gzip.open(shared_data_dir("multi30k") / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(200)]


def test_the_subword_model_is_read_from_the_prepared_directory(spm_dir, bpe_dir, tiny_bin):
    assert data_subword(spm_dir) == ("sentencepiece", spm_dir / "spm" / "spm.model")
    assert data_subword(spm_dir / "bin") == ("sentencepiece", spm_dir / "spm" / "spm.model")
    assert data_subword(bpe_dir) == ("subword_nmt", bpe_dir / "bpe" / "bpe.codes")
    assert data_subword(tiny_bin.parent) is None  # word-level data: nothing to undo


@pytest.mark.parametrize("flags, value", [
    ([], None), (["--beam", "2"], None),
    (["--post-process", "sentencepiece"], "sentencepiece"), (["--post-process=subword_nmt"], "subword_nmt"),
    (["--remove-bpe"], "subword_nmt"), (["--remove-bpe", "--beam", "2"], "subword_nmt"),  # fairseq's const
    (["--post-process", "subword_nmt", "--remove-bpe", "sentencepiece"], "sentencepiece"),  # the last wins
])
def test_the_post_process_flag_is_read_as_fairseq_reads_it(flags, value):
    assert post_process_flag(flags) == value


def test_decoding_post_processes_with_the_datas_model_and_refuses_another(spm_dir, bpe_dir, tiny_bin):
    assert decode_post_process(spm_dir) == "sentencepiece"
    assert decode_post_process(spm_dir / "bin", ["--max-len-b", "20", "--post-process", "sentencepiece"]) == "sentencepiece"
    assert decode_post_process(bpe_dir, ["--remove-bpe"]) == "subword_nmt"
    assert decode_post_process(bpe_dir, ["--post-process", "@@ "]) == "subword_nmt"
    with pytest.raises(SubwordError) as refused:
        decode_post_process(spm_dir, ["--post-process", "subword_nmt"])
    assert str(refused.value) == (
        f"--post-process subword_nmt does not undo the segmentation of {spm_dir}: it is sentencepiece data; "
        "use --post-process sentencepiece, or leave the flag out")
    with pytest.raises(SubwordError, match="--post-process none does not undo .* it is subword_nmt data"):
        decode_post_process(bpe_dir, ["--post-process", "none"])
    # data without a subword model: whatever was asked for, unchecked
    assert decode_post_process(tiny_bin.parent) is None
    assert decode_post_process(tiny_bin.parent, ["--remove-bpe"]) == "subword_nmt"


def test_the_pipeline_decodes_with_the_datas_model_and_refuses_another_before_training(spm_dir, tmp_path):
    """resnmt-experiment on a sentencepiece directory: the plan decodes with --post-process
    sentencepiece; --gen-args naming another (fairseq would take the last) is refused, as the
    last line, before anything is trained."""
    base = ["resnmt-experiment", "--save-dir", tmp_path / "run", "--results", tmp_path / "results.jsonl"]
    plan = run_cli([*base, "--dry-run", spm_dir, "transformer_sas_base"]).stdout
    assert "--post-process sentencepiece" in plan
    for dry_run in (["--dry-run"], []):
        proc = run_cli([*base, *dry_run, "--gen-args", "--max-len-b 20 --post-process subword_nmt",
                        spm_dir, "transformer_sas_base"], check=False)
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1] == (
            f"[resnmt-experiment] error: --gen-args: --post-process subword_nmt does not undo the segmentation of "
            f"{spm_dir}: it is sentencepiece data; use --post-process sentencepiece, or leave the flag out")
        assert not list(tmp_path.glob("run/*.pt")) and not (tmp_path / "run" / "train.done").exists()


def test_the_hubs_bpe_arguments_come_from_the_data(spm_dir, bpe_dir, tiny_bin):
    model = str(spm_dir / "spm" / "spm.model")
    assert hub_overrides(spm_dir / "bin") == {"bpe": "sentencepiece", "sentencepiece_model": model}
    assert hub_overrides(bpe_dir) == {"bpe": "subword_nmt", "bpe_codes": str(bpe_dir / "bpe" / "bpe.codes")}
    assert hub_overrides(spm_dir, "sentencepiece", "/elsewhere/spm.model")["sentencepiece_model"] == "/elsewhere/spm.model"
    with pytest.raises(SubwordError, match=r"bpe='subword_nmt' does not match the data .* it is sentencepiece data"):
        hub_overrides(spm_dir, "subword_nmt")
    assert hub_overrides(tiny_bin) == {}
    assert hub_overrides(tiny_bin, "subword_nmt", "codes") == {"bpe": "subword_nmt", "bpe_codes": "codes"}


def _evaluate(capsys, tmp_path, hyps, refs, *flags):
    (tmp_path / "hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (tmp_path / "ref").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    capsys.readouterr()
    rc = evaluate_main(["--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref"), *flags])
    out = capsys.readouterr()
    return rc, out.out, out.err.splitlines()


def test_evaluate_warns_when_sentencepiece_pieces_are_left(spm_dir, references, tmp_path, capsys):
    """The README's old mistake: sentencepiece data decoded with --post-process subword_nmt
    keeps its pieces ('▁ein ▁mann ...'); it used to score near 0 with a hint at --detok."""
    _, segment = sentencepiece_of(spm_dir)  # the data's own model
    pieces = [segment(r) for r in references]
    rc, out, err = _evaluate(capsys, tmp_path, pieces, references)
    assert rc == 0 and out  # scored as asked (a warning, not a refusal)
    assert err[-1] == (
        "resnmt-evaluate: warning: 200 of 200 hypotheses still hold sentencepiece pieces ('\u2581'): their "
        "segmentation was not undone and BLEU is meaningless; score with --remove-bpe sentencepiece, or decode "
        "with fairseq-generate --post-process sentencepiece")
    assert not any("--detok moses" in line for line in err)  # no hint at the wrong fix
    # the BPE removal asked for instead: named as the thing to replace
    _, _, err = _evaluate(capsys, tmp_path, pieces, references, "--remove-bpe", "subword_nmt")
    assert "score with --remove-bpe sentencepiece instead of subword_nmt" in err[-1]
    # the right one: 100 BLEU, no warning
    rc, out, err = _evaluate(capsys, tmp_path, pieces, references, "--remove-bpe", "sentencepiece", "--quiet")
    assert (rc, out, err) == (0, "100.00\n", [])


def test_evaluate_warns_when_bpe_markers_are_left(bpe_dir, references, tmp_path, capsys):
    _, segment = subword_nmt_of(bpe_dir)  # the data's own codes
    pieces = [segment(r) for r in references]
    marked = sum("@@ " in p for p in pieces)
    assert marked > 100  # a real segmentation: most lines split some word
    _, _, err = _evaluate(capsys, tmp_path, pieces, references)
    assert err[-1].startswith(f"resnmt-evaluate: warning: {marked} of 200 hypotheses still hold BPE markers ('@@ ')")
    assert err[-1].endswith("score with --remove-bpe subword_nmt, or decode with fairseq-generate --post-process subword_nmt")
    rc, out, err = _evaluate(capsys, tmp_path, pieces, references, "--remove-bpe", "subword_nmt", "--quiet")
    assert (rc, out, err) == (0, "100.00\n", [])
