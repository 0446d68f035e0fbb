"""The fast path's one-launch Adam (resnmt/training/fast/fused_adam.py), under Triton's
interpreter on the CPU (TRITON_INTERPRET=1) and compiled where a GPU is.

* :class:`DeviceUpdate` with the Triton kernel against fairseq's ``Adam.step``
  (``fairseq/optim/adam.py``) over 6 updates with a changing learning rate, weight decay,
  the gradients' scale and clipping (some updates clipped, some not), a tensor of several
  blocks and one whose gradients are so small that eps outside the bias correction decides
  its step: the weights, moments and norms agree to float32 rounding;
* with ``--bf16``'s float32 master weights (fairseq's ``FP16Optimizer``): the kernel reads
  the bf16 model's gradients, steps the masters as the multi-tensor update does and writes
  the model's weights rounded to bf16;
* the fast path's trainer with the kernel (``--bf16``, clipping, ``--update-freq 2``) trains
  as fairseq's ``Trainer.train_step``;
* a kernel that fails at its first call leaves the update to the multi-tensor operations,
  with one line;
* the kernel compiles (Triton's own compiler, no GPU needed) to a CUDA binary for the H100's
  and H200's architecture (sm_90), with bf16 gradients and model weights and in float32.
"""
import logging
import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="Triton is a test dependency (requirements-dev.txt)")
from fairseq.optim.adam import Adam  # noqa: E402

from resnmt.training.fast import fused_adam, update as fast_update  # noqa: E402
from resnmt.training.fast.fused_adam import BLOCK, FusedAdam  # noqa: E402
from resnmt.training.fast.update import DeviceUpdate, adam_kernel_for  # noqa: E402
from conftest import compiled_for_sm90  # noqa: E402
from test_fast_path import probe_fairseq_losses, run_both  # noqa: E402,F401  (the fixture)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPES = [(7, 5), (BLOCK + 300,), (3, 4, 2), (4,)]  # the second over two blocks; the last: tiny gradients
HYPER = dict(betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
CLIP = 4.5


def make_params(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.5).to(DEVICE, dtype)) for s in SHAPES]


def gradients(update):
    gen = torch.Generator().manual_seed(10 + update)
    scale = 0.16 * (1 + update % 2)  # norms (times 1/2) about 3 and 6: every other update clipped
    return [(torch.randn(s, generator=gen) * (1e-9 if i == 3 else scale)).to(DEVICE) for i, s in enumerate(SHAPES)]


def lr_at(update):
    return 1e-3 * (update + 1) / 3


def test_the_kernel_steps_as_fairseqs_adam():
    theirs, ours = make_params(), make_params()
    reference = Adam(theirs, lr=lr_at(0), **HYPER)
    update = DeviceUpdate(SimpleNamespace(optimizer=Adam(ours, lr=lr_at(0), **HYPER)), ours, CLIP, DEVICE,
                          adam="triton")
    assert update.adam_kernel == "triton"
    clipped = []
    for step in range(6):
        grads = gradients(step)
        # fairseq's trainer: gradients times 1/2 (the sample size), norm, clip, Adam
        for p, g in zip(theirs, grads):
            p.grad = g * 0.5
        norm = torch.nn.utils.clip_grad_norm_(theirs, CLIP)
        clipped.append(bool(norm > CLIP))
        reference.param_groups[0]["lr"] = lr_at(step)
        reference.step()
        for p, g in zip(ours, grads):
            p.grad.copy_(g)
        update.prepare(grad_scale=0.5, lr=lr_at(step))
        gnorm = update()
        update.advance()
        torch.testing.assert_close(gnorm, norm, rtol=1e-6, atol=0)
        for i, (p, q) in enumerate(zip(theirs, ours)):
            torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=f"update {step + 1}, parameter {i}")
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(update.opt.state[q][key], reference.state[p][key], rtol=1e-5, atol=1e-9)
            assert not q.grad.any()  # zeroed by the kernel
    assert clipped == [False, True] * 3 and update.adam_kernel == "triton"  # the kernel ran throughout
    # eps where fairseq puts it: with eps inside the bias correction (torch's Adam) the tiny-gradient
    # parameter would have moved by about lr / sqrt(1 - beta2) per update, five times as far as it did
    moved = (ours[3] - make_params()[3]).abs().max()
    assert 0 < moved < 2e-3 and not torch.isclose(moved, torch.tensor(0.0, device=DEVICE))
    assert update.opt.state[ours[0]]["step"] == 6


def master_update(kernel):
    """A --bf16 DeviceUpdate: bf16 model weights, float32 masters in fairseq's FP16Optimizer
    layout (``fp32_params``, ``fp32_optimizer``)."""
    model = make_params(torch.bfloat16)
    masters = [torch.nn.Parameter(p.detach().float()) for p in model]
    inner = SimpleNamespace(optimizer=Adam(masters, lr=lr_at(0), **HYPER))
    return model, DeviceUpdate(SimpleNamespace(fp32_params=masters, fp32_optimizer=inner), model, CLIP, DEVICE,
                               adam=kernel)


def test_the_kernel_steps_bf16_master_weights_as_the_multi_tensor_update():
    (model_k, kernel), (model_f, multi) = master_update("triton"), master_update("foreach")
    assert (kernel.adam_kernel, multi.adam_kernel) == ("triton", "foreach") and kernel.master
    for step in range(4):
        for model, update in ((model_k, kernel), (model_f, multi)):
            for p, g in zip(model, gradients(step)):
                p.grad.copy_(g)
            update.prepare(grad_scale=0.5, lr=lr_at(step))
        norm_k, norm_f = kernel(), multi()
        kernel.advance(), multi.advance()
        torch.testing.assert_close(norm_k, norm_f, rtol=1e-6, atol=0)
        for i, (a, b) in enumerate(zip(kernel.params, multi.params)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=f"update {step + 1}, master {i}")
        for i, (a, m) in enumerate(zip(model_k, kernel.params)):
            assert a.dtype == torch.bfloat16 and torch.equal(a, m.to(torch.bfloat16)), i  # the masters, rounded
            assert not a.grad.any()
    assert kernel.adam_kernel == "triton"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU trainer's kernel runs under the interpreter; on "
                    "CUDA the fast path's own checks (test_fast_path.py's on_cuda tests) train with it")
def test_the_fast_paths_trainer_with_the_kernel_trains_as_fairseqs_step(tiny_bin, probe_fairseq_losses,
                                                                        monkeypatch):
    """As test_fast_path's test_update_equals_fairseqs_trainer (bf16, 3 updates of 2 batches,
    --clip-norm 0.5), the update stepping with the Triton kernel (CUDA's default) here too."""
    monkeypatch.setattr(fast_update, "adam_kernel_for", lambda device, kernel="auto": "triton")
    ref, fast_trainer, ref_losses, fast_losses = run_both(tiny_bin, 3, 2, "--clip-norm", "0.5", "--bf16")
    assert fast_trainer.device_update().adam_kernel == "triton" and fast_trainer.device_update().master
    assert fast_losses == pytest.approx(ref_losses, rel=1e-6)
    for (name, p), q in zip(ref.model.named_parameters(), fast_trainer.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=name)


def test_a_kernel_that_fails_leaves_adam_to_the_multi_tensor_update(monkeypatch, caplog):
    def broken():
        raise RuntimeError("PTX JIT compilation failed\nmore detail")

    monkeypatch.setattr(fused_adam, "_kernel", broken)
    (model_k, kernel), (model_f, multi) = master_update("triton"), master_update("foreach")
    for model, update in ((model_k, kernel), (model_f, multi)):
        for p, g in zip(model, gradients(0)):
            p.grad.copy_(g)
        update.prepare(grad_scale=0.5, lr=lr_at(0))
    with caplog.at_level(logging.WARNING):
        assert torch.equal(kernel(), multi())
    assert kernel.adam_kernel == "foreach"
    assert [r.getMessage() for r in caplog.records] == [
        "[fast path] the fused Adam kernel failed (RuntimeError: PTX JIT compilation failed); Adam runs as "
        "multi-tensor operations"]
    for a, b in zip(model_k + kernel.params, model_f + multi.params):
        assert torch.equal(a, b)


def test_tensors_the_kernel_cannot_step_leave_adam_to_the_multi_tensor_update(caplog):
    params = make_params()
    params[0].grad = torch.zeros(5, 7, device=DEVICE).t()  # a transposed gradient: not contiguous
    with caplog.at_level(logging.WARNING):
        update = DeviceUpdate(SimpleNamespace(optimizer=Adam(params, lr=1e-3, **HYPER)), params, CLIP, DEVICE,
                              adam="triton")
    assert update.adam_kernel == "foreach"
    assert [r.getMessage() for r in caplog.records] == [
        "[fast path] fused Adam: parameter 0 (7, 5): its gradient, moments and output must be contiguous tensors of "
        "its shape; Adam runs as multi-tensor operations"]


def test_the_kernel_is_cudas_default_and_refuses_what_it_cannot_step():
    assert adam_kernel_for("cpu") == "foreach" and adam_kernel_for("cpu", "triton") == "triton"
    assert adam_kernel_for("cuda") == "triton"  # Triton is installed here
    with pytest.raises(ValueError, match=r"^--fast-path Adam kernel 'fused': choose one of auto, triton, foreach$"):
        adam_kernel_for("cpu", "fused")
    p = [torch.zeros(3)]
    with pytest.raises(ValueError, match=r"^fused Adam: parameter 0 \(3,\): its gradient, moments and output must"):
        FusedAdam(p, [torch.zeros(4)], [torch.zeros(3)], [torch.zeros(3)], None, (0.9, 0.98), 1e-8)
    with pytest.raises(ValueError, match=r"^fused Adam: gradients or model weights in torch.float16; it takes "):
        FusedAdam(p, [torch.zeros(3, dtype=torch.float16)], [torch.zeros(3)], [torch.zeros(3)], None, (0.9, 0.98),
                  1e-8)
    with pytest.raises(ValueError, match=r"^fused Adam: weights and moments in \['torch.bfloat16', 'torch.float32'\]"):
        FusedAdam([torch.zeros(3, dtype=torch.bfloat16)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)],
                  None, (0.9, 0.98), 1e-8)


# compiles the kernel for sm_90 in a process of its own (this one runs Triton interpreted)
COMPILE_FOR_SM90 = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from resnmt.training.fast.fused_adam import _adam_blocks
sig = {**{n: "*i64" for n in ("P", "G", "M", "V", "OUT")}, **{n: "*i32" for n in ("NUMEL", "BLOCK_TENSOR",
       "BLOCK_START")}, **{n: "*fp32" for n in ("FACTOR", "NEG_STEP", "DECAY")}, **{n: "fp32" for n in (
       "beta1", "one_minus_beta1", "beta2", "one_minus_beta2", "eps")}, **{n: "constexpr" for n in (
       "G_TYPE", "OUT_TYPE", "HAS_OUT", "SIZE")}}
for grads, out, has_out in ((tl.bfloat16, tl.bfloat16, True), (tl.float32, tl.float32, False)):
    source = ASTSource(fn=_adam_blocks, signature=sig, constexprs={"G_TYPE": grads, "OUT_TYPE": out,
                                                                   "HAS_OUT": has_out, "SIZE": 1024})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    print(grads, "cubin", len(kernel.asm["cubin"]) > 0, "ld.global" in kernel.asm["ptx"])
"""


def test_the_kernel_compiles_for_the_h100s_architecture(tmp_path):
    assert compiled_for_sm90(COMPILE_FOR_SM90, tmp_path)[:2] == ["bf16 cubin True True", "fp32 cubin True True"]
