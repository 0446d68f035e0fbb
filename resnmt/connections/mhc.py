"""Kinds with n residual streams: Hyper-Connections (static or dynamic) and mHC.

Each sublayer's connection holds the pre-norm of pre-LN (the sublayer keeps it) and one
stream connection of :mod:`resnmt.connections.hyper`, built for the sublayer's index k in its
stack (``spec.sublayer_index``). The layer hands it the streams ``H`` (T, B, n, C) and runs
the sublayer as ``h, mixed, write = conn.width(H)``,
``H = conn.depth(dropout(F(conn.prenorm(h))), mixed, write)``; the stack's
:class:`~resnmt.connections.streams.HyperStream` tiles the embedded input n times before the
first layer and sums the streams before the final norm.
"""
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.base import FFN_OUT, OUTPUT
from resnmt.connections.classic import PreLNConnection
from resnmt.connections.hyper import (
    DEFAULT_SINKHORN_ITERATIONS,
    DEFAULT_STREAMS,
    DynamicHyperConnection,
    ManifoldHyperConnection,
    StaticHyperConnection,
    output_projection_init_factor,
    sinkhorn_knopp,
)
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, register_connection
from resnmt.connections.streams import HyperStream, ResidualStream
from resnmt.flags import Flag, positive_int

HC_STREAMS = Flag(
    "hc_streams", DEFAULT_STREAMS, check=positive_int, metavar="N",
    help=f"hyper/mhc: the number n of residual streams (the expansion rate) (default: {DEFAULT_STREAMS}, the papers')",
)


class MultiStreamConnection(PreLNConnection):
    """What Hyper-Connections and mHC share: pre-LN's norm for the sublayer's input, a
    stream connection (``streams``) for the sublayer's index, the stack's n streams."""

    multi_stream = True
    flags: Tuple[Flag, ...] = (HC_STREAMS,)

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.streams = self.build_streams(dim, spec)

    def build_streams(self, dim: int, spec: ConnectionSpec) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return HyperStream(spec.hc_streams)

    def width(self, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``H`` (T, B, n, C) -> (the sublayer's input before its norm (T, B, C), the mixed
        streams (T, B, n, C), the write-back weights)."""
        return self.streams.width(h)

    def depth(self, branch_output: Tensor, mixed: Tensor, write: Tensor) -> Tensor:
        return self.streams.depth(branch_output, mixed, write)

    def learned(self) -> Dict[str, List[float]]:  # pragma: no cover - abstract
        """What ``resnmt-analyze`` reports of this sublayer's learned mixing: one row per
        name (the static part; the per-position dynamic part is left out)."""
        raise NotImplementedError

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        """The streams after the sublayer, from the streams ``x`` (T, B, n, C) before it and
        the sublayer's output ``fx`` (T, B, C) (the layer calls :meth:`width` and
        :meth:`depth` itself, so as to mix once)."""
        _, mixed, write = self.width(x)
        return self.depth(fx, mixed, write)


@register_connection
class HyperConnection(MultiStreamConnection):
    """Hyper-Connections (Zhu et al., ICLR 2025, arXiv:2409.19606): n streams, each
    sublayer reads ``A_mᵀH`` and writes ``A_rᵀH + Bᵀ F``; static (learned scalars) or, with
    ``--hc-dynamic``, plus a per-position part from ``tanh(norm(H) W)`` (the norm of
    ``--normalization``). The paper's init: pre-LN at init (every stream the pre-LN
    residual). Each sublayer's output projection (attention's ``out_proj``, the FFN's
    ``fc2``) starts with its weights times ``n^-1/2`` (the paper's "√n" read as a division,
    :func:`~resnmt.connections.hyper.output_projection_init_factor`) unless ``--hc-no-init-scaling``."""

    kind = "hyper"
    equation = "H ← A_rᵀH + Bᵀ·F(LN(A_mᵀH))"
    note = "n streams (--hc-streams); H⁰ = n copies of x₀, output ΣH then the final LN"
    source = "Hyper-Connections, Zhu et al., ICLR 2025, arXiv:2409.19606"
    flags = (
        HC_STREAMS,
        Flag("hc_dynamic", False, switch=True, owners_only=True,
             help="hyper: dynamic Hyper-Connections (DHC), A_m, A_r, B plus s*tanh(norm(H) W) per position "
             "(default: static, SHC)"),
        Flag("hc_no_init_scaling", False, switch=True, owners_only=True,
             help="hyper: keep fairseq's init of the output projections (out_proj, fc2) instead of the "
             "paper's scaling by sqrt(n) (read as a division) (default: scaled)"),
    )
    arch_family = "hyper"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.init_factor = None if spec.hc_no_init_scaling else output_projection_init_factor(spec.hc_streams)

    def build_streams(self, dim: int, spec: ConnectionSpec) -> nn.Module:
        if spec.hc_dynamic:
            return DynamicHyperConnection(dim, spec.norm(dim), spec.hc_streams, spec.sublayer_index)
        return StaticHyperConnection(dim, spec.hc_streams, spec.sublayer_index)

    def learned(self) -> Dict[str, List[float]]:
        """``hc_read`` A_m (n), ``hc_write`` B (n), ``hc_mix`` A_r row-major (n²): the static
        parameters (DHC's per-position part is left out)."""
        alpha = self.streams.alpha.detach().float().cpu()
        return {"hc_read": alpha[:, 0].tolist(), "hc_write": self.streams.beta.detach().float().cpu().tolist(),
                "hc_mix": alpha[:, 1:].flatten().tolist()}

    def initialize_sublayer(self, projections: Mapping[str, nn.Module]) -> None:
        if self.init_factor is None:
            return
        with torch.no_grad():
            for role in (OUTPUT, FFN_OUT):
                if role in projections:
                    projections[role].weight.mul_(self.init_factor)


@register_connection
class ManifoldHyperConnectionKind(MultiStreamConnection):
    """mHC (DeepSeek, arXiv:2512.24880): Hyper-Connections' form with ``H_pre = σ(·)``,
    ``H_post = 2σ(·)`` and the mixing matrix ``H_res`` projected by Sinkhorn-Knopp onto
    (close to) the doubly stochastic matrices, each from ``RMSNorm(vec H) φ``
    (:class:`~resnmt.connections.hyper.ManifoldHyperConnection`; the initial b's are ours,
    within ε = 0.01 of HC's init, so pre-LN at init up to rounding). fairseq's init of the
    projections is kept (the mHC paper states no scaling)."""

    kind = "mhc"
    equation = "H ← H_res·H + H_postᵀ·F(LN(H_pre·H)), H_res = SK(·)"
    note = "n streams (--hc-streams); H_pre, H_post sigmoids; Sinkhorn-Knopp"
    source = "mHC, DeepSeek 2025, arXiv:2512.24880"
    flags = (
        HC_STREAMS,
        Flag("mhc_sinkhorn_iterations", DEFAULT_SINKHORN_ITERATIONS, check=positive_int, metavar="T",
             help=f"mhc: Sinkhorn-Knopp iterations projecting H_res (default: {DEFAULT_SINKHORN_ITERATIONS}, "
             "the paper's)"),
    )
    arch_family = "mhc"

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

    def build_streams(self, dim: int, spec: ConnectionSpec) -> nn.Module:
        return ManifoldHyperConnection(dim, spec.hc_streams, spec.sublayer_index, spec.mhc_sinkhorn_iterations)
