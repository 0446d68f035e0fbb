"""resnmt-export: CTranslate2 models of the kinds CTranslate2 computes exactly decode to
fairseq-generate's hypotheses and scores (float32, beam 4, models trained on real
Multi30k sentences); every other kind is refused in one line naming it; the
torch.export artifact of every kind decodes to fairseq-generate's hypotheses in a
process where resnmt cannot be imported."""
import math
import subprocess
import sys

import ctranslate2  # requirements-dev.txt: the CTranslate2 tests run wherever the suite runs
import pytest
import torch

from conftest import REPO_ROOT, built_once, run_cli
from model_utils import build

from resnmt.cli import export as export_cli
from resnmt.connections import BUILTIN_KINDS, connection_class
from resnmt.export.ctranslate2 import ctranslate2_refusal

USER_DIR = str(REPO_ROOT / "resnmt")
SIZE = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
BEAM = 4


def trained(tmp_path_factory, tiny_bin, name, *flags, updates=100):
    """The save dir of a 2+2 d=32 model of ``flags`` trained ``updates`` updates on the tiny corpus
    (enough for hypotheses of real words that differ between sentences, none running to the length limit,
    where fairseq forces an EOS and CTranslate2 stops without one); built once per run."""
    def train(root):
        run_cli(["fairseq-train", tiny_bin, "--user-dir", USER_DIR, "--task", "resnmt_translation",
                 "--arch", "resnmt_transformer", *flags, *SIZE, "--share-all-embeddings", "--optimizer", "adam",
                 "--lr", "5e-3", "--max-tokens", "2000", "--max-update", str(updates), "--save-dir", root,
                 "--no-epoch-checkpoints", "--disable-validation", "--no-progress-bar", "--seed", "1",
                 "--num-workers", "0", "--cpu"])

    return built_once(tmp_path_factory, f"export_{name}", train)


def fairseq_hypotheses(tiny_bin, checkpoint):
    """{sentence id: (tokens, score in nats per token)} of fairseq-generate with fairseq's own beam
    search, beam 4, the test set."""
    out = run_cli(["fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--task", "resnmt_translation",
                   "--beam-search", "fairseq", "--path", checkpoint, "--gen-subset", "test", "--beam", str(BEAM), "--batch-size", "16",
                   "--num-workers", "0", "--cpu"]).stdout
    hyps = {}
    for line in out.splitlines():
        if line.startswith("H-"):
            sid, score, text = line[2:].split("\t")
            hyps[int(sid)] = (text.split(), float(score) * math.log(2))  # fairseq prints base-2 scores
    return hyps


def source_sentences(task):
    task.load_dataset("test")
    data = task.dataset("test")
    return [[task.source_dictionary[i] for i in data[k]["source"][:-1]] for k in range(len(data))]


# post-LN in the default suite; pre-LN (which trains a model of its own) with the slow tests
@pytest.mark.parametrize("kind,normalization", [("post_ln", "layer_norm"),
                                                pytest.param("pre_ln", "layer_norm", marks=pytest.mark.slow),
                                                pytest.param("pre_ln", "rms_norm", marks=pytest.mark.slow)])
def test_ctranslate2_export_decodes_as_fairseq_generate(tiny_bin, tmp_path_factory, tmp_path, kind, normalization):
    save_dir = trained(tmp_path_factory, tiny_bin, f"{kind}_{normalization}", "--residual", kind,
                       "--normalization", normalization)
    checkpoint = save_dir / "checkpoint_last.pt"
    output = tmp_path / "ct2"
    assert export_cli.main(["--path", str(checkpoint), "--data", str(tiny_bin), "--format", "ctranslate2",
                            "--output", str(output)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no scratch folder left beside it
    expected = fairseq_hypotheses(tiny_bin, checkpoint)
    _, task, _ = build(tiny_bin, "resnmt_transformer")
    sources = source_sentences(task)
    assert len(expected) == len(sources) == 60
    translator = ctranslate2.Translator(str(output), device="cpu", intra_threads=1)
    results = translator.translate_batch(sources, beam_size=BEAM, max_batch_size=16, return_scores=True,
                                         max_decoding_length=200)
    got = {k: (r.hypotheses[0], r.scores[0]) for k, r in enumerate(results)}
    assert len({" ".join(tokens) for tokens, _ in expected.values()}) > 20  # real, varied translations
    assert max(len(tokens) for tokens, _ in expected.values()) < 200  # none cut at the length limit (200)
    assert [got[k][0] for k in range(60)] == [expected[k][0] for k in range(60)]
    for k in range(60):
        # CTranslate2's beam search sums log-probabilities of its own kernels (its score_batch gives
        # fairseq's per-token values to 1e-5; its search's totals differ by up to 0.5 %)
        assert got[k][1] == pytest.approx(expected[k][1], rel=1e-2)


def test_ctranslate2_export_keeps_a_finished_export(tiny_bin, tmp_path_factory, tmp_path, capsys):
    save_dir = trained(tmp_path_factory, tiny_bin, "post_ln_layer_norm", "--residual", "post_ln",
                       "--normalization", "layer_norm")
    argv = ["--path", str(save_dir / "checkpoint_last.pt"), "--data", str(tiny_bin), "--format", "ctranslate2",
            "--output", str(tmp_path / "ct2")]
    assert export_cli.main(argv) == 0
    written = (tmp_path / "ct2" / "model.bin").stat().st_mtime_ns
    capsys.readouterr()
    assert export_cli.main(argv) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("kept (--force writes it again)")
    assert (tmp_path / "ct2" / "model.bin").stat().st_mtime_ns == written


@pytest.mark.parametrize("kind", BUILTIN_KINDS)
def test_ctranslate2_holds_post_ln_pre_ln_and_peri_ln_and_names_every_other_kind(tiny_bin, kind):
    model, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind])
    refusal = ctranslate2_refusal(model)
    if kind in ("post_ln", "pre_ln", "peri_ln"):
        assert refusal is None
    else:
        assert f"--residual {kind} ({connection_class(kind).equation})" in refusal
        assert "\n" not in refusal and refusal.endswith("export it with --format torch-export")


@pytest.mark.parametrize("flags", [["--residual", "peri_ln"], ["--residual", "peri_ln", "--normalization", "rms_norm"],
                                   ["--encoder-residual", "post_ln", "--decoder-residual", "pre_ln"]])
def test_ctranslate2_computes_what_the_model_computes(tiny_bin, tmp_path, flags):
    """CTranslate2's log-probabilities of the reference translations (its score_batch) are the
    model's own, its norms given values away from their initialisation (Peri-LN's input and
    output norms each in their place)."""
    from model_utils import randomize_norms, sample_batch
    from resnmt.export.ctranslate2 import export_ctranslate2

    model, task, _ = build(tiny_bin, "resnmt_transformer", flags)
    randomize_norms(model)
    model.eval()
    export_ctranslate2(model, task, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    sample = sample_batch(task, n=4, split="test")
    d, pad = task.source_dictionary, task.source_dictionary.pad()
    for src, tgt in zip(sample["net_input"]["src_tokens"], sample["target"]):
        src, tgt = src[src.ne(pad)], tgt[tgt.ne(pad)]
        prev = torch.cat([tgt.new_tensor([d.eos()]), tgt[:-1]])
        with torch.no_grad():
            out = model(src[None], torch.tensor([len(src)]), prev[None])
            expected = model.get_normalized_probs(out, log_probs=True)[0].gather(-1, tgt[:, None])[:, 0]
        got = translator.score_batch([[d[i] for i in src[:-1]]], [[d[i] for i in tgt[:-1]]])[0].log_probs
        assert got == pytest.approx(expected.tolist(), abs=1e-4)


def test_ctranslate2_refuses_dyt_and_normalized_activations(tiny_bin):
    dyt, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "pre_ln", "--normalization", "dyt"])
    assert ctranslate2_refusal(dyt).startswith("--format ctranslate2 cannot hold --normalization dyt")
    nrelu, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "post_ln", "--normalized-activation", "nrelu"])
    assert "a normalized activation (--normalized-activation)" in ctranslate2_refusal(nrelu)
    stock, _, _ = build(tiny_bin, "transformer")  # fairseq's own
    assert ctranslate2_refusal(stock) is None


def test_resnmt_export_refuses_another_kind_in_one_line(tiny_bin, tmp_path_factory, tmp_path):
    save_dir = trained(tmp_path_factory, tiny_bin, "deepnorm", "--residual", "deepnorm", updates=1)
    proc = run_cli([sys.executable, "-m", "resnmt.cli.export", "--path", save_dir / "checkpoint_last.pt",
                    "--data", tiny_bin, "--format", "ctranslate2", "--output", tmp_path / "out"], check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "resnmt-export: error: --format ctranslate2 cannot hold the encoder's --residual deepnorm "
        f"({connection_class('deepnorm').equation}): CTranslate2's Transformer layer computes LN(x + F) (post_ln), "
        "x + F(LN(x)) (pre_ln) or x + LN(F(LN(x))) (peri_ln) only, with LayerNorm or RMSNorm; "
        "export it with --format torch-export")
    assert list(tmp_path.iterdir()) == []  # nothing written


# ------------------------------------------------------------------------------- torch.export

# a process where neither resnmt nor fairseq can be imported: the artifact's runner.py alone
WITHOUT_RESNMT = ("import runpy, sys\n"
                  "sys.modules['resnmt'] = sys.modules['fairseq'] = None  # import resnmt / fairseq: ImportError\n"
                  "sys.argv = sys.argv[1:]\n"
                  "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def test_torch_export_decodes_as_fairseq_generate_where_resnmt_cannot_be_imported(tiny_bin, tmp_path_factory,
                                                                                    tmp_path):
    save_dir = trained(tmp_path_factory, tiny_bin, "post_ln_layer_norm", "--residual", "post_ln",
                       "--normalization", "layer_norm")
    checkpoint = save_dir / "checkpoint_last.pt"
    artifact = tmp_path / "torch"
    assert export_cli.main(["--path", str(checkpoint), "--data", str(tiny_bin), "--format", "torch-export",
                            "--output", str(artifact)]) == 0
    expected = fairseq_hypotheses(tiny_bin, checkpoint)
    _, task, _ = build(tiny_bin, "resnmt_transformer")
    source = "\n".join(" ".join(words) for words in source_sentences(task)) + "\n"
    proc = subprocess.run([sys.executable, "-c", WITHOUT_RESNMT, str(artifact / "runner.py"), str(artifact)],
                          input=source, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [line.split() for line in proc.stdout.splitlines()]
    assert got == [expected[k][0] for k in range(60)]


def exported_search_equals_fairseqs(tiny_bin, tmp_path, kind):
    """The artifact of a 2+2 d=16 ``kind`` model (random weights) decodes the first 8 test sentences
    (beam 4, at most 12 tokens) to fairseq's SequenceGenerator's hypotheses and scores, with the
    runner's search and with resnmt's fast beam search over the same programs."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    from model_utils import move_connections_off_init, randomize_norms, sample_batch
    from resnmt.decoding.fast_beam import SearchOptions, beam_search as fast_beam_search
    from resnmt.export import runner
    from resnmt.export.torch_program import export_programs

    model, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind])
    randomize_norms(model)
    move_connections_off_init(model)
    model.eval()
    export_programs(model, task, tmp_path / "torch", log=lambda _: None)
    sample = sample_batch(task, n=8, split="test")
    tgt = task.target_dictionary
    generator = SequenceGenerator([model], tgt, beam_size=BEAM, max_len_b=12, search_strategy=search.BeamSearch(tgt))
    with torch.no_grad():
        expected = generator.generate([model], sample)
    stepper = runner.ProgramStepper(tmp_path / "torch")
    src = sample["net_input"]["src_tokens"]
    with torch.no_grad():
        got = runner.beam_search(stepper, src, BEAM, tgt.pad(), tgt.eos(), tgt.unk(), max_len_b=12)
        fast = fast_beam_search(stepper, src, sample["net_input"]["src_lengths"],
                                SearchOptions(beam=BEAM, max_len_b=12), tgt)
    for mine, theirs, fast_hyps in zip(got, expected, fast):
        assert [h["tokens"].tolist() for h in mine] == [h["tokens"].tolist() for h in theirs]
        assert [h["tokens"].tolist() for h in fast_hyps] == [h["tokens"].tolist() for h in theirs]
        assert [h["score"] for h in mine] == pytest.approx([float(h["score"]) for h in theirs], abs=1e-4)


@pytest.mark.slow  # with test_torch_export_of_every_kind; post-LN's artifact is decoded in the default suite
@pytest.mark.parametrize("kind", ["hyper", "hybrid_norm"])
def test_torch_export_of_a_multi_stream_kind_and_one_with_its_own_attention(tiny_bin, tmp_path, kind):
    exported_search_equals_fairseqs(tiny_bin, tmp_path, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BUILTIN_KINDS)
def test_torch_export_of_every_kind(tiny_bin, tmp_path, kind):
    exported_search_equals_fairseqs(tiny_bin, tmp_path, kind)
