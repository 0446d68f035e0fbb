"""fairseq's Adam step for the fast path in one Triton kernel launch over every parameter.

The multi-tensor update (``update.py``, torch ``_foreach`` operations) passes over the
parameters' memory about ten times an update: the gradients scaled and clipped in place,
the two moments, the square root and eps, the weight decay, the step, the copy into the
``--bf16`` model, the gradients zeroed. :class:`FusedAdam` does all of it in one pass: for
each element it reads the gradient, the two moments and the float32 (master) weight, and
writes the moments, the weight, its ``--bf16`` copy and a zero into the gradient::

    g <- factor * g                      (world size / sample size, times the clipping factor)
    m <- beta1 m + (1 - beta1) g         v <- beta2 v + (1 - beta2) g^2
    p <- p + decay p                     (decay = -weight decay * lr)
    p <- p + neg_step * m / (sqrt(v) + eps)   (neg_step = -lr sqrt(1 - beta2^t) / (1 - beta1^t))

which is fairseq's ``Adam.step`` (``fairseq/optim/adam.py``: decoupled weight decay, eps
added to ``sqrt(v)`` outside the bias correction), to float32 rounding (a product may be
fused into an add here where torch rounds it apart). torch's own fused AdamW kernel gives
this update only with ``eps / sqrt(1 - beta2^t)`` as its eps, a host float that changes every
step and would be baked into a captured graph, so it is not used here (``--optimizer
adam_fused`` uses it eagerly).

One launch serves every tensor: the kernel's blocks are laid over the tensors one after
another, and tables made once (device tensors of each tensor's addresses and size, and
each block's tensor and offset) tell a block where to work. The tensors never move (the
gradients are held by ``DeviceUpdate.hold_grads``; a loaded checkpoint builds a new
update), so the tables stay right and a captured graph replays the one launch. ``factor``,
``decay`` and ``neg_step`` are read from 0-dimensional device tensors, filled before each
update. The kernel runs compiled on CUDA and under Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``: tests/test_fused_adam_kernel.py).
"""
from typing import List, Optional

import torch

BLOCK = 1024  # elements per block


try:
    import triton
    import triton.language as tl
except ImportError:  # the multi-tensor update serves (update.adam_kernel_for)
    triton = None


def triton_available() -> bool:
    return triton is not None


if triton is not None:
    @triton.jit
    def _round_to_bf16(x):
        """float32 to bfloat16 rounded to nearest even, in integer operations (Triton's
        interpreter truncates in ``.to``; compiled Triton rounds, to the same value)."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        bits = tl.where(x != x, 0x7FC0, bits)  # NaN stays NaN
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _adam_blocks(P, G, M, V, OUT, NUMEL, BLOCK_TENSOR, BLOCK_START, FACTOR, NEG_STEP, DECAY,
                     beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
                     G_TYPE: tl.constexpr, OUT_TYPE: tl.constexpr, HAS_OUT: tl.constexpr, SIZE: tl.constexpr):
        block = tl.program_id(0)
        t = tl.load(BLOCK_TENSOR + block)
        offsets = tl.load(BLOCK_START + block) + tl.arange(0, SIZE)
        inside = offsets < tl.load(NUMEL + t)
        p_at = tl.load(P + t).to(tl.pointer_type(tl.float32))
        m_at = tl.load(M + t).to(tl.pointer_type(tl.float32))
        v_at = tl.load(V + t).to(tl.pointer_type(tl.float32))
        g_at = tl.load(G + t).to(tl.pointer_type(G_TYPE))
        g = tl.load(g_at + offsets, mask=inside, other=0.0).to(tl.float32) * tl.load(FACTOR)
        m = beta1 * tl.load(m_at + offsets, mask=inside, other=0.0) + one_minus_beta1 * g
        v = beta2 * tl.load(v_at + offsets, mask=inside, other=0.0) + one_minus_beta2 * (g * g)
        p = tl.load(p_at + offsets, mask=inside, other=0.0)
        p = p + tl.load(DECAY) * p
        p = p + (tl.load(NEG_STEP) * m) / (tl.sqrt(v) + eps)
        tl.store(m_at + offsets, m, mask=inside)
        tl.store(v_at + offsets, v, mask=inside)
        tl.store(p_at + offsets, p, mask=inside)
        if HAS_OUT:
            out_at = tl.load(OUT + t).to(tl.pointer_type(OUT_TYPE))
            if OUT_TYPE == tl.bfloat16:
                tl.store(out_at + offsets, _round_to_bf16(p), mask=inside)
            else:
                tl.store(out_at + offsets, p.to(OUT_TYPE), mask=inside)
        tl.store(g_at + offsets, tl.zeros_like(g).to(G_TYPE), mask=inside)


def _kernel():
    if triton is None:
        raise RuntimeError("fused Adam: Triton is not installed")
    return _adam_blocks


def _triton_type(dtype: torch.dtype):
    types = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}
    if dtype not in types:
        raise ValueError(f"fused Adam: gradients or model weights in {dtype}; it takes float32 and bfloat16")
    return types[dtype]


class FusedAdam:
    """fairseq's Adam step (module docstring) over ``params`` (float32 weights), their
    gradients ``grads`` (float32, or the half-precision model's, read and zeroed here), the
    moments ``exp_avgs`` and ``exp_avg_sqs`` (float32) and, for ``--bf16``, ``outputs`` (the
    model's weights, given the new values rounded to their dtype); one launch per update."""

    def __init__(self, params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
                 exp_avg_sqs: List[torch.Tensor], outputs: Optional[List[torch.Tensor]], betas, eps: float):
        if triton is None:
            raise ValueError("fused Adam: Triton is not installed")
        groups = [params, grads, exp_avgs, exp_avg_sqs] + ([outputs] if outputs is not None else [])
        if len({len(g) for g in groups}) != 1:
            raise ValueError("fused Adam: give as many gradients, moments and outputs as parameters")
        for i, p in enumerate(params):
            if any(g[i].shape != p.shape or not g[i].is_contiguous() for g in groups):
                raise ValueError(f"fused Adam: parameter {i} {tuple(p.shape)}: its gradient, moments and output "
                                 "must be contiguous tensors of its shape")
        floats = {t.dtype for t in params + exp_avgs + exp_avg_sqs}
        if floats != {torch.float32}:
            raise ValueError(f"fused Adam: weights and moments in {sorted(map(str, floats))}; it steps float32 ones")
        self.g_type = _triton_type(self._one_dtype(grads, "gradients"))
        self.out_type = _triton_type(self._one_dtype(outputs, "model weights") if outputs is not None
                                     else torch.float32)
        self.keep = groups  # the tables hold their addresses
        device = params[0].device
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps = float(eps)

        def addresses(tensors):
            return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)

        self.tables = [addresses(g) for g in groups]
        if outputs is None:
            self.tables.append(self.tables[0])  # not read (HAS_OUT false)
        numel = [p.numel() for p in params]
        blocks = [(t, start) for t, n in enumerate(numel) for start in range(0, n, BLOCK)]
        self.numel = torch.tensor(numel, dtype=torch.int32, device=device)
        self.block_tensor = torch.tensor([t for t, _ in blocks], dtype=torch.int32, device=device)
        self.block_start = torch.tensor([s for _, s in blocks], dtype=torch.int32, device=device)
        self.has_out = outputs is not None

    @staticmethod
    def _one_dtype(tensors, what) -> torch.dtype:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise ValueError(f"fused Adam: {what} in {sorted(map(str, dtypes))}; give them one dtype")
        return dtypes.pop()

    def __call__(self, factor: torch.Tensor, neg_step_size: torch.Tensor, decay: torch.Tensor) -> None:
        """The step: gradients times ``factor``, Adam at ``neg_step_size`` and ``decay``
        (0-dimensional float32 device tensors), the gradients zeroed."""
        p, g, m, v, out = self.tables
        _kernel()[(self.block_tensor.numel(),)](
            p, g, m, v, out, self.numel, self.block_tensor, self.block_start, factor, neg_step_size, decay,
            self.beta1, 1 - self.beta1, self.beta2, 1 - self.beta2, self.eps,
            G_TYPE=self.g_type, OUT_TYPE=self.out_type, HAS_OUT=self.has_out, SIZE=BLOCK)
