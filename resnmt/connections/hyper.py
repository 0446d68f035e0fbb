"""Multi-stream residual connections: Hyper-Connections (static and dynamic) and mHC.

Both widen the residual stream into ``n`` streams: every position carries
``H`` of shape ``(T, B, n, C)`` (fairseq is time-major) instead of ``x`` of shape ``(T, B, C)``.
Each sublayer ``F`` (attention, cross-attention, FFN: one module each) reads a weighted
sum of the streams and writes its output back into every stream with its own weight:

    width:  h_in = a_inᵀ H      (C,)     the sublayer's input (F keeps its own pre-norm)
            H'   = M H          (n, C)   the streams mixed
    depth:  Ĥ    = H' + b ⊗ F(h_in)      b (n,) the write-back weights

:func:`expand_streams` tiles the embedded input n times (``H⁰``), :func:`reduce_streams`
sums the streams before the stack's final norm. Every operation is per position, so one
step of incremental decoding computes what the full forward computes there.

A sublayer runs as ``h_in, mixed, write = conn.width(H)``;
``H = conn.depth(dropout(F(norm(h_in))), mixed, write)`` (dropout on the branch, as the HC
paper's Algorithm 3; the package ``hyper-connections`` drops the streams instead).

==========================  ===============================  ===============================
class                       a_in, M, b                       source
==========================  ===============================  ===============================
StaticHyperConnection       A_m, A_rᵀ, B (learned scalars)    Zhu et al., "Hyper-Connections",
DynamicHyperConnection      + s·tanh(norm(H) W) per position  ICLR 2025, arXiv 2409.19606
ManifoldHyperConnection     σ(·), Sinkhorn-Knopp(exp(·)),    DeepSeek, "mHC", arXiv 2512.24880
                            2σ(·) of RMSNorm(vec H) φ
==========================  ===============================  ===============================

**Hyper-Connections** (the paper's Eq. 2-5): ``HC = [[0, B], [A_m, A_r]]``,
``h₀ = A_mᵀH``, ``H' = A_rᵀH``, ``Ĥ = Bᵀ F(h₀) + H'``. The parameter ``alpha`` is the
paper's lower block ``[A_m | A_r]`` of shape ``(n, n+1)``, ``beta`` is ``B`` (``n``).
Dynamic (Eq. 10-13), with ``H̄ = norm(H)`` row-wise (one norm of size C, LayerNorm in the
paper, here the stack's ``--normalization``):
``[A_m | A_r](H) = s_α·tanh(H̄ [W_m | W_r]) + [A_m | A_r]``, ``B(H) = s_β·tanh(H̄ W_β)ᵀ + B``;
``alpha_weight`` is ``[W_m | W_r]`` ``(C, n+1)``, ``beta_weight`` is ``W_β`` ``(C,)``,
``alpha_scale``/``beta_scale`` the scalars s_α, s_β. Row i of the dynamic part depends only
on stream i.
Init (§2.3): ``B = 1``, ``A_m = e_{k mod n}``, ``A_r = I``, ``W = 0``, ``s = 0.01``;
k is the sublayer's index in its stack (the paper's figures number attention and FFN
separately). All streams then stay equal and each is the pre-LN residual: the network is
pre-LN at init, and the reduced output is n times pre-LN's (which the final norm removes).
Not here: the paper's √n scaling of the output projections' init and its weight-decay
split (none on the static parts), which belong to the layer and the optimizer; see
:func:`output_projection_init_factor`.

**mHC** (Eq. 7-9): with ``x⃗' = RMSNorm(vec H)`` over the whole ``nC`` vector (no gain: the
projection φ absorbs it, and the paper's parameter count ``nC(n²+2n) + n²+2n + 3`` has none),
``H_pre = σ(α_pre x⃗'φ_pre + b_pre)`` (n), ``H_post = 2σ(α_post x⃗'φ_post + b_post)`` (n),
``H_res = SK(α_res mat(x⃗'φ_res) + b_res)`` (n×n); ``x_{l+1} = H_res x_l + H_postᵀ F(H_pre x_l)``.
``phi`` is ``[φ_pre | φ_post | φ_res]`` of shape ``(nC, n²+2n)`` (φ_res row-major), α = 0.01
(Table 5). The paper leaves the init of φ and of the b's open; the choices here (ours):

* ``φ = 0`` (as HC's W): every mapping starts static and φ gets a gradient at once (α ≠ 0);
* ``b_post = 0``: ``H_post = 2σ(0) = 1`` exactly, HC's ``B = 1``;
* ``H_pre = σ(b_pre) = ε·1 + (1 - nε)·e_{k mod n}`` and ``H_res = SK(exp(b_res)) = ε·11ᵀ +
  (1 - nε)·I`` (``b_res`` the log of that matrix, already doubly stochastic, so Sinkhorn-Knopp
  returns it), ε = :data:`MHC_INIT_LEAK` = 0.01: within ε of HC's ``A_m = e_k``, ``A_r = I``
  (the sigmoid and the Birkhoff polytope's interior exclude ε = 0; at n = 4 the diagonal
  of H_res is 0.97, where the package's ``b_res = I`` gives e/(e+3) ≈ 0.475).

``H_pre`` sums to 1 and ``H_res``'s rows sum to 1, so with the n equal streams of
:func:`expand_streams` every stream stays the pre-LN residual: mHC at init is pre-LN up
to rounding (tested: a few float32 ulps; 1e-11 in float64, where the float32-stored
``b_pre`` give Σσ(b_pre) = 1 - 4e-9 at n = 3). The first sublayer's ``H_res`` acts on n
equal copies of the embedding, which any row-stochastic matrix leaves unchanged: it never
gets a gradient (a property of the method, not of the init). ``H_pre`` is not
uniform on purpose: with ``b_pre``, ``b_post``, ``b_res`` all symmetric in the streams,
every gradient would be symmetric too and the n streams would stay equal for ever (one
stream with extra parameters); ``e_{k mod n}`` breaks the symmetry as HC's ``A_m`` does.
"""
import math
from typing import Tuple

import torch
from torch import Tensor, nn

DEFAULT_STREAMS = 4  # the expansion rate n of both papers
HC_SCALE_INIT = 0.01  # s_α, s_β (HC, §2.2)
MHC_ALPHA_INIT = 0.01  # α_pre, α_post, α_res (mHC, Table 5)
MHC_INIT_LEAK = 0.01  # ε of mHC's initial H_pre and H_res (ours: the paper leaves it open)
DEFAULT_SINKHORN_ITERATIONS = 20  # mHC's t_max
RMS_EPS = 1e-5  # resnmt's norm eps (fairseq's LayerNorm's), for mHC's RMSNorm too


def expand_streams(x: Tensor, num_streams: int) -> Tensor:
    """``H⁰``: ``x`` (T, B, C) tiled into ``num_streams`` equal streams, (T, B, n, C). A view:
    nothing writes into it, and its gradient is the sum over the streams."""
    return x.unsqueeze(-2).expand(x.size(0), x.size(1), num_streams, x.size(2))


def reduce_streams(h: Tensor) -> Tensor:
    """The streams summed, (T, B, n, C) -> (T, B, C): the HC paper's ``Σ_rows H^L``, before
    the stack's final norm (the order the paper gives; the package's README is unsure)."""
    return h.sum(dim=-2)


def output_projection_init_factor(num_streams: int) -> float:
    """The factor for the initial std of each sublayer's output projection (attention's
    ``out_proj``, the FFN's ``fc2``) under Hyper-Connections: ``n ** -0.5``.

    The paper scales that std "by a factor of √n" "to keep the std before the final norm
    unchanged" and does not say in which direction. Before the final norm the stack's
    output is the sum of the n streams; once the streams differ, the branch outputs they
    carry add up like n independent terms, whose sum has √n times one term's std. Dividing
    by √n keeps that sum's std at pre-LN's; multiplying would make it n times larger, the
    opposite of the stated purpose. Our reading, not verified against code (none is
    public); the layer applies it, this module owns no projection.
    """
    return 1.0 / math.sqrt(num_streams)


def sinkhorn_knopp(logits: Tensor, iterations: int = DEFAULT_SINKHORN_ITERATIONS) -> Tensor:
    """mHC's projection onto (close to) the doubly stochastic matrices:
    ``M⁰ = exp(logits)``, ``Mᵗ = T_row(T_col(Mᵗ⁻¹))`` for t = 1..iterations, where T_col
    divides each column by its sum and T_row each row; the rows of the result sum to 1 (up
    to rounding), the columns approximately.

    ``logits`` (..., n, n); computed in float32 at least (it is 20 pairs of divisions) and
    returned in that dtype. The exponent is shifted by each matrix's maximum so that it
    cannot overflow: a common factor cancels in the first T_col, so the iterates are the
    paper's (up to rounding).
    """
    m = logits if logits.dtype == torch.float64 else logits.float()
    m = torch.exp(m - m.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iterations):
        m = m / m.sum(dim=-2, keepdim=True)
        m = m / m.sum(dim=-1, keepdim=True)
    return m


class StreamConnection(nn.Module):
    """One sublayer's connection over n streams: :meth:`width` before the sublayer,
    :meth:`depth` after it. ``index``: the sublayer's position in its stack (0-based, every
    sublayer counted: attention, cross-attention and FFN), which picks the stream it
    starts reading (k mod n)."""

    def __init__(self, dim: int, num_streams: int, index: int):
        super().__init__()
        if num_streams < 1 or dim < 1 or index < 0:
            raise ValueError(f"dim {dim}, num_streams {num_streams}, index {index}: "
                             "expected positive sizes and index >= 0")
        self.dim = dim
        self.num_streams = num_streams
        self.index = index

    @torch.jit.export
    def width(self, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``h`` (T, B, n, C) -> (the sublayer's input (T, B, C), the mixed streams
        (T, B, n, C), the write-back weights ((n,) or (T, B, n)))."""
        raise NotImplementedError

    @torch.jit.export
    def depth(self, branch_output: Tensor, mixed: Tensor, write: Tensor) -> Tensor:
        """``mixed + write ⊗ branch_output``: (T, B, C), (T, B, n, C), (n,) or (T, B, n)
        -> (T, B, n, C); stream i gets ``write[i]`` times the sublayer's output."""
        return torch.addcmul(mixed, write.to(mixed.dtype).unsqueeze(-1), branch_output.unsqueeze(-2))

    def _mix(self, read_and_mix: Tensor, h: Tensor) -> Tuple[Tensor, Tensor]:
        """``read_and_mix`` (n+1, n) or (T, B, n+1, n): row 0 the read weights, rows 1..n the
        mixing matrix; one product for both, then split. einsum, not matmul: matmul
        broadcasts a static (n+1, n) to every position and is 3 times slower on the CPU."""
        mixed = torch.einsum("...ks,...sc->...kc", [read_and_mix.to(h.dtype), h])
        return mixed[..., 0, :], mixed[..., 1:, :]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, streams={self.num_streams}, index={self.index}"


def _hc_initial_alpha(num_streams: int, index: int) -> Tensor:
    """``[A_m | A_r]`` at init: ``A_m = e_{index mod n}``, ``A_r = I`` (HC, §2.3)."""
    alpha = torch.zeros(num_streams, num_streams + 1)
    alpha[index % num_streams, 0] = 1.0
    alpha[:, 1:] = torch.eye(num_streams)
    return alpha


class StaticHyperConnection(StreamConnection):
    """SHC: learned scalars only, ``n(n+2)`` parameters: ``alpha = [A_m | A_r]`` (n, n+1),
    ``beta = B`` (n,). ``h_in = A_mᵀH``, ``H' = A_rᵀH``, ``Ĥ = Bᵀ F + H'``."""

    def __init__(self, dim: int, num_streams: int = DEFAULT_STREAMS, index: int = 0):
        super().__init__(dim, num_streams, index)
        self.alpha = nn.Parameter(_hc_initial_alpha(num_streams, index))
        self.beta = nn.Parameter(torch.ones(num_streams))

    @torch.jit.export
    def width(self, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        # alphaᵀ (n+1, n): row 0 = A_mᵀ, rows 1.. = A_rᵀ
        branch_input, mixed = self._mix(self.alpha.t(), h)
        return branch_input, mixed, self.beta


class DynamicHyperConnection(StaticHyperConnection):
    """DHC: SHC's scalars plus a per-position part from ``H̄ = norm(H)`` (``norm`` over C,
    one module shared by the n rows; the paper's is a LayerNorm):
    ``[A_m | A_r](H) = alpha + alpha_scale·tanh(H̄ alpha_weight)`` (T, B, n, n+1) and
    ``B(H) = beta + beta_scale·tanh(H̄ beta_weight)`` (T, B, n). ``alpha_weight`` (C, n+1)
    and ``beta_weight`` (C,) start at 0, so DHC starts as SHC; they get a gradient at
    once (the scales are 0.01), the scales only once the weights have moved off 0.
    Parameters: |norm| + C(n+2) + n(n+2) + 2."""

    def __init__(self, dim: int, norm: nn.Module, num_streams: int = DEFAULT_STREAMS, index: int = 0):
        super().__init__(dim, num_streams, index)
        self.norm = norm
        self.alpha_weight = nn.Parameter(torch.zeros(dim, num_streams + 1))
        self.beta_weight = nn.Parameter(torch.zeros(dim))
        self.alpha_scale = nn.Parameter(torch.full((1,), HC_SCALE_INIT))
        self.beta_scale = nn.Parameter(torch.full((1,), HC_SCALE_INIT))

    @torch.jit.export
    def width(self, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        normed = self.norm(h)
        alpha = self.alpha + self.alpha_scale * torch.tanh(torch.matmul(normed, self.alpha_weight.to(normed.dtype)))
        beta = self.beta + self.beta_scale * torch.tanh(torch.matmul(normed, self.beta_weight.to(normed.dtype)))
        branch_input, mixed = self._mix(alpha.transpose(-1, -2), h)
        return branch_input, mixed, beta


def mhc_initial_biases(num_streams: int, index: int, leak: float = MHC_INIT_LEAK) -> Tuple[Tensor, Tensor, Tensor]:
    """(b_pre (n,), b_post (n,), b_res (n, n)) at init: ``σ(b_pre) = leak·1 + (1 - n·leak)·e_{index mod n}``,
    ``2σ(b_post) = 1``, ``exp(b_res) = leak·11ᵀ + (1 - n·leak)·I`` (see the module's docstring)."""
    n = num_streams
    if not 0.0 < leak < 1.0 / n:
        raise ValueError(f"mHC's initial leak {leak} must lie in (0, 1/n) = (0, {1.0 / n:g})")
    pre = torch.full((n,), leak, dtype=torch.float64)
    pre[index % n] += 1.0 - n * leak
    res = torch.full((n, n), leak, dtype=torch.float64) + (1.0 - n * leak) * torch.eye(n, dtype=torch.float64)
    return torch.logit(pre).float(), torch.zeros(n), torch.log(res).float()


class ManifoldHyperConnection(StreamConnection):
    """mHC: ``H_pre = σ(·)`` (the read weights), ``H_post = 2σ(·)`` (the write-back
    weights), ``H_res = SK(·)`` (the mixing matrix, ``sinkhorn_iterations`` of
    :func:`sinkhorn_knopp`), each ``α·(x⃗'φ) + b`` with ``x⃗' = RMSNorm(vec H)`` over nC.
    Parameters: ``phi`` (nC, n²+2n), ``bias_pre`` (n,), ``bias_post`` (n,), ``bias_res`` (n, n),
    ``alpha_pre``/``alpha_post``/``alpha_res`` (1,) each: nC(n²+2n) + n²+2n + 3 (the paper's count).
    Init: see the module's docstring (n >= 2: σ cannot reach 1)."""

    def __init__(self, dim: int, num_streams: int = DEFAULT_STREAMS, index: int = 0,
                 sinkhorn_iterations: int = DEFAULT_SINKHORN_ITERATIONS):
        super().__init__(dim, num_streams, index)
        if num_streams < 2:
            raise ValueError("mHC needs at least 2 streams (H_pre = σ(·) cannot select a single stream)")
        if sinkhorn_iterations < 1:
            raise ValueError(f"sinkhorn_iterations {sinkhorn_iterations}: expected >= 1")
        n = num_streams
        self.sinkhorn_iterations = sinkhorn_iterations
        self.eps = RMS_EPS
        self.phi = nn.Parameter(torch.zeros(n * dim, n * n + 2 * n))
        b_pre, b_post, b_res = mhc_initial_biases(n, index)
        self.bias_pre = nn.Parameter(b_pre)
        self.bias_post = nn.Parameter(b_post)
        self.bias_res = nn.Parameter(b_res)
        self.alpha_pre = nn.Parameter(torch.full((1,), MHC_ALPHA_INIT))
        self.alpha_post = nn.Parameter(torch.full((1,), MHC_ALPHA_INIT))
        self.alpha_res = nn.Parameter(torch.full((1,), MHC_ALPHA_INIT))

    def mappings(self, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(H_pre (T, B, n), H_post (T, B, n), H_res (T, B, n, n)) at each position of ``h``
        (T, B, n, C), in float32 (float64 for float64 input)."""
        n = self.num_streams
        flat = h.flatten(-2)
        flat = flat if flat.dtype == torch.float64 else flat.float()
        normed = torch.rms_norm(flat, [flat.size(-1)], None, self.eps)
        projected = torch.matmul(normed, self.phi.to(normed.dtype))
        # under autocast the matmul comes back in bf16/fp16; the maps are computed in float32
        projected = projected.to(normed.dtype)
        pre = torch.sigmoid(self.alpha_pre * projected[..., :n] + self.bias_pre)
        post = 2.0 * torch.sigmoid(self.alpha_post * projected[..., n:2 * n] + self.bias_post)
        res_logits = self.alpha_res * projected[..., 2 * n:].unflatten(-1, (n, n)) + self.bias_res
        return pre, post, sinkhorn_knopp(res_logits, self.sinkhorn_iterations)

    @torch.jit.export
    def width(self, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        pre, post, res = self.mappings(h)
        branch_input, mixed = self._mix(torch.cat([pre.unsqueeze(-2), res], dim=-2), h)
        return branch_input, mixed, post

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sinkhorn_iterations={self.sinkhorn_iterations}"
