"""``--sdpa-backends`` (resnmt/training/attention.py): the task restricts torch's attention
kernels process-wide, the restricted kernels compute the same losses and gradients, and a
bad name is refused in one line before anything is written."""
import pytest
import torch

from conftest import run_cli
from model_utils import TINY, build, sample_batch
from resnmt.training.attention import parse_sdpa_backends, sdpa_backends_enabled, use_sdpa_backends

NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
TASK = ["--task", "resnmt_translation"]


@pytest.fixture(autouse=True)
def restore_kernels():
    """The switches are process-wide: each test leaves them as it found them."""
    before = sdpa_backends_enabled()
    yield
    use_sdpa_backends(before)


def test_parse_names():
    assert parse_sdpa_backends("flash, efficient,math") == ("flash", "efficient", "math")
    with pytest.raises(ValueError, match=r"^--sdpa-backends fast: give a comma-separated list of "
                                         r"flash, efficient, cudnn, math$"):
        parse_sdpa_backends("flash,fast")
    with pytest.raises(ValueError, match=r"^--sdpa-backends ',': give a comma-separated list of"):
        parse_sdpa_backends(",")


def test_use_switches_exactly_the_named_kernels_and_returns_the_old_ones():
    assert use_sdpa_backends(["flash", "cudnn", "math"]) == ("flash", "efficient", "cudnn", "math")
    assert sdpa_backends_enabled() == ("flash", "cudnn", "math")
    assert not torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.cudnn_sdp_enabled()
    assert use_sdpa_backends(["math"]) == ("flash", "cudnn", "math")
    assert sdpa_backends_enabled() == ("math",)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's kernels only")
def test_cpu_needs_flash_or_math():
    with pytest.raises(ValueError, match=r"^--sdpa-backends cudnn,efficient: without a GPU torch's attention runs "
                                         r"only flash or math; list one of them$"):
        use_sdpa_backends(["cudnn", "efficient"])
    assert sdpa_backends_enabled() == ("flash", "efficient", "cudnn", "math")  # unchanged


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch["net_input"])[0]
    loss = torch.nn.functional.cross_entropy(out.transpose(1, 2), batch["target"], ignore_index=1)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_task_restricts_the_kernels_and_training_computes_the_same(tiny_bin):
    """torch's CPU attention runs its flash kernel by default; with --sdpa-backends math the
    task makes it run the plain composition: another kernel (the losses differ in the last
    bits) computing the same function."""
    default, task, _ = build(tiny_bin, "transformer_postln_base", [*TASK, *NO_DROPOUT])
    assert sdpa_backends_enabled() == ("flash", "efficient", "cudnn", "math")
    batch = sample_batch(task, n=6, split="train")
    default.train()
    loss_d, grads_d = loss_and_grads(default, batch)
    math_only, _, _ = build(tiny_bin, "transformer_postln_base", [*TASK, *NO_DROPOUT, "--sdpa-backends", "math"])
    assert sdpa_backends_enabled() == ("math",)
    math_only.train()
    loss_m, grads_m = loss_and_grads(math_only, batch)
    assert any(not torch.equal(grads_m[n], g) for n, g in grads_d.items())  # another kernel ran
    assert loss_m == pytest.approx(loss_d.item(), rel=1e-5)
    for name, g in grads_d.items():
        torch.testing.assert_close(grads_m[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_resnmt_train_refuses_a_bad_kernel_name(tiny_bin, tmp_path):
    proc = run_cli(["resnmt-train", tiny_bin, *TASK, "--arch", "transformer_postln_base", *TINY,
                    "--sdpa-backends", "flash,flashy", "--cpu", "--max-tokens", "500", "--save-dir", tmp_path],
                   check=False)
    assert proc.returncode == 2
    assert ("error: --sdpa-backends flashy: give a comma-separated list of flash, efficient, cudnn, math"
            in proc.stderr.strip().splitlines()[-1])
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the GPU job runs it)")
def test_on_cuda_kernels_compute_the_same_in_bf16(tiny_bin):
    """On a GPU torch's default choice (cuDNN's kernel on Hopper) against FlashAttention and
    the memory-efficient kernel, in bf16 autocast: the same losses and gradients to bf16's
    precision."""
    model, task, _ = build(tiny_bin, "transformer_postln_base", [*TASK, *NO_DROPOUT])
    model.cuda().train()
    batch = sample_batch(task, n=8, split="train")
    batch = {k: ({n: t.cuda() for n, t in v.items()} if isinstance(v, dict) else
                 (v.cuda() if torch.is_tensor(v) else v)) for k, v in batch.items()}
    results = []
    for kernels in (sdpa_backends_enabled(), ("flash", "efficient")):
        use_sdpa_backends(kernels)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(loss_and_grads(model, batch))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_b.item() == pytest.approx(loss_a.item(), rel=2e-2)
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name].float(), g.float(), rtol=5e-2, atol=5e-3, msg=name)
