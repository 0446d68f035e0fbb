"""The two classic placements of the LayerNorm: after the sum (post-LN) and before the sublayer (pre-LN)."""
from torch import Tensor

from resnmt.connections.base import SublayerConnection
from resnmt.connections.spec import ConnectionSpec, register_connection


@register_connection
class PostLNConnection(SublayerConnection):
    """``LN(x + F)``: the original Transformer (fairseq's default)."""

    kind = "post_ln"
    equation = "LN(x + F)"
    source = "Vaswani et al. 2017 (fairseq's default)"
    arch_family = "postln"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = spec.norm(dim)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.norm(x + fx)


@register_connection
class PreLNConnection(SublayerConnection):
    """``x + F(LN(x))``: the identity path stays free of normalization."""

    kind = "pre_ln"
    equation = "x + F(LN(x))"
    note = "a final LN after each stack"
    source = "He et al. 2016"
    final_norm = True
    arch_family = "preln"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = spec.norm(dim)

    def prenorm(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return x + fx
