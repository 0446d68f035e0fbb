"""resnmt's fast beam search (resnmt/decoding/fast_beam.py) returns fairseq's hypotheses and
scores: every kind (and the example's own kind) against fairseq's SequenceGenerator on real
Multi30k sentences in float32, each search option against fairseq's, the task's generator
choosing it (or saying why not), and fairseq-generate end to end."""
import math

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from conftest import REPO_ROOT, run_cli
from model_utils import TINY, build, move_connections_off_init, randomize_norms, sample_batch

from resnmt.connections import BUILTIN_KINDS
from resnmt.decoding.fast_beam import FastSequenceGenerator, ResNMTStepper, SearchOptions, beam_search
from resnmt.decoding.sequence_generator import with_gnmt_penalty

USER_DIR = str(REPO_ROOT / "resnmt")
SENTENCES = 24
STUDY = dict(beam_size=4, max_len_a=1, max_len_b=3, len_penalty=0.6)  # the study's search, shorter outputs


def model_of(tiny_bin, flags, seed=1):
    """A tiny model of ``flags``, off its init (norms, connection weights), whose EOS is likely
    enough that hypotheses end at many lengths (so finishing and dropping sentences is tested)."""
    model, task, _ = build(tiny_bin, "resnmt_transformer", flags, seed=seed)
    randomize_norms(model, seed)
    move_connections_off_init(model, seed)
    with torch.no_grad():
        weight = model.decoder.output_projection.weight
        weight[task.target_dictionary.eos()] = weight.mean(dim=0) + 2.0 * weight[task.target_dictionary.eos()]
    return model.eval(), task


def batches(task, size=8):
    task.load_dataset("test")
    ds = task.dataset("test")
    return [ds.collater([ds[i] for i in range(start, min(start + size, SENTENCES))])
            for start in range(0, SENTENCES, size)]


def step_tokens_only(blocker):
    """fairseq 0.12's n-gram blocker reading the hypotheses' tokens up to the step, as its CUDA
    kernel does: its Python path (the CPU's, and the GPU's without the kernel built) is given
    the whole token buffer and compares the n-grams with the padding at its end, blocking
    nothing. The fast search blocks as fairseq documents and its kernel does."""
    python_path = blocker._no_repeat_ngram
    blocker.forward = lambda tokens, lprobs, bsz, beam, step: python_path(tokens[:, : step + 1], lprobs, bsz, beam,
                                                                         step)


def decode_both(model, task, gnmt=True, **options):
    """(fairseq's n-best lists, the fast search's) for the test sentences."""
    tgt = task.target_dictionary
    classes = (SequenceGenerator, FastSequenceGenerator)
    if gnmt:
        classes = tuple(with_gnmt_penalty(c) for c in classes)
    ref, fast = (cls([model], tgt, search_strategy=search.BeamSearch(tgt), **options) for cls in classes)
    assert fast.path == "fast", fast.fallback
    if ref.repeat_ngram_blocker is not None:
        step_tokens_only(ref.repeat_ngram_blocker)
    out_ref, out_fast = [], []
    with torch.no_grad():
        for sample in batches(task):
            out_ref += ref.generate([model], sample)
            out_fast += fast.generate([model], sample)
    return out_ref, out_fast


def assert_same_hypotheses(ref, fast):
    assert len(ref) == len(fast) == SENTENCES
    for sent, (a, b) in enumerate(zip(ref, fast)):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b], f"sentence {sent}"
        for x, y in zip(a, b):
            torch.testing.assert_close(y["score"], x["score"], rtol=1e-4, atol=1e-4)
            # positional scores are differences of running sums: compared as the sums
            torch.testing.assert_close(y["positional_scores"].cumsum(0), x["positional_scores"].cumsum(0),
                                       rtol=1e-4, atol=1e-4)


def lengths(hypos):
    return {len(h["tokens"]) for sent in hypos for h in sent}


@pytest.mark.parametrize("kind", [*BUILTIN_KINDS, "layerscale"])
def test_every_kind_decodes_fairseqs_hypotheses(tiny_bin, kind):
    model, task = model_of(tiny_bin, ["--residual", kind])
    ref, fast = decode_both(model, task, **STUDY)
    assert_same_hypotheses(ref, fast)
    assert len(lengths(ref)) >= 3  # hypotheses end at several lengths


@pytest.mark.parametrize("flags", [
    ["--residual", "pre_ln", "--decoder-learned-pos", "--layernorm-embedding", "--share-decoder-input-output-embed"],
    ["--residual", "post_ln", "--no-scale-embedding", "--decoder-layers", "3", "--decoder-attention-heads", "4"],
    ["--encoder-residual", "hyper", "--decoder-residual", "resi_dual", "--normalization", "rms_norm"],
])
def test_model_variants_decode_fairseqs_hypotheses(tiny_bin, flags):
    model, task = model_of(tiny_bin, flags)
    ref, fast = decode_both(model, task, **STUDY)
    assert_same_hypotheses(ref, fast)


OPTIONS = {
    "fairseq-lenpen": dict(gnmt=False, beam_size=4, len_penalty=1.0, max_len_b=5),
    "unnormalized": dict(gnmt=False, beam_size=4, normalize_scores=False, max_len_b=5),
    "gnmt-unnormalized": dict(beam_size=4, normalize_scores=False, max_len_b=5),
    "no-repeat-ngram": dict(beam_size=4, len_penalty=0.6, no_repeat_ngram_size=2, max_len_b=8),
    "unkpen-minlen": dict(beam_size=4, len_penalty=0.6, unk_penalty=-3.0, min_len=4, max_len_b=5),
    "temperature": dict(beam_size=4, temperature=0.7, max_len_b=5),
    "beam-1": dict(beam_size=1, max_len_b=5),
    "beam-6-max-len-a": dict(beam_size=6, max_len_a=0.5, max_len_b=2),
}


@pytest.mark.parametrize("kind", ["post_ln", "dlcl"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_search_options_as_fairseq_applies_them(tiny_bin, kind, name):
    model, task = model_of(tiny_bin, ["--residual", kind], seed=2)
    ref, fast = decode_both(model, task, **OPTIONS[name])
    assert_same_hypotheses(ref, fast)
    if name == "no-repeat-ngram":
        for sent in fast:
            for h in sent:
                pairs = list(zip([2, *h["tokens"].tolist()], h["tokens"].tolist()))  # the initial EOS included
                assert len(pairs) == len(set(pairs))
    if name == "unkpen-minlen":
        assert min(lengths(fast)) >= 5  # 4 tokens and EOS


def test_the_step_interface_alone(tiny_bin):
    """beam_search over a stepper (what an exported model plugs into) = the generator's output."""
    model, task = model_of(tiny_bin, ["--residual", "hyper"])
    sample = sample_batch(task, n=6, split="test")
    generator = FastSequenceGenerator([model], task.target_dictionary, search_strategy=search.BeamSearch(
        task.target_dictionary), beam_size=4, max_len_b=5)
    with torch.no_grad():
        want = generator.generate([model], sample)
        got = beam_search(ResNMTStepper(model), sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"],
                          SearchOptions(beam=4, max_len_b=5), task.target_dictionary)
    assert [[h["tokens"].tolist() for h in s] for s in got] == [[h["tokens"].tolist() for h in s] for s in want]
    assert all(math.isfinite(float(h["score"])) for s in got for h in s)


def test_the_task_builds_the_fast_search_and_says_which_it_built(tiny_bin, caplog):
    from fairseq import options, tasks

    def generator(*flags):
        parser = options.get_generation_parser()
        args = options.parse_args_and_arch(parser, [str(tiny_bin), "--user-dir", USER_DIR, "--task",
                                                    "resnmt_translation", *flags])
        task = tasks.setup_task(args)
        model, _ = model_of(tiny_bin, ["--residual", "post_ln"])
        caplog.clear()
        with caplog.at_level("INFO"):
            gen = task.build_generator([model], args)
        return gen, [r.getMessage() for r in caplog.records if r.getMessage().startswith("beam search")]

    gen, said = generator("--beam", "4")
    assert isinstance(gen, FastSequenceGenerator) and said == [
        "beam search: resnmt's fast beam search (resnmt/decoding/fast_beam.py)"]
    gen, said = generator("--lenpen-form", "gnmt")
    assert isinstance(gen, FastSequenceGenerator) and gen.gnmt_apply
    gen, said = generator("--beam-search", "fairseq")
    assert not isinstance(gen, FastSequenceGenerator) and said == ["beam search: fairseq's (--beam-search fairseq)"]
    gen, said = generator("--sampling", "--lenpen-form", "gnmt")
    assert not isinstance(gen, FastSequenceGenerator)
    assert said == ["beam search: fairseq's (--sampling: not in the fast beam search)"]
    gen, said = generator("--prefix-size", "1")
    assert said == ["beam search: fairseq's (--prefix-size: not in the fast beam search)"]


def test_a_model_it_cannot_step_decodes_with_fairseqs_search_saying_why(tiny_bin, caplog):
    model, task, _ = build(tiny_bin, "transformer")  # fairseq's own transformer
    tgt = task.target_dictionary
    with caplog.at_level("INFO"):
        gen = FastSequenceGenerator([model.eval()], tgt, search_strategy=search.BeamSearch(tgt), beam_size=2)
    assert gen.path == "fairseq"
    assert "beam search: fairseq's (the model's decoder is TransformerDecoderBase, not resnmt's)" in caplog.messages
    sample = sample_batch(task, n=2, split="test")
    with torch.no_grad():
        assert len(gen.generate([model], sample)) == 2


@pytest.fixture(scope="module")
def trained(tiny_bin, tmp_path_factory):
    """A post-LN model trained 20 updates (its hypotheses end at their own lengths)."""
    save = tmp_path_factory.mktemp("fast_beam_run")
    run_cli(["fairseq-train", tiny_bin, "--user-dir", USER_DIR, "--arch", "resnmt_transformer", *TINY,
             "--residual", "post_ln", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "800", "--max-update",
             "20", "--save-dir", save, "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0"])
    return save


def test_fairseq_generate_prints_the_same_lines_with_either_search(tiny_bin, trained):
    def generate(search_flag):
        out = run_cli(["fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--task", "resnmt_translation",
                       "--path", trained / "checkpoint_last.pt", "--gen-subset", "test", "--beam", "4",
                       "--lenpen-form", "gnmt", "--lenpen", "0.6", "--max-len-a", "1", "--max-len-b", "5",
                       "--batch-size", "16", "--beam-search", search_flag])
        lines = sorted(line.split("\t") for line in out.stdout.splitlines() if line[:2] in ("H-", "D-", "P-"))
        return lines, out.stderr

    fast, fast_log = generate("fast")
    slow, slow_log = generate("fairseq")
    assert "beam search: resnmt's fast beam search" in fast_log
    assert "beam search: fairseq's (--beam-search fairseq)" in slow_log
    assert len(fast) == len(slow) == 3 * 60
    for a, b in zip(fast, slow):
        assert a[0] == b[0]
        if a[0][0] == "P":  # P-id, the positional scores (4 decimals)
            assert all(abs(float(x) - float(y)) <= 2e-4 for x, y in zip(a[1].split(), b[1].split()))
        else:  # H-id or D-id, the score (4 decimals), the hypothesis
            assert a[2:] == b[2:] and abs(float(a[1]) - float(b[1])) <= 2e-4


def test_the_hub_translates_with_the_fast_search(tiny_bin, trained):
    import resnmt

    sentences = (tiny_bin.parent / "text" / "test.en").read_text().splitlines()[:12]
    hubs = {search_name: resnmt.from_pretrained(trained, "checkpoint_last.pt", data_name_or_path=str(tiny_bin),
                                                lenpen_form="gnmt", lenpen=0.6, beam_search=search_name)
            for search_name in ("fast", "fairseq")}
    generator = hubs["fast"].task.build_generator(hubs["fast"].models, hubs["fast"].cfg.generation)
    assert isinstance(generator, FastSequenceGenerator) and generator.path == "fast"
    assert not isinstance(hubs["fairseq"].task.build_generator(hubs["fairseq"].models, hubs["fairseq"].cfg.generation),
                          FastSequenceGenerator)
    assert hubs["fast"].translate(sentences, beam=4) == hubs["fairseq"].translate(sentences, beam=4)
    with pytest.raises(ValueError, match="beam_search 'slow' is not one of: fast fairseq"):
        resnmt.from_pretrained(trained, "checkpoint_last.pt", data_name_or_path=str(tiny_bin), beam_search="slow")


@pytest.mark.parametrize("columns", [32000, 32003, 1000])
def test_top_candidates_are_topks(columns):
    from resnmt.decoding.fast_beam import top_candidates

    g = torch.Generator().manual_seed(columns)
    flat = torch.log_softmax(3 * torch.randn(16, columns, generator=g), dim=-1)
    flat[:, ::7] = -math.inf
    for k in (1, 8):
        want, got = torch.topk(flat, k), top_candidates(flat, k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
