"""The fast path's Triton kernels (resnmt/training/fast/kernels.py) against eager PyTorch,
under Triton's interpreter on the CPU (TRITON_INTERPRET=1, set here before the kernels are
defined) and compiled where a GPU is: the residual addition and LayerNorm of a post-LN write,
forward and backward."""
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="Triton is a test dependency (requirements-dev.txt)")
from resnmt.training.fast.kernels import residual_layer_norm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape", [(5, 3, 16), (7, 24), (2, 2, 40)])  # 24, 40: a block wider than the row
def test_residual_layer_norm_equals_eager_float32(shape):
    gen = torch.Generator().manual_seed(0)
    n = shape[-1]
    tensors = [torch.randn(shape, generator=gen) for _ in range(2)] + [1 + 0.3 * torch.randn(n, generator=gen),
                                                                      0.2 * torch.randn(n, generator=gen)]
    ours = [t.to(DEVICE).requires_grad_() for t in tensors]
    eager = [t.to(DEVICE).requires_grad_() for t in tensors]
    y = residual_layer_norm(*ours, eps=1e-5)
    y_eager = F.layer_norm(eager[0] + eager[1], (n,), eager[2], eager[3], 1e-5)
    torch.testing.assert_close(y, y_eager, rtol=1e-6, atol=1e-6)
    dy = torch.randn(shape, generator=gen).to(DEVICE)
    (y * dy).sum().backward()
    (y_eager * dy).sum().backward()
    for mine, theirs, name in zip(ours, eager, ("x", "f", "weight", "bias")):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_residual_layer_norm_rounds_the_sum_as_eager_in_bf16():
    """The sum x + F is rounded to bfloat16 before it is normalised, as eager's is. The rows
    are built to show it: x = 256 everywhere, F = ±0.75 and ±1.25, so the float32 sums 256.75,
    255.25, 257.25, 254.75 round to 256, 255, 258, 255 (bfloat16's step is 2 above 256 and 1
    below, no ties): normalised, the rounded sums and the exact ones differ by 0.73 where one
    bfloat16 step of the output is 2^-7 at most (|y| < 2)."""
    n = 32
    steps = torch.tensor([0.75, -0.75, 1.25, -1.25] * (n // 4))
    x = torch.full((2, n), 256.0, dtype=torch.bfloat16, device=DEVICE)
    f = torch.stack([steps, steps.roll(1)]).to(DEVICE, torch.bfloat16)
    w, b = torch.ones(n, device=DEVICE, dtype=torch.bfloat16), torch.zeros(n, device=DEVICE, dtype=torch.bfloat16)
    y = residual_layer_norm(x, f, w, b)
    assert y.dtype == torch.bfloat16
    rounded = F.layer_norm(x + f, (n,), w, b).float()  # eager: x + f in bfloat16, then the norm
    exact = F.layer_norm(x.float() + f.float(), (n,), w.float(), b.float())  # the sum not rounded
    assert (rounded - exact).abs().max() > 0.7  # the case tells the two apart
    torch.testing.assert_close(y.float(), rounded, rtol=0, atol=2 ** -7)
    # and on random rows, to one bfloat16 step of the output
    gen = torch.Generator().manual_seed(1)
    x, f = (torch.randn(6, n, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
    torch.testing.assert_close(residual_layer_norm(x, f, w, b).float(), F.layer_norm(x + f, (n,), w, b).float(),
                               rtol=2 ** -7, atol=2 ** -7)


def test_residual_layer_norm_refuses_mismatched_shapes():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"^residual_layer_norm: x \(2, 8\), f \(2, 4\), weight \(8,\), bias \(8,\): "):
        residual_layer_norm(x, torch.zeros(2, 4), torch.ones(8), torch.zeros(8))
