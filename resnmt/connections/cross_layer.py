"""Kinds that cross a sublayer: B2T reads its layer's input; ResiDual, DLCL and DenseFormer
carry a residual stream from layer to layer (:mod:`resnmt.connections.streams`).

A method that needs more than one sublayer's ``x`` and ``F`` is one stream class (what the
stack carries) and one kind here whose :meth:`build_stream` returns it.
"""
from typing import ClassVar, List, Mapping, Optional

import torch
from torch import Tensor, nn

from resnmt.connections.classic import PostLNConnection, PreLNConnection
from resnmt.connections.spec import ConnectionSpec, register_connection
from resnmt.connections.streams import DenseFormerStream, DLCLStream, ResiDualStream, ResidualStream
from resnmt.options import Option


@register_connection
class B2TConnection(PostLNConnection):
    """B2T, bottom-to-top: post-LN whose layer's last LN also receives the layer's input
    ``x_0``: ``h = LN(x_0 + F_1(x_0))`` ... and ``y = LN(h + F_last(h) + x_0)`` (encoder: after
    self-attention and FFN; decoder: after self-, cross-attention and FFN) (Takase et al.,
    Findings of ACL 2023, arXiv:2206.00330). With ``--b2t-rescale-init`` every projection
    of the layer starts scaled by ``L^-0.5`` (L the side's layers), the paper's option for
    deep stacks."""

    kind = "b2t"
    equation = "LN(h + F(h) + x₀)"
    note = "post-LN; a layer's last LN also takes the layer's input x₀"
    source = "B2T, Takase et al. 2023, arXiv:2206.00330"
    flags = (
        Option("b2t_rescale_init", False, kind="switch", owners_only=True,
               help="b2t: scale every attention and FFN projection's initial weights by L^-0.5, L the side's "
               "layers (the B2T paper's rescaling for deep stacks) (default: fairseq's init)"),
    )
    arch_family = "b2t"
    adds_layer_input: torch.jit.Final[bool]

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.rescale = spec.layers ** -0.5 if spec.b2t_rescale_init else None
        self.adds_layer_input = spec.last_of_layer

    def forward(self, x: Tensor, fx: Tensor, layer_input: Optional[Tensor] = None) -> Tensor:
        if layer_input is None:
            return self.norm(x + fx)
        return self.norm(x + fx + layer_input)

    def write(self, x: Tensor, fx: Tensor, layer_input: Tensor, carry: List[Tensor]) -> Tensor:
        """The layer's last connection adds the layer's input (the others are post-LN's)."""
        if self.adds_layer_input:
            return self(x, fx, layer_input)
        return self(x, fx)

    def initialize_sublayer(self, projections: Mapping[str, nn.Module]) -> None:
        if self.rescale is None:
            return
        with torch.no_grad():
            for linear in projections.values():
                linear.weight.mul_(self.rescale)


RESI_DUAL_FLAGS = (
    Option("resi_dual_scale", 1.0, kind="number", above=0, metavar="S",
           help="resi_dual: scale s of the dual stream, d_0 = s*x_0, d_{k+1} = d_k + s*F_k (default: 1, the paper's)"),
    Option("resi_dual_alpha", 1.0, kind="number", metavar="A",
           help="resi_dual: the stack's output alpha*x_N + LN(d_N) (default: 1, the paper's)"),
)


@register_connection
class ResiDualConnection(PostLNConnection):
    """ResiDual: post-LN sublayers plus an unnormalized dual stream that adds up the same
    sublayer outputs; the stack's output is ``alpha*x_N + LN(d_N)``
    (:class:`~resnmt.connections.streams.ResiDualStream`; Xie et al. 2023, arXiv:2304.14802)."""

    kind = "resi_dual"
    equation = "x_N + LN(d), d = x₀ + ΣF"
    note = "post-LN sublayers; d adds every sublayer's F"
    source = "ResiDual, Xie et al. 2023, arXiv:2304.14802"
    flags = RESI_DUAL_FLAGS
    arch_family = "resi_dual"
    crosses_layers = True

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return ResiDualStream(spec.norm(dim), spec.resi_dual_scale, spec.resi_dual_alpha)


def stream_norms(dim: int, spec: ConnectionSpec):
    """One norm per layer of ``spec``'s side, for DLCL's stream."""
    return [spec.norm(dim) for _ in range(spec.layers)]


DLCL_WINDOW = Option(
    "dlcl_window", None, kind="int", above=0, metavar="N",
    help="dlcl/dlcl_post: each layer combines only the N most recent of the earlier layers' outputs "
    "(the embedding counts as one) (default: all of them, the DLCL paper's)",
)


class DLCLLayers:
    """What both DLCL kinds add to their layers' own connections (pre-LN's or post-LN's):
    the stack's :class:`~resnmt.connections.streams.DLCLStream`, whose layers read a learned
    linear combination of all earlier layers' outputs, normalized each (``pre_norm``) or
    combined then normalized (Wang et al., ACL 2019, arXiv:1906.01787)."""

    pre_norm: ClassVar[bool]
    source = "DLCL, Wang et al. 2019, arXiv:1906.01787"
    flags = (DLCL_WINDOW,)
    crosses_layers = True

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return DLCLStream(stream_norms(dim, spec), pre_norm=cls.pre_norm, window=spec.dlcl_window)


@register_connection
class DLCLConnection(DLCLLayers, PreLNConnection):
    """DLCL, pre-norm: pre-LN layers whose input is a learned linear combination of all
    earlier layers' normalized outputs, ``x_{l+1} = sum_{k<=l} W_k LN(y_k)``."""

    kind = "dlcl"
    equation = "x_l = Σ_{k<l} W[l,k]·LN(y_k)"
    note = "pre-LN layers; W learned from the average"
    arch_family = "dlcl"
    pre_norm = True


@register_connection
class DLCLPostConnection(DLCLLayers, PostLNConnection):
    """DLCL, post-norm: post-LN layers whose input is the normalized learned combination
    of all earlier layers' outputs, ``x_{l+1} = LN(sum_{k<=l} W_k y_k)``."""

    kind = "dlcl_post"
    equation = "x_l = LN(Σ_{k<l} W[l,k]·y_k)"
    note = "post-LN layers; W learned from the average"
    arch_family = "dlcl_post"
    pre_norm = False


@register_connection
class DenseFormerConnection(PreLNConnection):
    """DenseFormer: pre-LN blocks whose outputs are replaced by a learned depth-weighted
    average of the embedded input and every earlier block output,
    ``Y_i = sum_{j<=i} alpha_ij X_j``, starting at the identity
    (:class:`~resnmt.connections.streams.DenseFormerStream`; Pagliardini et al., NeurIPS 2024,
    arXiv:2402.02622). The paper's period/dilation options are not implemented."""

    kind = "denseformer"
    equation = "Y_i = Σ_{j≤i} α_ij·X_j"
    note = "pre-LN blocks; X₀ the embedding, α from the identity"
    source = "DenseFormer, Pagliardini et al., NeurIPS 2024, arXiv:2402.02622"
    arch_family = "denseformer"
    crosses_layers = True

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return DenseFormerStream(spec.layers)
