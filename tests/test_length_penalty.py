"""The GNMT length penalty (--task resnmt_translation --lenpen-form gnmt)."""
from argparse import Namespace

import pytest
import torch

import resnmt  # noqa: F401  (registers resnmt_translation, allow-lists checkpoint types)
from conftest import REPO_ROOT, run_cli
from fairseq import checkpoint_utils, tasks
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from resnmt.decoding.fast_beam import FastSequenceGenerator
from resnmt.decoding.sequence_generator import (
    GNMTSequenceGenerator,
    GNMTSequenceGeneratorWithAlignment,
    gnmt_length_penalty,
    rescore_gnmt,
    with_gnmt_penalty,
)
from resnmt.tasks.translation import ResNMTTranslationConfig, ResNMTTranslationTask
from test_average_checkpoints import train_tiny_transformer

ALPHA = 0.6


def test_penalty_values():
    assert gnmt_length_penalty(1, ALPHA) == pytest.approx(1.0)  # (5 + 1) / 6 = 1
    assert gnmt_length_penalty(7, ALPHA) == pytest.approx(2.0 ** 0.6)  # (5 + 7) / 6 = 2
    assert gnmt_length_penalty(10, 0.0) == 1.0


def test_the_two_penalties_rank_a_short_and_a_long_hypothesis_differently():
    # |Y| = 2 (one word + EOS) with log P = -2.0, |Y| = 10 with log P = -4.5
    short, long_ = (-2.0, 2), (-4.5, 10)
    fs = {name: s / n ** ALPHA for name, (s, n) in (("short", short), ("long", long_))}  # fairseq's --lenpen
    gn = {name: s / gnmt_length_penalty(n, ALPHA) for name, (s, n) in (("short", short), ("long", long_))}
    # by hand: fairseq -2/2^.6 = -1.3195 < -4.5/10^.6 = -1.1302; GNMT -2/(7/6)^.6 = -1.8233 > -4.5/(15/6)^.6 = -2.5965
    assert fs["short"] == pytest.approx(-2.0 / 2 ** 0.6) and fs["long"] == pytest.approx(-4.5 / 10 ** 0.6)
    assert gn["short"] == pytest.approx(-2.0 / (7 / 6) ** 0.6) and gn["long"] == pytest.approx(-4.5 / 2.5 ** 0.6)
    assert fs["long"] > fs["short"]  # fairseq prefers the long one
    assert gn["short"] > gn["long"]  # GNMT prefers the short one

    # the same through rescore_gnmt on fairseq-shaped hypotheses (tokens end with EOS = 2)
    hypos = [[
        {"tokens": torch.tensor([7, 8, 9, 10, 11, 12, 13, 14, 15, 2]), "score": torch.tensor(-4.5)},
        {"tokens": torch.tensor([7, 2]), "score": torch.tensor(-2.0)},
    ]]
    out = rescore_gnmt(hypos, ALPHA)
    assert [h["tokens"].numel() for h in out[0]] == [2, 10]
    assert float(out[0][0]["score"]) == pytest.approx(-2.0 / (7 / 6) ** 0.6, rel=1e-6)
    assert float(out[0][1]["score"]) == pytest.approx(-4.5 / 2.5 ** 0.6, rel=1e-6)


def test_task_builds_the_generator_for_each_form():
    models = [_ToyModel()]
    # the fast beam search by default (resnmt/decoding/fast_beam.py), ranked the same way
    assert type(_task("gnmt").build_generator(models, Namespace(beam=4, lenpen=ALPHA))) is \
        with_gnmt_penalty(FastSequenceGenerator)
    assert type(_task("fairseq").build_generator(models, Namespace(beam=4, lenpen=ALPHA))) is FastSequenceGenerator
    task = _task("gnmt", beam_search="fairseq")
    assert type(task.build_generator(models, Namespace(beam=4, lenpen=ALPHA))) is GNMTSequenceGenerator
    with_align = task.build_generator(models, Namespace(beam=4, lenpen=ALPHA, print_alignment="hard"))
    assert type(with_align) is GNMTSequenceGeneratorWithAlignment
    g = task.build_generator(models, Namespace(beam=4, lenpen=ALPHA))
    assert g.normalize_scores is False and g.gnmt_alpha == ALPHA and g.gnmt_apply
    assert not task.build_generator(models, Namespace(beam=4, lenpen=ALPHA, unnormalized=True)).gnmt_apply
    assert type(_task("fairseq", beam_search="fairseq").build_generator(models, Namespace(beam=4, lenpen=ALPHA))) \
        is SequenceGenerator
    assert with_gnmt_penalty(SequenceGeneratorWithAlignment) is GNMTSequenceGeneratorWithAlignment
    with pytest.raises(TypeError, match="needs a fairseq SequenceGenerator subclass"):
        with_gnmt_penalty(dict)


# ---------------------------------------------------------------- with a real (tiny) model

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tiny_bin):
    ckpt = train_tiny_transformer(tmp_path_factory, tiny_bin) / "checkpoint_3_8.pt"
    task = _task("gnmt", data=str(tiny_bin))
    models, _ = checkpoint_utils.load_model_ensemble([str(ckpt)], task=task)
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(len(ds))])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only contend on a 2-core machine
    yield task, models, sample, ckpt
    torch.set_num_threads(threads)


def _tokens(hypos):
    return [tuple(h["tokens"].tolist()) for h in hypos]


@pytest.mark.parametrize("alpha", [ALPHA, 4.0])
def test_gnmt_scores_of_a_real_model_equal_the_hand_recomputation(tiny_model, alpha):
    task, models, sample, _ = tiny_model
    generator = task.build_generator(models, Namespace(beam=4, lenpen=alpha, max_len_b=20))
    gnmt = generator.generate(models, sample)
    called = generator(sample)  # SequenceGenerator.forward: ranked the same way
    assert [[(h["tokens"].tolist(), float(h["score"])) for h in hs] for hs in called] == \
        [[(h["tokens"].tolist(), float(h["score"])) for h in hs] for hs in gnmt]
    raw = SequenceGenerator(models, task.target_dictionary, beam_size=4, max_len_b=20, normalize_scores=False)
    raw_out = raw.generate(models, sample)
    fairseq_norm = SequenceGenerator(models, task.target_dictionary, beam_size=4, max_len_b=20, len_penalty=alpha)
    fs_out = fairseq_norm.generate(models, sample)
    assert len(gnmt) == len(sample["id"]) == 60

    reordered = 0
    for g_hypos, r_hypos, f_hypos in zip(gnmt, raw_out, fs_out):
        assert len(g_hypos) == 4
        # the search is fairseq's: same finished hypotheses whatever the normalization
        assert sorted(_tokens(g_hypos)) == sorted(_tokens(r_hypos)) == sorted(_tokens(f_hypos))
        for h in g_hypos:
            n = h["tokens"].numel()  # |Y| including EOS
            assert int(h["tokens"][-1]) == task.target_dictionary.eos()
            by_hand = float(h["positional_scores"].double().sum()) / ((5 + n) / 6) ** alpha
            assert float(h["score"]) == pytest.approx(by_hand, abs=1e-4)
        scores = [float(h["score"]) for h in g_hypos]
        assert scores == sorted(scores, reverse=True)
        reordered += _tokens(g_hypos) != _tokens(r_hypos)
    if alpha > 1:  # a strong penalty must reorder some n-best lists of this short-output model
        assert reordered > 0


def test_fairseq_generate_end_to_end_with_gnmt(tiny_model, tiny_bin, tmp_path):
    _, _, _, ckpt = tiny_model
    proc = run_cli([
        "fairseq-generate", tiny_bin, "--user-dir", REPO_ROOT / "resnmt", "--task", "resnmt_translation",
        "--lenpen-form", "gnmt", "--lenpen", str(ALPHA), "--beam", "4", "--nbest", "4",
        "--path", ckpt, "--batch-size", "16", "--max-len-b", "20",
    ])
    hyps = {}
    lines = proc.stdout.splitlines()
    for line, nxt in zip(lines, lines[2:]):  # H-i, D-i, P-i
        if line.startswith("H-"):
            sid = int(line.split("\t")[0][2:])
            assert nxt.startswith(f"P-{sid}\t")
            hyps.setdefault(sid, []).append((float(line.split("\t")[1]), [float(x) for x in nxt.split("\t")[1].split()]))
    # all 60 test sentences (the task keeps fairseq from dropping a last partial batch)
    assert sorted(hyps) == list(range(60))
    for sid, nbest in hyps.items():
        assert len(nbest) == 4
        for score, positional in nbest:  # both printed in base 2, positional to 4 decimals
            by_hand = sum(positional) / ((5 + len(positional)) / 6) ** ALPHA
            assert score == pytest.approx(by_hand, abs=5e-4 * len(positional))
        assert [s for s, _ in nbest] == sorted((s for s, _ in nbest), reverse=True)
    assert "Generate test with beam=4" in proc.stdout


# ---------------------------------------------------------------- helpers

def _task(form, data=None, beam_search="fast"):
    """A resnmt_translation task; with ``data``, set up from a binarized directory."""
    if data is None:  # no data needed: a task with a toy dictionary
        d = Dictionary()
        for w in "abcdef":
            d.add_symbol(w)
        return ResNMTTranslationTask(ResNMTTranslationConfig(lenpen_form=form, beam_search=beam_search), d, d)
    return tasks.setup_task(Namespace(
        task="resnmt_translation", data=data, lenpen_form=form, source_lang="en", target_lang="de",
        dataset_impl="mmap", required_seq_len_multiple=1, train_subset="train"))


class _ToyModel(torch.nn.Module):
    """Just enough of a fairseq model for SequenceGenerator's constructor."""

    def max_decoder_positions(self):
        return 100
