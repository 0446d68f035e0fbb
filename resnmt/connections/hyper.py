"""Hyper-Connections (Zhu et al., ICLR 2025, arXiv:2409.19606): n residual streams,
static or dynamic; everything of the method is here, and mHC (:mod:`resnmt.connections.mhc`)
builds on it.

The residual stream widens into ``n`` streams: every position carries ``H`` of shape
``(T, B, n, C)`` (fairseq is time-major) instead of ``x`` of shape ``(T, B, C)``. Each
sublayer ``F`` (attention, cross-attention, FFN: one connection each) reads a weighted
sum of the streams and writes its output back into every stream with its own weight::

    width:  h_in = a_inᵀ H      (C,)     the sublayer's input (normed as pre-LN's)
            H'   = M H          (n, C)   the streams mixed
    depth:  Ĥ    = H' + b ⊗ F(h_in)      b (n,) the write-back weights

In a layer this is the sublayer protocol every kind offers
(:class:`~resnmt.connections.base.SublayerConnection`): the connection's ``read(H)`` is
the width step (returning ``LN(h_in)`` and, to carry to ``write``, ``H'`` and ``b``),
its ``write`` the depth step, with the layer's dropout on the branch (as the paper's
Algorithm 3; the package ``hyper-connections`` drops the streams instead). The stack's
:class:`HyperStream` tiles the embedded input n times before the first layer
(:func:`expand_streams`, ``H⁰``) and sums the streams before the final norm
(:func:`reduce_streams`). Every operation is per position, so one step of incremental
decoding computes what the full forward computes there.

=================  ================================  ===============================
mixer              a_in, M, b                        source
=================  ================================  ===============================
StaticHyperMixer   A_m, A_rᵀ, B (learned scalars)    Zhu et al., "Hyper-Connections",
DynamicHyperMixer  + s·tanh(norm(H) W) per position  ICLR 2025, arXiv 2409.19606
=================  ================================  ===============================

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
The paper's √n scaling of the output projections' init is :class:`HyperConnection`'s
``initialize_sublayer`` (:func:`output_projection_init_factor`); its weight-decay split
(none on the static parts) is not here (it belongs to the optimizer).
"""
import math
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.base import FFN_OUT, OUTPUT, SublayerConnection
from resnmt.connections.spec import ConnectionSpec, register_connection
from resnmt.connections.streams import ResidualStream, State
from resnmt.options import Option

DEFAULT_STREAMS = 4  # the expansion rate n of both papers (HC's and mHC's)
HC_SCALE_INIT = 0.01  # s_α, s_β (HC, §2.2)


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
    public).
    """
    return 1.0 / math.sqrt(num_streams)


class StreamMixer(nn.Module):
    """One sublayer's mixer of the n streams: :meth:`width` before the sublayer,
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


class StaticHyperMixer(StreamMixer):
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


class DynamicHyperMixer(StaticHyperMixer):
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


class HyperStream(ResidualStream):
    """The stack's side of Hyper-Connections and mHC: the first layer reads the embedded
    input tiled n times, ``H^0`` (T, B, n, C); each layer reads and returns the streams (its
    connections mix and update them); the stack's output is the streams' sum (T, B, C),
    before the final norm (the HC paper's order)."""

    def __init__(self, num_streams: int):
        super().__init__()
        self.num_streams = int(num_streams)

    def layer_input(self, state: State, index: int, x: Tensor) -> Tensor:
        return expand_streams(x, self.num_streams) if index == 0 else x

    def end(self, state: State, x: Tensor) -> Tensor:
        return reduce_streams(x)

    def extra_repr(self) -> str:
        return f"streams={self.num_streams}"


HC_STREAMS = Option(
    "hc_streams", DEFAULT_STREAMS, kind="int", above=0, metavar="N",
    help=f"hyper/mhc: the number n of residual streams (the expansion rate) (default: {DEFAULT_STREAMS}, the papers')",
)


class MultiStreamConnection(SublayerConnection):
    """What Hyper-Connections and mHC share: a norm for the sublayer's input (as pre-LN's),
    one :class:`StreamMixer` built for the sublayer's index k in its stack
    (``spec.sublayer_index``; held as ``streams``, its name in checkpoints), the stack's
    :class:`HyperStream` and its final norm."""

    final_norm = True
    multi_stream = True
    crosses_layers = True
    flags: Tuple[Option, ...] = (HC_STREAMS,)

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = spec.norm(dim)
        self.streams = self.build_mixer(dim, spec)

    def build_mixer(self, dim: int, spec: ConnectionSpec) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return HyperStream(spec.hc_streams)

    def prenorm(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def read(self, x: Tensor) -> Tuple[Tensor, List[Tensor]]:
        """The width step: the streams ``x`` (T, B, n, C) -> (the sublayer's input, normed
        (T, B, C), [the mixed streams (T, B, n, C), the write-back weights])."""
        branch_input, mixed, write = self.streams.width(x)
        return self.prenorm(branch_input), [mixed, write]

    def write(self, x: Tensor, fx: Tensor, layer_input: Tensor, carry: List[Tensor]) -> Tensor:
        """The depth step: the mixed streams plus each stream's weight times ``fx``."""
        return self.streams.depth(fx, carry[0], carry[1])

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        """Both steps at once, for a connection used on its own: the streams after the
        sublayer, from the streams ``x`` (T, B, n, C) before it and the sublayer's output
        ``fx`` (T, B, C)."""
        _, mixed, write = self.streams.width(x)
        return self.streams.depth(fx, mixed, write)


@register_connection
class HyperConnection(MultiStreamConnection):
    """Hyper-Connections (Zhu et al., ICLR 2025, arXiv:2409.19606): n streams, each
    sublayer reads ``A_mᵀH`` and writes ``A_rᵀH + Bᵀ F``; static (learned scalars) or, with
    ``--hc-dynamic``, plus a per-position part from ``tanh(norm(H) W)`` (the norm of
    ``--normalization``). The paper's init: pre-LN at init (every stream the pre-LN
    residual). Each sublayer's output projection (attention's ``out_proj``, the FFN's
    ``fc2``) starts with its weights times ``n^-1/2`` (the paper's "√n" read as a division,
    :func:`output_projection_init_factor`) unless ``--hc-no-init-scaling``."""

    kind = "hyper"
    equation = "H ← A_rᵀH + Bᵀ·F(LN(A_mᵀH))"
    note = "n streams (--hc-streams); H⁰ = n copies of x₀, output ΣH then the final LN"
    source = "Hyper-Connections, Zhu et al., ICLR 2025, arXiv:2409.19606"
    flags = (
        HC_STREAMS,
        Option("hc_dynamic", False, kind="switch", owners_only=True,
               help="hyper: dynamic Hyper-Connections (DHC), A_m, A_r, B plus s*tanh(norm(H) W) per position "
               "(default: static, SHC)"),
        Option("hc_no_init_scaling", False, kind="switch", owners_only=True,
               help="hyper: keep fairseq's init of the output projections (out_proj, fc2) instead of the "
               "paper's scaling by sqrt(n) (read as a division) (default: scaled)"),
    )
    arch_family = "hyper"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.init_factor = None if spec.hc_no_init_scaling else output_projection_init_factor(spec.hc_streams)

    def build_mixer(self, dim: int, spec: ConnectionSpec) -> nn.Module:
        if spec.hc_dynamic:
            return DynamicHyperMixer(dim, spec.norm(dim), spec.hc_streams, spec.sublayer_index)
        return StaticHyperMixer(dim, spec.hc_streams, spec.sublayer_index)

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
