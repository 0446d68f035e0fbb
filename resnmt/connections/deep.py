"""Kinds proposed to train deep stacks: DeepNorm, ReZero, Admin and Peri-LN.

DeepNorm and Admin are of the scaled-skip form ``LN(s (.) x + F)``
(:class:`~resnmt.connections.base.ScaledSkipConnection`): DeepNorm's ``s`` is a
constant alpha from the depths, Admin's a learned vector starting at omega0. Where the
constants come from: docs/connections.md.
"""
import math
from typing import Dict, Mapping, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.base import (
    KEY,
    QUERY,
    SKIP_RATIO,
    ScaledSkipConnection,
    SublayerConnection,
    per_position,
)
from resnmt.connections.spec import ConnectionSpec, Statistic, register_connection
from resnmt.options import Option


def deepnorm_constants(side: str, encoder_layers: int, decoder_layers: int) -> Tuple[float, float]:
    """(alpha, beta) of DeepNet (Wang et al. 2022, arXiv:2203.00555, Table 1) for an
    encoder-decoder with N encoder and M decoder layers:
    encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16);
    decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4)."""
    n, m = encoder_layers, decoder_layers
    if side == "encoder":
        return 0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)
    return (3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)


@register_connection
class DeepNormConnection(ScaledSkipConnection):
    """DeepNorm: ``LN(alpha*x + F)`` with the sublayer's value/output projections and FFN
    initialised Xavier-normal with gain beta, query/key with gain 1 (DeepNet, Wang et al.
    2022, Figure 2). alpha and beta follow the stack depths (:func:`deepnorm_constants`)."""

    kind = "deepnorm"
    equation = "LN(α·x + F)"
    note = "α and the init's β from the depths"
    source = "DeepNet, Wang et al. 2022, arXiv:2203.00555"
    arch_family = "deepnorm"
    UNSCALED_ROLES = (QUERY, KEY)

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.alpha, self.beta = deepnorm_constants(spec.side, spec.encoder_layers, spec.decoder_layers)

    @classmethod
    def initial_scale(cls, spec: ConnectionSpec) -> float:
        return deepnorm_constants(spec.side, spec.encoder_layers, spec.decoder_layers)[0]

    def initialize_sublayer(self, projections: Mapping[str, nn.Module]) -> None:
        for role, linear in projections.items():
            nn.init.xavier_normal_(linear.weight, gain=1.0 if role in self.UNSCALED_ROLES else self.beta)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"


@register_connection
class ReZeroConnection(SublayerConnection):
    """ReZero: ``x + a*F`` with one learned scalar ``a`` per sublayer, 0 at the start, and
    no LayerNorm (Bachlechner et al. 2020, arXiv:2003.04887): every layer starts as the
    identity."""

    kind = "rezero"
    equation = "x + a·F"
    note = "a learned from 0, no LayerNorm"
    source = "ReZero, Bachlechner et al. 2020, arXiv:2003.04887"
    statistics = (Statistic("rezero_a", "rezero_a", "ReZero a: weight of the residual F", "a (weight of F)"),)
    arch_family = "rezero"
    normalized = False

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.residual_weight = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return torch.addcmul(x, fx, self.residual_weight.to(fx.dtype))

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        return {"rezero_a": per_position(self.residual_weight[0], x)}


ADMIN_OUTPUT_CHANGE_SCALES = ("O(logn)", "O(n)", "O(1)")


def admin_omega(num_sublayers: int, output_change_scale: str = "O(logn)") -> float:
    """Admin's initial omega without profiling, as admin-torch 0.1.0 computes it for a
    stack of n residual sublayers: sqrt((n+1)/ln(n+1) - 1) for O(logn) (its default),
    1 for O(n) (the plain residual), sqrt(n) for O(1)."""
    n = num_sublayers
    if output_change_scale == "O(logn)":
        return math.sqrt((n + 1) / math.log(n + 1) - 1)
    if output_change_scale == "O(n)":
        return 1.0
    return math.sqrt(n)


@register_connection
class AdminConnection(ScaledSkipConnection):
    """Admin: ``LN(omega (.) x + F)`` with omega a learned per-dimension vector (Liu et al.
    2020, EMNLP, arXiv:2004.08249), initialised without the profiling pass as admin-torch
    does (:func:`admin_omega`, n = the side's residual sublayers: 2N encoder, 3M decoder)."""

    kind = "admin"
    equation = "LN(ω ⊙ x + F)"
    note = "ω learned, initialised from the depth"
    source = "Admin, Liu et al. 2020, arXiv:2004.08249"
    flags = (
        Option("admin_output_change_scale", "O(logn)", kind="choice", choices=ADMIN_OUTPUT_CHANGE_SCALES,
               metavar="SCALE",
               help="Admin's target output change at init, which sets omega0 for n residual sublayers "
               "(2N encoder, 3M decoder): O(logn) = sqrt((n+1)/ln(n+1)-1) (admin-torch's default), "
               "O(n) = 1 (post-LN), O(1) = sqrt(n) (default: O(logn))"),
    )
    statistics = (
        SKIP_RATIO,
        Statistic("admin_omega", "admin_omega", "Admin omega: skip scale, mean over features", "mean omega"),
    )
    arch_family = "admin"

    @classmethod
    def initial_scale(cls, spec: ConnectionSpec) -> float:
        return admin_omega(spec.num_sublayers, spec.admin_output_change_scale)

    @classmethod
    def learned_scale(cls, spec: ConnectionSpec) -> bool:
        return True


@register_connection
class PeriLNConnection(SublayerConnection):
    """Peri-LN: ``x + LN_out(F(LN_in(x)))`` and a final LN after the stack: the sublayer's
    input and output are normalized, the identity path is not (Kim et al. 2025,
    arXiv:2502.02732)."""

    kind = "peri_ln"
    equation = "x + LN_out(F(LN_in(x)))"
    note = "a final LN after each stack"
    source = "Peri-LN, Kim et al. 2025, arXiv:2502.02732"
    final_norm = True
    arch_family = "periln"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.input_norm = spec.norm(dim)
        self.output_norm = spec.norm(dim)

    def prenorm(self, x: Tensor) -> Tensor:
        return self.input_norm(x)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return x + self.output_norm(fx)
