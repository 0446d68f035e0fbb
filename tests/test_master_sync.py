"""``--fused-master-weights`` (resnmt/training/master_sync.py): fairseq's FP16Optimizer
copies and zeroing in multi-tensor kernels give the same bits as fairseq's per-parameter
ones, for flat (``--fp16``) and per-parameter (``--bf16``) master weights; the gradient
norm agrees with fairseq's; resnmt-train --bf16 trains the same losses with the flag."""
import pytest
import torch
from fairseq import utils
from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

from resnmt import fairseq_patches
from resnmt.training import master_sync
from test_bf16 import write_resnmt_train_probe
from test_distributed import ARCHS, probe_train_args, read_losses
from conftest import run_cli

SHAPES = [(5, 3), (7,), (2, 4, 3), (1,)]


@pytest.fixture(autouse=True)
def fairseq_restored():
    yield
    fairseq_patches.remove("fused-master-weights")


class Wrapper(_FP16OptimizerMixin):
    """The mixin's state as FP16Optimizer has it, without an inner optimizer."""

    def __init__(self, flat: bool, dtype=torch.float16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.fp16_params = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]
        self.fp16_params[2].requires_grad_(False)  # a frozen parameter among them
        for p in self.fp16_params:
            if p.requires_grad and p is not self.fp16_params[3]:  # one with no gradient this update
                p.grad = torch.randn(p.shape, generator=g).to(dtype)
        trained = [p for p in self.fp16_params if p.requires_grad]
        if flat:  # one float32 tensor per device (None: the CPU's index), as build_fp32_params makes it
            total = sum(p.numel() for p in self.fp16_params)
            flat_param = torch.nn.Parameter(torch.randn(total, generator=g))
            flat_param.grad = torch.randn(total, generator=g)
            self.fp32_params = {None: flat_param}
        else:
            self.fp32_params = []
            for p in self.fp16_params:
                p32 = torch.nn.Parameter(torch.randn(p.shape, generator=g))
                p32.grad = torch.randn(p.shape, generator=g) if p is not trained[0] else None
                self.fp32_params.append(p32)
        self._needs_sync, self._multiply_factor, self.scaler = True, 1.0, None


def state(w):
    flat = w.fp32_params.values() if isinstance(w.fp32_params, dict) else w.fp32_params
    return ([p.detach().clone() for p in w.fp16_params] + [p.detach().clone() for p in flat]
            + [p.grad.clone() for p in flat if p.grad is not None]
            + [p.grad.clone() if p.grad is not None else None for p in w.fp16_params])


def assert_same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y)


@pytest.mark.parametrize("flat, dtype", [(True, torch.float16), (False, torch.bfloat16), (False, torch.float16)])
def test_copies_and_zeroing_are_fairseqs_to_the_bit(flat, dtype):
    theirs, mine = Wrapper(flat, dtype), Wrapper(flat, dtype)  # the same seed: the same tensors
    assert_same_bits(state(mine), state(theirs))
    assert theirs.has_flat_params == flat
    steps = ("_sync_fp16_grads_to_fp32", "_sync_fp32_params_to_fp16", "zero_grad")
    for step in steps:
        getattr(theirs, step)()
    fairseq_patches.apply("fused-master-weights")
    for step in steps:
        getattr(mine, step)()
    assert _FP16OptimizerMixin.zero_grad is master_sync.zero_grad
    assert_same_bits(state(mine), state(theirs))
    # and the step between them moved something: the copies are not no-ops
    assert not torch.equal(state(Wrapper(flat, dtype))[0], state(mine)[0])


def test_gradient_norm_agrees_with_fairseqs():
    g = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    theirs = utils.clip_grad_norm_(params, 0)
    fairseq_patches.apply("fused-master-weights")
    assert utils.multi_tensor_l2norm_available and utils.multi_tensor_total_norm is master_sync.total_norm
    mine = utils.clip_grad_norm_(params, 0)
    assert mine.dtype == torch.float32 and mine.item() == pytest.approx(theirs.item(), rel=1e-6)
    fairseq_patches.remove("fused-master-weights")
    assert _FP16OptimizerMixin.zero_grad is not master_sync.zero_grad and utils.clip_grad_norm_(params, 0) == theirs


def test_resnmt_train_bf16_trains_the_same_with_the_flag(tiny_bin, tmp_path):
    probe = write_resnmt_train_probe(tmp_path)
    losses = {}
    for name, extra in (("fairseq", ()), ("fused", ("--fused-master-weights",))):
        proc = run_cli(probe_train_args(probe, tiny_bin, tmp_path / name, ARCHS["sas"], "--max-update", "4", "--bf16",
                                        "--no-save", *extra), PROBE_OUT=str(tmp_path / f"{name}_probe"))
        losses[name] = read_losses(tmp_path / f"{name}_probe" / "loss.rank0.jsonl")
        assert ("--fused-master-weights: master-weight copies and zeroing in multi-tensor kernels; gradient norm: "
                "torch's multi-tensor norm" in proc.stdout + proc.stderr) == bool(extra)
    assert sorted(losses["fused"]) == [1, 2, 3, 4]
    assert losses["fused"] == losses["fairseq"]  # the same bits, update after update
