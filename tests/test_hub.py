"""resnmt.from_pretrained on a model trained on sentencepiece data: plain text in, the same
translation out as fairseq-generate with the same search (GNMT penalty included); a wrong
--post-process is caught by resnmt-evaluate; fairseq's commands run without hydra's notices."""
import sys
from types import SimpleNamespace

import pytest

from conftest import REPO_ROOT, built_once, run_cli
from subword_data import prepared_once

import resnmt
from resnmt.decoding.sequence_generator import GNMTLengthPenaltyMixin

USER_DIR = str(REPO_ROOT / "resnmt")
SIZE = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
SEARCH = ["--beam", "4", "--lenpen", "0.6", "--max-len-b", "12"]


def kept_output(proc, directory):
    """A finished command's stdout and stderr, kept in ``directory`` for the other workers."""
    (directory / "stdout").write_text(proc.stdout, encoding="utf-8")
    (directory / "stderr").write_text(proc.stderr, encoding="utf-8")


def read_output(directory) -> SimpleNamespace:
    return SimpleNamespace(**{name: (directory / name).read_text(encoding="utf-8") for name in ("stdout", "stderr")})


@pytest.fixture(scope="module")
def spm_run(tmp_path_factory):
    """(prepared sentencepiece directory, save dir of a model trained on it by resnmt-train with
    fairseq's own translation task, resnmt-train's output); built once per test run. 120 updates:
    enough for outputs of real pieces that differ between sentences (fewer give the same piece everywhere)."""
    data = prepared_once(tmp_path_factory, "sentencepiece")  # test_subword's too

    def train(root):
        kept_output(run_cli([
            "resnmt-train", data / "bin", "--task", "translation",
            "--arch", "transformer_sas_base", *SIZE, "--share-all-embeddings", "--optimizer", "adam", "--lr", "5e-3",
            "--max-tokens", "2000", "--max-update", "120", "--save-dir", root / "model", "--no-epoch-checkpoints",
            "--disable-validation", "--no-progress-bar", "--seed", "1", "--num-workers", "0"]), root)

    root = built_once(tmp_path_factory, "hub_spm_run", train)
    return data, root / "model", read_output(root)


@pytest.fixture(scope="module")
def generated(spm_run, tmp_path_factory):
    """fairseq-generate's output for the test set, beam 4 with the GNMT penalty, sentencepiece removed."""
    data, save_dir, _ = spm_run
    return read_output(built_once(tmp_path_factory, "hub_generated", lambda root: kept_output(generate(
        data, save_dir, "--task", "resnmt_translation", "--lenpen-form", "gnmt", *SEARCH,
        "--post-process", "sentencepiece"), root)))


def generate(data, save_dir, *flags):
    return run_cli(["fairseq-generate", data / "bin", "--user-dir", USER_DIR, "--path", save_dir / "checkpoint_last.pt",
                    "--gen-subset", "test", "--batch-size", "1", "--num-workers", "0", *flags])


def d_lines(stdout):
    out = {}
    for line in stdout.splitlines():
        if line.startswith("D-"):
            sid, _, text = line[2:].split("\t", 2)
            out[int(sid)] = text
    return [out[i] for i in range(len(out))]


def test_from_pretrained_translates_as_fairseq_generate_does(spm_run, generated):
    data, save_dir, _ = spm_run
    expected = d_lines(generated.stdout)
    sources = (data / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    assert len(expected) == len(sources) == 10

    # the prepared directory gives the dictionaries and the sentencepiece model (no bpe= needed)
    hub = resnmt.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data),
                                 lenpen_form="gnmt", lenpen=0.6)
    assert hub.cfg.bpe._name == "sentencepiece" and hub.cfg.bpe.sentencepiece_model == str(data / "spm" / "spm.model")
    assert isinstance(hub.task.build_generator(hub.models, hub.cfg.generation), GNMTLengthPenaltyMixin)
    translations = [hub.translate(s, beam=4, max_len_b=12) for s in sources]
    assert translations == expected
    assert len(set(translations)) > 1 and all(t.split() for t in translations)  # real, varied outputs
    assert not any("\u2581" in t for t in translations)
    # the documented explicit form gives the same
    explicit = resnmt.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt",
                                      data_name_or_path=str(data / "bin"), bpe="sentencepiece",
                                      sentencepiece_model=str(data / "spm" / "spm.model"), lenpen_form="gnmt")
    assert explicit.translate(sources[0], beam=4, lenpen=0.6, max_len_b=12) == expected[0]


def test_translate_logs_no_batching_lines_unless_verbose(spm_run, caplog):
    """fairseq logs 4 INFO lines each time it batches sentences (can_reuse_epoch_itr = ...,
    creating new batches ...), so at every translate(): not by resnmt's hub unless verbose
    (the interface's, or the call's own); fairseq's other lines are untouched."""
    import logging

    data, save_dir, _ = spm_run
    hub = resnmt.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data))
    loud = resnmt.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data),
                                  verbose=True)

    def batching_lines(call):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            call()
        return [r.getMessage() for r in caplog.records if r.name == "fairseq.tasks.fairseq_task"]

    assert batching_lines(lambda: hub.translate("a dog runs .", beam=2, max_len_b=5)) == []
    expected = ["can_reuse_epoch_itr = False", "reuse_dataloader = True", "rebuild_batches = False",
                "creating new batches for epoch 1"]
    assert batching_lines(lambda: loud.translate("a dog runs .", beam=2, max_len_b=5)) == expected
    assert batching_lines(lambda: hub.translate("a dog runs .", beam=2, max_len_b=5, verbose=True)) == expected
    assert batching_lines(lambda: hub.translate("a dog runs .", beam=2, max_len_b=5)) == []  # the filter is gone


def test_from_pretrained_refuses_a_bpe_the_data_was_not_made_with(spm_run):
    data, save_dir, _ = spm_run
    with pytest.raises(ValueError, match=r"^bpe='subword_nmt' does not match the data in .*: it is sentencepiece data"):
        resnmt.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data),
                               bpe="subword_nmt")
    with pytest.raises(ValueError, match=r"^lenpen_form 'wu' is not one of: fairseq gnmt$"):
        resnmt.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data),
                               lenpen_form="wu")


def test_fairseqs_own_loader_needs_import_resnmt(spm_run):
    """Without resnmt imported, fairseq's TransformerModel.from_pretrained cannot unpickle the
    checkpoint (documented: import resnmt first, or pass user_dir=); with it, it loads."""
    data, save_dir, _ = spm_run
    code = (f"from fairseq.models.transformer import TransformerModel\n"
            f"hub = TransformerModel.from_pretrained({str(save_dir)!r}, checkpoint_file='checkpoint_last.pt', "
            f"data_name_or_path={str(data / 'bin')!r}, bpe='sentencepiece', "
            f"sentencepiece_model={str(data / 'spm' / 'spm.model')!r})\n"
            f"print('OK', hub.translate('a dog runs .', beam=2, max_len_b=5) is not None)\n")
    bare = run_cli([sys.executable, "-c", code], check=False, cwd=save_dir)
    assert bare.returncode != 0 and "argparse.Namespace" in bare.stderr
    ok = run_cli([sys.executable, "-c", "import resnmt\n" + code], cwd=save_dir)
    assert "OK True" in ok.stdout
    assert "pin_memory" not in ok.stderr  # torch's notice at every batch iterator of a CPU run: not shown


def test_sentencepiece_output_left_in_pieces_is_flagged_by_evaluate(spm_run, tmp_path):
    """The README's old decode line on sentencepiece data: --post-process subword_nmt keeps
    the pieces; resnmt-evaluate still scores it but its last line names the fix."""
    data, save_dir, _ = spm_run
    gen = tmp_path / "gen.out"
    gen.write_text(generate(data, save_dir, "--task", "resnmt_translation", *SEARCH,
                                 "--post-process", "subword_nmt").stdout, encoding="utf-8")
    proc = run_cli(["resnmt-evaluate", "--hyp", gen, "--ref", data / "raw" / "test.de"])
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("resnmt-evaluate: warning: 10 of 10 hypotheses still hold sentencepiece pieces")
    assert last.endswith("score with --remove-bpe sentencepiece, or decode with fairseq-generate "
                         "--post-process sentencepiece")


def test_resnmt_train_and_fairseq_generate_print_no_deprecation_notices(spm_run, generated):
    """resnmt-train, and fairseq-generate --user-dir resnmt: hydra's ~24 lines of migration
    notices, torch's deprecations of fairseq's calls and hydra's DEBUG lines are gone;
    fairseq's own log is not."""
    _, _, train = spm_run
    for stderr in (train.stderr, generated.stderr):
        lines = stderr.splitlines()
        assert not [line for line in lines if "deprecat" in line.lower()]
        assert not [line for line in lines if "Warning" in line and "hydra" in line]
    # resnmt-train logs as fairseq-train does (its format, INFO, on stdout), not at the
    # DEBUG level importing fairseq leaves behind
    assert "| INFO | fairseq_cli.train | done training in" in train.stdout
    assert "DEBUG" not in train.stdout + train.stderr
    # fairseq-generate's lines in fairseq-train's format too, not the logging module's default
    assert "| INFO | fairseq_cli.generate | Translated 10 sentences" in generated.stderr
    assert not [line for line in generated.stderr.splitlines() if line.startswith("INFO:")]
    assert "DEBUG" not in generated.stderr  # the level importing fairseq left, lowered by import resnmt


def test_moses_tokenized_data_gets_fairseqs_moses_tokenizer(tmp_path):
    """WMT'14 is Moses-tokenized before its subwords: the hub tokenizes input and detokenizes
    output the same way (unless the caller picked a tokenizer)."""
    from resnmt.data.corpora import DATASETS
    from resnmt.data.manifest import write_manifest
    from resnmt.hub import moses_overrides

    write_manifest(tmp_path, DATASETS["wmt14-en-de"], "subword_nmt", "bpe/bpe.codes")
    assert moses_overrides(str(tmp_path / "bin"), {}) == {
        "tokenizer": "moses", "moses_source_lang": "en", "moses_target_lang": "de"}
    assert moses_overrides(str(tmp_path), {"tokenizer": "space"}) == {}
    write_manifest(tmp_path, DATASETS["multi30k"], "sentencepiece", "spm/spm.model")
    assert moses_overrides(str(tmp_path), {}) == {}
