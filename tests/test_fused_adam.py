"""``--optimizer adam_fused`` (resnmt/training/optim.py) against fairseq's ``adam``.

Both optimizers are built by fairseq from parsed command-line flags, with the same lr
schedule (inverse_sqrt with warm-up), betas and weight decay, and stepped on the same
gradients (scaled and clipped as fairseq's trainer does): the parameters and the
gradient norms agree to 1e-6 after every update, in float32 and under
fairseq's bf16 wrappers (FP16Optimizer's float32 master weights; MemoryEfficientFP16Optimizer
stepping bf16 weights), with both kernels (``fused`` where this torch has it on the CPU).
End to end, fairseq-train with ``--optimizer adam_fused`` trains a resnmt model with the
per-update losses of ``--optimizer adam``.
"""
import pytest
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler

import resnmt  # noqa: F401  (registers adam_fused)
from conftest import run_cli
from resnmt.training.optim import MultiTensorAdam, fused_adamw_supported
from test_bf16 import write_resnmt_train_probe
from test_distributed import ARCHS, probe_train_args, read_losses

KERNELS = ["foreach"] + (["fused"] if fused_adamw_supported(torch.device("cpu")) else [])
FLAGS = ["--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "3", "--warmup-init-lr", "1e-7",
         "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.01"]
UPDATES = 8
CLIP_NORM = 5.5  # among the updates' gradient norms (4.9 to 6.1 here): some updates are clipped, some not


def config(optimizer, *extra):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=[
        "data", "--arch", "transformer", "--optimizer", optimizer, *FLAGS, "--cpu", *extra])
    args.tpu = False  # with --bf16 (resnmt-train's parse does the same)
    return convert_namespace_to_omegaconf(args)


def make_params(dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,), (64,)]
    return [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.5).to(device=device, dtype=dtype)) for s in shapes]


def gradients(params, update):
    gen = torch.Generator().manual_seed(100 + update)
    # one very small gradient: where eps dominates sqrt(v), eps's placement matters
    return [(torch.randn(p.shape, generator=gen) * (1e-7 if i == 3 else 1.0)).to(p.device) for i, p in enumerate(params)]


def train(optimizer, *extra, wrapper=None, dtype=torch.float32, device="cpu"):
    cfg = config(optimizer, *extra)
    params = make_params(dtype, device)
    if wrapper is None:
        opt = optim.build_optimizer(cfg.optimizer, params)
    else:
        opt = wrapper.build_optimizer(cfg, params)
    sched = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, opt)
    sched.step_update(0)
    history = []
    for update in range(UPDATES):
        opt.zero_grad()
        for p, g in zip(params, gradients(params, update)):
            # the loss whose gradient is g: backward through the wrapper as fairseq does
            opt.backward((p.float() * g).sum()) if wrapper is not None else (p * g).sum().backward()
        opt.multiply_grads(0.5)  # as the trainer divides by the sample size
        norm = opt.clip_grad_norm(CLIP_NORM)  # clips where the norm is over CLIP_NORM
        opt.step()
        sched.step_update(update + 1)
        masters = opt.fp32_params if wrapper is optim.FP16Optimizer else params
        if isinstance(masters, dict):  # --fp16: one flat float32 master per device
            masters = list(masters.values())
        history.append([m.detach().float().clone() for m in masters] + [norm.detach().float().reshape(1)])
    return opt, history


@pytest.mark.parametrize("kernel", KERNELS)
def test_equals_fairseq_adam_in_float32(kernel):
    ref_opt, ref = train("adam")
    opt, got = train("adam_fused", "--adam-kernel", kernel)
    assert type(opt.optimizer) is MultiTensorAdam and opt.optimizer.kernel == kernel
    assert opt.get_lr() == ref_opt.get_lr()
    for update, (a, b) in enumerate(zip(got, ref)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=f"update {update + 1}")
    assert not torch.equal(got[-1][0], make_params()[0])  # it trained
    # the state has adam's layout, so checkpoints hold the same entries
    state = opt.state_dict()["state"]
    assert set(state[0]) == {"step", "exp_avg", "exp_avg_sq"} and state[0]["step"] == UPDATES


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("wrapper", ["FP16Optimizer", "MemoryEfficientFP16Optimizer"])
def test_equals_fairseq_adam_under_the_bf16_wrappers(kernel, wrapper):
    cls = getattr(optim, wrapper)
    memory_efficient = ["--memory-efficient-bf16"] if wrapper == "MemoryEfficientFP16Optimizer" else []
    _, ref = train("adam", "--bf16", *memory_efficient, wrapper=cls, dtype=torch.bfloat16)
    opt, got = train("adam_fused", "--adam-kernel", kernel, "--bf16", *memory_efficient, wrapper=cls,
                     dtype=torch.bfloat16)
    assert type(opt) is cls
    for update, (a, b) in enumerate(zip(got, ref)):
        for x, y in zip(a, b):
            if wrapper == "FP16Optimizer":  # the float32 master weights
                torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=f"update {update + 1}")
            else:  # bf16 weights: the same to one rounding of bf16
                torch.testing.assert_close(x, y, rtol=2 ** -7, atol=1e-6, msg=f"update {update + 1}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_job.sh runs it)")
@pytest.mark.parametrize("kernel", ["auto", "fused", "foreach"])
def test_equals_fairseq_adam_on_cuda(kernel):
    """On the GPU: fairseq's adam (its Python loop, or its FusedAdam where apex or
    fairseq's CUDA extension is installed) against adam_fused's kernels, float32."""
    _, ref = train("adam", device="cuda")
    opt, got = train("adam_fused", "--adam-kernel", kernel, device="cuda")
    assert opt.optimizer.kernel_for(torch.device("cuda"), torch.float32) == ("foreach" if kernel == "foreach" else "fused")
    for update, (a, b) in enumerate(zip(got, ref)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=f"update {update + 1}")
    # --fp16: fairseq's FP16Optimizer keeps one flat float32 master (CUDA only), which adam_fused supports
    _, ref = train("adam", "--fp16", wrapper=optim.FP16Optimizer, dtype=torch.float16, device="cuda")
    opt, got = train("adam_fused", "--adam-kernel", kernel, "--fp16", wrapper=optim.FP16Optimizer,
                     dtype=torch.float16, device="cuda")
    assert opt.supports_flat_params and torch.is_tensor(opt.fp32_params[torch.cuda.current_device()])
    for update, (a, b) in enumerate(zip(got, ref)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=f"--fp16, update {update + 1}")


def test_unknown_kernel_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        config("adam_fused", "--adam-kernel", "cuda")
    assert "--adam-kernel: invalid choice: 'cuda'" in capsys.readouterr().err


def test_fairseq_train_with_adam_fused_matches_adam(tiny_bin, tmp_path):
    probe = write_resnmt_train_probe(tmp_path)
    losses = {}
    for name in ("adam", "adam_fused"):
        args = probe_train_args(probe, tiny_bin, tmp_path / name, ARCHS["sas"], "--max-update", "6",
                                "--weight-decay", "0.01", "--no-save")
        args[args.index("--optimizer") + 1] = name
        run_cli(args, PROBE_OUT=str(tmp_path / f"{name}_probe"))
        losses[name] = read_losses(tmp_path / f"{name}_probe" / "loss.rank0.jsonl")
    assert sorted(losses["adam_fused"]) == sorted(losses["adam"]) == list(range(1, 7))
    for update, loss in losses["adam"].items():
        assert losses["adam_fused"][update] == pytest.approx(loss, rel=1e-5, abs=1e-6), update
