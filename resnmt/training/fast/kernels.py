"""Triton kernels for the fast path's elementwise work: the residual addition and the
LayerNorm of a post-LN connection's write, ``LN(x + F)``, in one pass each way.

Eager PyTorch runs ``x + F`` and the LayerNorm as separate kernels (the sum written to
memory, read again, the statistics and the normalisation); :func:`residual_layer_norm` reads
``x`` and ``F`` once, writes the sum (the backward pass needs it) and the normalised output,
and keeps each row's mean and reciprocal standard deviation in float32. Its backward pass
computes the input gradient in one kernel (the same for ``x`` and ``F``) and the weight and
bias gradients from per-row partial products summed by torch.

The arithmetic is ``F.layer_norm(x + F, ...)``'s: the sum is rounded to the inputs' dtype
before it is normalised (as eager's ``x + F`` is), the statistics are float32, the variance
is the biased one. tests/test_triton_kernels.py checks it against eager PyTorch under
``TRITON_INTERPRET=1`` (Triton's interpreter, on the CPU); the same kernels run compiled on
CUDA. Written for Triton 3.6 and later (only ``tl.load``/``tl.store``, ``tl.sum``,
``tl.where``, ``tl.sqrt``).

Not yet called by the connections: a kind's write runs eager PyTorch until the fast path
routes its post-LN writes here on CUDA.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _rounded(v, DTYPE: tl.constexpr):
    """float32 ``v`` in DTYPE, rounded to nearest with ties to even as torch rounds. A float32 to
    bfloat16 cast rounds so compiled, but Triton's interpreter truncates it; the rounding is
    therefore done on the bits (finite values): add half a bfloat16 step, less one where the
    kept bits are even, and drop the 16 low bits, which the cast then keeps exactly."""
    if DTYPE == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = bits.to(tl.float32, bitcast=True)
    return v.to(DTYPE)


@triton.jit
def _add_layer_norm_forward(X, F, Z, Y, W, B, Mean, Rstd, stride, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    x = tl.load(X + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    f = tl.load(F + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    z = _rounded(x + f, Z.dtype.element_ty)  # rounded as eager's x + F is
    tl.store(Z + row * stride + cols, z, mask=inside)
    z = z.to(tl.float32)
    mean = tl.sum(z, axis=0) / n
    centred = tl.where(inside, z - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n + eps)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, _rounded(centred * rstd * w + b, Y.dtype.element_ty), mask=inside)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def _layer_norm_backward(DY, Z, W, Mean, Rstd, DZ, DW, DB, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    z = tl.load(Z + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    normed = tl.where(inside, (z - mean) * rstd, 0.0)
    wdy = tl.where(inside, w * dy, 0.0)
    c_normed = tl.sum(normed * wdy, axis=0) / n
    c_mean = tl.sum(wdy, axis=0) / n
    dz = (wdy - (normed * c_normed + c_mean)) * rstd
    tl.store(DZ + row * stride + cols, _rounded(dz, DZ.dtype.element_ty), mask=inside)
    tl.store(DW + row * n + cols, dy * normed, mask=inside)  # per-row partials, summed by torch
    tl.store(DB + row * n + cols, dy, mask=inside)


class _ResidualLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f, weight, bias, eps):
        shape, n = x.shape, x.shape[-1]
        x2, f2 = x.reshape(-1, n).contiguous(), f.reshape(-1, n).contiguous()
        rows = x2.size(0)
        z, y = torch.empty_like(x2), torch.empty_like(x2)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        block = triton.next_power_of_2(n)
        _add_layer_norm_forward[(rows,)](x2, f2, z, y, weight, bias, mean, rstd, x2.stride(0), n, eps, BLOCK=block)
        ctx.save_for_backward(z, weight, mean, rstd)
        ctx.shape, ctx.block = shape, block
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        z, weight, mean, rstd = ctx.saved_tensors
        rows, n = z.shape
        dy2 = dy.reshape(rows, n).contiguous()
        dz = torch.empty_like(z)
        dw = torch.empty(rows, n, dtype=torch.float32, device=z.device)
        db = torch.empty_like(dw)
        _layer_norm_backward[(rows,)](dy2, z, weight, mean, rstd, dz, dw, db, z.stride(0), n, BLOCK=ctx.block)
        dz = dz.view(ctx.shape)
        return dz, dz, dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype), None


def residual_layer_norm(x: torch.Tensor, f: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm(x + f, (d,), weight, bias, eps)`` over the last dimension ``d`` in one
    Triton kernel forward and one backward (module docstring)."""
    if x.shape != f.shape or weight.shape != (x.shape[-1],) or bias.shape != weight.shape:
        raise ValueError(f"residual_layer_norm: x {tuple(x.shape)}, f {tuple(f.shape)}, weight "
                         f"{tuple(weight.shape)}, bias {tuple(bias.shape)}: give x and f of one shape and a weight "
                         "and bias of its last dimension")
    return _ResidualLayerNorm.apply(x, f, weight, bias, float(eps))
