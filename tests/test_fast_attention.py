"""``--fast-path``'s attention (resnmt/training/fast/attention.py): which calls of torch's
``scaled_dot_product_attention`` a training step makes (spied on), and that they compute
fairseq's attention.

Tolerance: in float32 the losses equal fairseq's to rtol 1e-6 and every gradient to
rtol 1e-5 / atol 1e-5 (gradients of the summed loss, of size 0.1-10; SDPA's kernel sums in
another order than fairseq's batched products and float32 softmax); attention dropout is off
in the comparison (each path draws its own dropout mask)."""
import pytest
import torch
import torch.nn.functional as F

from model_utils import build, sample_batch
from resnmt.training.fast.attention import sdpa_calls, use_sdpa_attention

NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


class Spy:
    """Records the arguments of every call of ``F.scaled_dot_product_attention`` and counts
    ``F.softmax`` calls (attention weights computed the way fairseq's bmm path does)."""

    def __init__(self, monkeypatch):
        self.calls, self.softmaxes = [], 0
        sdpa, softmax = F.scaled_dot_product_attention, F.softmax

        def spy_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
            self.calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "mask": attn_mask, "causal": is_causal,
                               "dropout": dropout_p})
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

        def spy_softmax(*args, **kwargs):
            self.softmaxes += 1
            return softmax(*args, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", spy_sdpa)
        monkeypatch.setattr(F, "softmax", spy_softmax)


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch["net_input"])[0]
    loss = F.cross_entropy(out.transpose(1, 2).float(), batch["target"], ignore_index=1, reduction="sum")
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_every_attention_takes_sdpa_with_the_fast_kernels_call_pattern(tiny_bin, monkeypatch):
    model, task, _ = build(tiny_bin, "transformer_postln_base", ["--task", "resnmt_translation", "--attention-dropout",
                                                                  "0.1"])
    assert use_sdpa_attention(model) == 6 and use_sdpa_attention(model) == 6  # 2 + 2 x 2 layers; again: the same
    batch = sample_batch(task, n=6, split="train")
    src, tgt = batch["net_input"]["src_tokens"], batch["net_input"]["prev_output_tokens"]
    assert src.eq(1).any() and tgt.eq(1).any()  # padding on both sides
    spy = Spy(monkeypatch)
    model.train()
    loss_and_grads(model, batch)
    (b, s), t = src.shape, tgt.size(1)
    assert len(spy.calls) == 6 and spy.softmaxes == 0 and sdpa_calls(model) == 6
    encoder, decoder = spy.calls[:2], spy.calls[2:]
    for call in encoder + decoder[1::2]:  # encoder self-attention, cross-attention: the key-padding mask only
        assert not call["causal"] and call["mask"].dtype == torch.bool and call["mask"].shape == (b, 1, 1, s)
        assert torch.equal(call["mask"][:, 0, 0], src.ne(1)) and call["dropout"] == 0.1
    for call in decoder[0::2]:  # decoder self-attention: causal, no mask
        assert call["causal"] and call["mask"] is None and call["q"] == call["k"] == (b, 2, t, 8)
    assert [c["k"][2] for c in decoder] == [t, s, t, s]

    model.eval()  # evaluation: fairseq's forward (weights asked for by the last layer)
    spy.calls.clear()
    with torch.no_grad():
        model(**batch["net_input"])
    assert sdpa_calls(model) == 6 and all(not c["causal"] for c in spy.calls) and spy.softmaxes > 0


@pytest.mark.parametrize("arch, extra", [("transformer_postln_base", []), ("transformer_preln_base", []),
                                         ("transformer_hybrid_norm_base", [])])
def test_sdpa_attention_computes_fairseqs(tiny_bin, arch, extra):
    fairseq_model, task, _ = build(tiny_bin, arch, [*extra, *NO_DROPOUT])
    fast_model, _, _ = build(tiny_bin, arch, [*extra, *NO_DROPOUT])
    use_sdpa_attention(fast_model)
    batch = sample_batch(task, n=8, split="train")
    fairseq_model.train(), fast_model.train()
    loss_f, grads_f = loss_and_grads(fairseq_model, batch)
    loss_s, grads_s = loss_and_grads(fast_model, batch)
    assert sdpa_calls(fast_model) == 6
    assert loss_s.item() == pytest.approx(loss_f.item(), rel=1e-6)
    assert grads_s.keys() == grads_f.keys()
    for name, g in grads_f.items():
        torch.testing.assert_close(grads_s[name], g, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_left_padded_targets_join_the_causal_and_padding_masks(tiny_bin):
    """With left-padded targets the causal mask alone would let real queries see padding
    keys: the two masks go in as one boolean mask, and the real positions' outputs equal fairseq's."""
    reference, task, _ = build(tiny_bin, "transformer_postln_base", NO_DROPOUT)
    fast, _, _ = build(tiny_bin, "transformer_postln_base", NO_DROPOUT)
    use_sdpa_attention(fast, right_padded_targets=False)
    batch = sample_batch(task, n=6, split="train")
    prev = batch["net_input"]["prev_output_tokens"]
    lengths = prev.ne(1).sum(1)
    left = torch.full_like(prev, 1)
    for i, n in enumerate(lengths.tolist()):
        left[i, prev.size(1) - n:] = prev[i, :n]
    net_input = {**batch["net_input"], "prev_output_tokens": left}
    reference.train(), fast.train()
    real = left.ne(1)
    with torch.no_grad():
        out_r, out_f = reference(**net_input)[0], fast(**net_input)[0]
    torch.testing.assert_close(out_f[real], out_r[real], rtol=1e-5, atol=1e-5)
