"""The fast path's fused cross-entropy (resnmt/training/fast/fused_loss.py), under Triton's
interpreter on the CPU (TRITON_INTERPRET=1) and compiled where a GPU is.

* the kernel against fairseq's ``label_smoothed_nll_loss`` on ``log_softmax`` (the loss,
  ``nll_loss`` and the gradient w.r.t. the logits, scaled by the incoming gradient): float32
  and bf16 logits, label smoothing 0.1 and 0 (``cross_entropy``), padding rows, a vocabulary
  of 37 read in blocks of 16 (the last one partial) and in one block;
* nothing float32 over the vocabulary is made: no tensor an operation returns holds more
  bytes than the bf16 logits (fairseq's log-probabilities hold twice as many), and the
  backward pass keeps only the gradient, in the logits' dtype;
* the criterion on the fast path: its ``compute_loss`` equals fairseq's for
  ``label_smoothed_cross_entropy`` and ``cross_entropy``; CUDA's default, not the CPU's;
  a kernel that fails at its first call gives the criterion back its own, with one line;
* the fast path's trainer with the kernel (float32; ``--bf16`` with ``--update-freq 2``;
  clipping) trains as fairseq's ``Trainer.train_step``, to the rounding its gradient differs by;
* the kernel compiles (Triton's own compiler, no GPU needed) to a CUDA binary for the H100's
  and H200's architecture (sm_90), with bf16 and float32 logits, with and without the gradient.
"""
import logging
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="Triton is a test dependency (requirements-dev.txt)")
from fairseq import tasks, utils  # noqa: E402
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss  # noqa: E402

from resnmt.training.fast import fused_loss  # noqa: E402
from resnmt.training.fast.fused_loss import FusedCompute, label_smoothed_cross_entropy, use_fused_loss  # noqa: E402
from resnmt.training.fast.step import FastPathTrainer  # noqa: E402
from conftest import compiled_for_sm90  # noqa: E402
from test_fast_path import build, config, epoch_batches, probe_fairseq_losses, run_both  # noqa: E402,F401

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PAD, V = 1, 37


def logits_and_target(dtype, shape=(2, 4)):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(*shape, V, generator=gen) * 3).to(DEVICE, dtype)
    target = torch.randint(0, V, shape, generator=gen).to(DEVICE)
    target[0, 1] = target[1, 3] = PAD  # padding rows
    target[1, 0] = V - 1  # the last class, in the partial block
    return logits, target


def fairseqs(logits, target, eps, upstream):
    """fairseq's loss, nll_loss and the logits' gradient (``criterion.compute_loss``'s math)."""
    logits = logits.detach().requires_grad_()
    lprobs = utils.log_softmax(logits, dim=-1)
    loss, nll_loss = label_smoothed_nll_loss(lprobs.view(-1, V), target.view(-1), eps, ignore_index=PAD)
    (loss * upstream).backward()
    return loss.detach(), nll_loss.detach(), logits.grad


@pytest.mark.parametrize("rows", [1, 32])  # rows per program: CUDA's; the interpreter's (past the last row)
@pytest.mark.parametrize("block", [16, None])  # 37 in blocks of 16 (the last partial), or one of 64
@pytest.mark.parametrize("eps", [0.1, 0.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_fairseqs_label_smoothed_loss_and_gradient(dtype, eps, block, rows):
    logits, target = logits_and_target(dtype)
    ours = logits.detach().requires_grad_()
    loss, nll_loss = label_smoothed_cross_entropy(ours, target, eps, PAD, block=block, rows_per_program=rows)
    (loss * 0.5).backward()  # the incoming gradient scales the stored one
    ref_loss, ref_nll, ref_grad = fairseqs(logits, target, eps, 0.5)
    assert loss.dtype == nll_loss.dtype == torch.float32 and ours.grad.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(nll_loss, ref_nll, rtol=1e-6, atol=1e-5)
    if eps == 0:
        torch.testing.assert_close(loss, nll_loss, rtol=1e-6, atol=1e-5)
    # float32: to 1e-5; bf16: within one bf16 rounding step of fairseq's (float32, then rounded)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-7)
    torch.testing.assert_close(ours.grad, ref_grad, **tolerance)
    assert not ours.grad[0, 1].any() and not ours.grad[1, 3].any()  # padding rows: no gradient


def test_without_a_gradient_the_loss_is_the_same():
    logits, target = logits_and_target(torch.float32)
    with torch.no_grad():
        loss, nll_loss = label_smoothed_cross_entropy(logits, target, 0.1, PAD, block=16)
    ref_loss, ref_nll, _ = fairseqs(logits, target, 0.1, 1.0)
    assert not loss.requires_grad
    torch.testing.assert_close((loss, nll_loss), (ref_loss, ref_nll), rtol=1e-6, atol=1e-5)


class Created(TorchDispatchMode):
    """The size in bytes of every tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [t.numel() * t.element_size() for t in (out if isinstance(out, (tuple, list)) else [out])
                      if torch.is_tensor(t)]
        return out


def test_no_float32_tensor_over_the_vocabulary_is_made():
    logits, target = logits_and_target(torch.bfloat16, shape=(3, 5))
    ours = logits.detach().requires_grad_()
    kept = []
    with Created() as created, torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        loss, _ = label_smoothed_cross_entropy(ours, target, 0.1, PAD)
        loss.backward()
    assert created.made and max(created.made) == logits.numel() * 2  # the logits' size: the gradient
    assert [(t.dtype, t.numel()) for t in kept] == [(torch.bfloat16, logits.numel())]  # the gradient
    with Created() as created:  # fairseq's criterion: float32 log-probabilities
        fairseqs(logits, target, 0.1, 1.0)
    assert max(created.made) == logits.numel() * 4


# ------------------------------------------------------------------ on the fast path

def criterion_on_the_fast_path(data, monkeypatch, *extra, drop=()):
    """A fast-path trainer (on CUDA where there is one) whose criterion has the kernel, and one
    fairseq batch."""
    monkeypatch.setattr(fused_loss, "kernel_wanted", lambda device: True)
    cfg = config(data, *extra, drop=drop, cpu=DEVICE.type == "cpu")
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    trainer = FastPathTrainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    batch = trainer._prepare_sample(epoch_batches(task)[0])[0]
    return trainer, batch


def loss_and_logits_gradient(compute, model, net_output, batch):
    logits = net_output[0].detach().requires_grad_()
    loss, nll_loss = compute(model, (logits, net_output[1]), batch)
    loss.backward()
    return loss.detach(), nll_loss.detach(), logits.grad


@pytest.mark.parametrize("extra, drop", [((), ()), (("--bf16",), ()),
                                         (("--criterion", "cross_entropy"), ("--label-smoothing",))])
def test_the_criterion_on_the_fast_path_computes_fairseqs_loss(tiny_bin, monkeypatch, extra, drop):
    """On a real batch (48 x 12 targets over a vocabulary of 2,088): the loss and nll_loss,
    and the logits' gradient, which rounds differently from fairseq's: in float32 by at most
    1e-7, in bf16 by one bf16 step in at most one element in 1,000."""
    trainer, batch = criterion_on_the_fast_path(tiny_bin, monkeypatch, *extra, drop=drop)
    criterion, model = trainer.criterion, trainer.model
    fused = criterion.__dict__["compute_loss"]
    assert trainer.loss_kernel == "triton" and isinstance(fused, FusedCompute)
    model.eval()  # no dropout: the same logits twice
    with torch.no_grad():
        net_output = model(**batch["net_input"])
    *ours, grad = loss_and_logits_gradient(fused, model, net_output, batch)
    *theirs, ref_grad = loss_and_logits_gradient(fused.eager, model, net_output, batch)
    assert fused.calls == 1 and fused.eps == (0.0 if "cross_entropy" in extra else 0.1)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-5)
    if grad.dtype == torch.float32:
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-7)
    else:
        torch.testing.assert_close(grad, ref_grad, rtol=2 ** -7, atol=0)
        assert (grad != ref_grad).float().mean() < 1e-3
    unreduced = fused(model, net_output, batch, reduce=False)  # fairseq's, per token
    assert fused.calls == 1 and unreduced[0].numel() == batch["target"].numel()
    torch.testing.assert_close(unreduced[0].sum(), ours[0], rtol=1e-6, atol=1e-5)


def test_the_kernel_is_cudas_default_not_the_cpus(tiny_bin):
    trainer, _ = build(tiny_bin, FastPathTrainer)
    assert trainer.loss_kernel == "fairseq" and "compute_loss" not in trainer.criterion.__dict__
    assert fused_loss.kernel_wanted("cuda") and not fused_loss.kernel_wanted("cpu")  # Triton is installed here
    trainer.criterion.ignore_prefix_size = 1  # a loss it does not compute: fairseq's
    assert not use_fused_loss(trainer.criterion, "cuda") and "compute_loss" not in trainer.criterion.__dict__
    trainer.criterion.ignore_prefix_size = 0
    assert use_fused_loss(trainer.criterion, "cuda") and use_fused_loss(trainer.criterion, "cuda")


def test_a_kernel_that_fails_gives_the_criterion_back_its_own_loss(tiny_bin, monkeypatch, caplog):
    def broken():
        raise RuntimeError("PTX JIT compilation failed\nmore detail")

    trainer, batch = criterion_on_the_fast_path(tiny_bin, monkeypatch)
    monkeypatch.setattr(fused_loss, "_kernel", broken)
    criterion, model = trainer.criterion, trainer.model
    model.eval()
    with caplog.at_level(logging.WARNING):
        loss, _, log = criterion(model, batch)
    assert [r.getMessage() for r in caplog.records] == [
        "[fast path] the fused cross-entropy kernel failed (RuntimeError: PTX JIT compilation failed); the loss runs "
        "as fairseq's criterion"]
    assert trainer.loss_kernel == "fairseq" and "compute_loss" not in criterion.__dict__
    assert torch.equal(loss, criterion(model, batch)[0])  # fairseq's own from then on


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU trainer's kernel runs under the interpreter; on "
                    "CUDA the fast path's own checks (test_fast_path.py's on_cuda tests) train with it")
@pytest.mark.parametrize("precision, update_freq, losses_rtol, weights_rtol", [
    ("fp32", 1, 1e-6, 1e-6), ("bf16", 2, 1e-4, 1e-3)])
def test_the_fast_paths_trainer_with_the_kernel_trains_as_fairseqs_step(tiny_bin, probe_fairseq_losses, monkeypatch,
                                                                        precision, update_freq, losses_rtol,
                                                                        weights_rtol):
    """As test_fast_path's test_update_equals_fairseqs_trainer (3 updates, --clip-norm 0.5),
    the loss computed by the kernel (CUDA's default) here too. Its gradient differs from
    fairseq's in rounding (float32: by up to 6e-8; bf16: about one element in 10,000 by one
    bf16 step), which Adam's first steps carry into the weights: measured, float32 losses
    within 5e-8 and weights 3e-7, bf16 losses 1.1e-5 and weights 1.2e-4 (relative; the
    weights as one vector)."""
    monkeypatch.setattr(fused_loss, "kernel_wanted", lambda device: True)
    extra = ["--clip-norm", "0.5"] + (["--bf16"] if precision == "bf16" else [])
    ref, fast_trainer, ref_losses, fast_losses = run_both(tiny_bin, 3, update_freq, *extra)
    assert fast_trainer.loss_kernel == "triton" and fast_trainer.criterion.compute_loss.calls == 3 * update_freq
    assert fast_losses == pytest.approx(ref_losses, rel=losses_rtol)
    ref_weights, weights = (torch.cat([p.detach().float().flatten() for p in t.model.parameters()])
                            for t in (ref, fast_trainer))
    assert float((weights - ref_weights).norm() / ref_weights.norm()) < weights_rtol


# compiles the kernel for sm_90 in a process of its own (this one runs Triton interpreted)
COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from resnmt.training.fast.fused_loss import MAX_BLOCK, _label_smoothed_rows
for logits, with_grad in (("bf16", True), ("fp32", True), ("bf16", False)):
    sig = {"X": "*" + logits, "TARGET": "*i64", "LOSS": "*fp32", "NLL": "*fp32", "DX": "*" + (logits if with_grad
                                                                                            else "fp32"),
           **{n: "i32" for n in ("n_rows", "stride", "V", "ignore_index")}, "eps_i": "fp32", "confidence": "fp32",
           **{n: "constexpr" for n in ("WITH_GRAD", "BF16", "ROWS", "BLOCK")}}
    source = ASTSource(fn=_label_smoothed_rows, signature=sig, constexprs={
        "WITH_GRAD": with_grad, "BF16": logits == "bf16", "ROWS": 1, "BLOCK": MAX_BLOCK})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    print(logits, with_grad, "cubin", len(kernel.asm["cubin"]) > 0, "st.global" in kernel.asm["ptx"])
"""


def test_the_kernel_compiles_for_the_h100s_architecture(tmp_path):
    assert compiled_for_sm90(COMPILE_FOR_SM90, tmp_path)[:3] == ["bf16 True cubin True True", "fp32 True cubin True True",
                                           "bf16 False cubin True True"]
