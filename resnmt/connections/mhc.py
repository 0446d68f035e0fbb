"""mHC, manifold-constrained Hyper-Connections (DeepSeek, arXiv:2512.24880): Hyper-Connections'
form (:mod:`resnmt.connections.hyper`: the same width and depth steps, the same stack
stream) with the read, write and mixing weights computed from all n streams and the
mixing matrix projected by Sinkhorn-Knopp onto (close to) the doubly stochastic matrices.

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

``H_pre`` sums to 1 and ``H_res``'s rows sum to 1, so with the n equal streams of the
stack's ``H⁰`` (:class:`~resnmt.connections.hyper.HyperStream`) every stream stays the
pre-LN residual: mHC at init is pre-LN up to rounding (tested: a few float32 ulps; 1e-11
in float64, where the float32-stored ``b_pre`` give Σσ(b_pre) = 1 - 4e-9 at n = 3). The
first sublayer's ``H_res`` acts on n equal copies of the embedding, which any
row-stochastic matrix leaves unchanged: it never gets a gradient (a property of the
method, not of the init). ``H_pre`` is not uniform on purpose: with ``b_pre``, ``b_post``, ``b_res`` all symmetric in the streams,
every gradient would be symmetric too and the n streams would stay equal for ever (one
stream with extra parameters); ``e_{k mod n}`` breaks the symmetry as HC's ``A_m`` does.
"""
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.hyper import DEFAULT_STREAMS, HC_STREAMS, MultiStreamConnection, StreamMixer
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, register_connection
from resnmt.options import Option

MHC_ALPHA_INIT = 0.01  # α_pre, α_post, α_res (mHC, Table 5)
MHC_INIT_LEAK = 0.01  # ε of mHC's initial H_pre and H_res (ours: the paper leaves it open)
DEFAULT_SINKHORN_ITERATIONS = 20  # mHC's t_max
RMS_EPS = 1e-5  # resnmt's norm eps (fairseq's LayerNorm's), for mHC's RMSNorm too


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


class ManifoldHyperMixer(StreamMixer):
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


@register_connection
class ManifoldHyperConnection(MultiStreamConnection):
    """mHC (DeepSeek, arXiv:2512.24880): Hyper-Connections' form with ``H_pre = σ(·)``,
    ``H_post = 2σ(·)`` and the mixing matrix ``H_res`` projected by Sinkhorn-Knopp onto
    (close to) the doubly stochastic matrices, each from ``RMSNorm(vec H) φ``
    (:class:`ManifoldHyperMixer`; the initial b's are ours, within ε = 0.01 of HC's
    init, so pre-LN at init up to rounding). fairseq's init of the
    projections is kept (the mHC paper states no scaling)."""

    kind = "mhc"
    equation = "H ← H_res·H + H_postᵀ·F(LN(H_pre·H)), H_res = SK(·)"
    note = "n streams (--hc-streams); H_pre, H_post sigmoids; Sinkhorn-Knopp"
    source = "mHC, DeepSeek 2025, arXiv:2512.24880"
    flags = (
        HC_STREAMS,
        Option("mhc_sinkhorn_iterations", DEFAULT_SINKHORN_ITERATIONS, kind="int", above=0, metavar="T",
               help=f"mhc: Sinkhorn-Knopp iterations projecting H_res (default: {DEFAULT_SINKHORN_ITERATIONS}, "
               "the paper's)"),
    )
    arch_family = "mhc"
    # each stack's first sublayer mixes n equal copies of the embedding, which every
    # row-stochastic H_res leaves unchanged
    no_gradient_by_design = tuple(f"*.layers.0.self_attn_connection.streams.{p}" for p in ("bias_res", "alpha_res"))

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        if spec.hc_streams < 2:
            raise ConnectionConfigError(
                f"--hc-streams {spec.hc_streams} is invalid for --residual mhc: it needs at least 2 streams")

    def learned(self) -> Dict[str, List[float]]:
        """``mhc_pre`` σ(b_pre) (n), ``mhc_post`` 2σ(b_post) (n), ``mhc_res`` SK(b_res) row-major
        (n²): the mappings where the dynamic part α·x⃗'φ is 0."""
        s = self.streams
        with torch.no_grad():
            res = sinkhorn_knopp(s.bias_res.detach().float(), s.sinkhorn_iterations)
            return {"mhc_pre": torch.sigmoid(s.bias_pre.detach().float()).cpu().tolist(),
                    "mhc_post": (2 * torch.sigmoid(s.bias_post.detach().float())).cpu().tolist(),
                    "mhc_res": res.flatten().cpu().tolist()}

    def build_mixer(self, dim: int, spec: ConnectionSpec) -> nn.Module:
        return ManifoldHyperMixer(dim, spec.hc_streams, spec.sublayer_index, spec.mhc_sinkhorn_iterations)
