"""Sublayer connections: how a sublayer's output F is combined with its input x.

Every Transformer sublayer (self-attention, encoder-decoder attention, FFN) is run as::

    fx = dropout(sublayer(connection.prenorm(x)))
    y  = connection(x, fx)

A connection owns its normalizations, gates and constants, so the encoder and decoder
layers hold one connection per sublayer and never branch on the kind. Shapes: ``x`` and
``fx`` are ``(seq_len, batch, embed_dim)``; every gate is computed per position, so a
step of incremental decoding sees exactly what the full forward sees.

Equations (see ``docs`` and ``../shared/docs/methods.md``):

=========  ====================================================  ==========================
kind       output y                                              source
=========  ====================================================  ==========================
post_ln    LN(x + F)                                             Vaswani et al. 2017
pre_ln     x + F(LN(x)), final LN after the stack                He et al. 2016
xskip      lambda*x + F                                          rSkip paper eq. 2
xskip_ln   LN(lambda*x + F)                                      rSkip paper eq. 3
rskip_ln   y1 = LN1(x + F), yk = LNk(x + y_{k-1}), k=2..lambda   rSkip paper eq. 4
sas        alpha*x + beta*F + gamma*LN(x + F)                    SAS paper eq. 3/4
highway    t*F + (1-t)*x, t = sigmoid(x W_T + b_T)               Srivastava et al. 2015
=========  ====================================================  ==========================
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from resnmt.modules.fused import fused_sas_output, require_compile
from resnmt.modules.gates import ScalarGates

CONNECTION_KINDS = ("post_ln", "pre_ln", "xskip", "xskip_ln", "rskip_ln", "sas", "highway")
SAS_GATE_FORMS = ("two_layer", "single_layer")
SAS_GAMMA_FORMS = ("product", "gate")


@dataclass(frozen=True)
class ConnectionSpec:
    """Everything needed to build one side's connections; resolved from the model args."""

    kind: str = "post_ln"
    skip_lambda: float = 2.0
    sas_gate: str = "two_layer"
    sas_gamma: str = "product"
    sas_gate_dim: Optional[int] = None  # None: the model dimension h, as in the paper
    sas_alpha_bias_init: float = 0.0
    sas_beta_bias_init: float = 0.0
    sas_gamma_bias_init: float = 0.0
    highway_bias_init: float = -2.0
    export: bool = False  # fairseq's --export (use torch's LayerNorm)
    fused: bool = False  # --fused-connections: SAS's combination compiled (resnmt.modules.fused)

    def __post_init__(self):
        check_connection_spec(self)

    @property
    def has_final_norm(self) -> bool:
        """Pre-LN stacks end with a LayerNorm (fairseq's normalize_before)."""
        return self.kind == "pre_ln"


class ConnectionConfigError(ValueError):
    """A connection option with a value outside what is allowed."""


def check_connection_spec(spec: ConnectionSpec) -> None:
    """Raise ConnectionConfigError naming the flag, the value and what is allowed."""
    if spec.kind not in CONNECTION_KINDS:
        raise ConnectionConfigError(
            f"--residual {spec.kind!r} is not a connection kind; choose one of {', '.join(CONNECTION_KINDS)}"
        )
    if spec.kind in ("xskip", "xskip_ln") and not spec.skip_lambda > 0:
        raise ConnectionConfigError(
            f"--skip-lambda {spec.skip_lambda:g} is invalid for --residual {spec.kind}: it must be a real number > 0"
        )
    if spec.kind == "rskip_ln" and (spec.skip_lambda < 1 or spec.skip_lambda != int(spec.skip_lambda)):
        raise ConnectionConfigError(
            f"--skip-lambda {spec.skip_lambda:g} is invalid for --residual rskip_ln: it must be an integer >= 1"
        )
    if spec.sas_gate not in SAS_GATE_FORMS:
        raise ConnectionConfigError(f"--sas-gate {spec.sas_gate!r}: choose one of {', '.join(SAS_GATE_FORMS)}")
    if spec.sas_gamma not in SAS_GAMMA_FORMS:
        raise ConnectionConfigError(f"--sas-gamma {spec.sas_gamma!r}: choose one of {', '.join(SAS_GAMMA_FORMS)}")
    if spec.sas_gate_dim is not None and spec.sas_gate_dim <= 0:
        raise ConnectionConfigError(
            f"--sas-gate-dim {spec.sas_gate_dim} is invalid: it must be an integer > 0 (default: the model dimension)"
        )


class SublayerConnection(nn.Module):
    """Base class. ``prenorm(x)`` is what the sublayer reads; ``forward(x, fx)`` is the output."""

    def prenorm(self, x: Tensor) -> Tensor:
        return x

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class PostLNConnection(SublayerConnection):
    """``LN(x + F)``: the original Transformer (fairseq's default)."""

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = LayerNorm(dim, export=spec.export)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.norm(x + fx)


class PreLNConnection(SublayerConnection):
    """``x + F(LN(x))``: the identity path stays free of normalization."""

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = LayerNorm(dim, export=spec.export)

    def prenorm(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return x + fx


class XSkipConnection(SublayerConnection):
    """``lambda*x + F`` without normalization (the rSkip paper's ablation)."""

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.skip_lambda = float(spec.skip_lambda)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.scaled_sum(x, fx)

    def scaled_sum(self, x: Tensor, fx: Tensor) -> Tensor:
        # one fused pass (fx + lambda * x) instead of a scaled copy of x and then a sum
        return torch.add(fx, x, alpha=self.skip_lambda)

    def extra_repr(self) -> str:
        return f"lambda={self.skip_lambda:g}"


class XSkipLNConnection(XSkipConnection):
    """``LN(lambda*x + F)``: a scaled skip before the post-LN (rSkip paper eq. 3)."""

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.norm = LayerNorm(dim, export=spec.export)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.norm(self.scaled_sum(x, fx))


class RSkipLNConnection(SublayerConnection):
    """Recursive skip: ``y1 = LN1(x + F)``, ``yk = LNk(x + y_{k-1})``, output ``y_lambda``.

    Each step adds the input again behind its own LayerNorm (rSkip paper eq. 4); with
    lambda = 1 this is post-LN.
    """

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norms = nn.ModuleList(LayerNorm(dim, export=spec.export) for _ in range(int(spec.skip_lambda)))

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        y = fx
        for norm in self.norms:
            y = norm(x + y)
        return y


class SASConnection(SublayerConnection):
    """Self-adaptive scaling: ``alpha*x + beta*F + gamma*LN(x + F)`` (SAS paper eq. 3/4).

    alpha and beta are per-position scalars from two gates on ``[x; F]``; gamma is
    ``(1-alpha)(1-beta)`` (eq. 4, the paper's default) or a third gate (eq. 3).
    """

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.gamma_from_gate = spec.sas_gamma == "gate"
        bias_init = [spec.sas_alpha_bias_init, spec.sas_beta_bias_init]
        if self.gamma_from_gate:
            bias_init.append(spec.sas_gamma_bias_init)
        self.gates = ScalarGates(
            input_dim=2 * dim,
            hidden_dim=None if spec.sas_gate == "single_layer" else (spec.sas_gate_dim or dim),
            bias_init=bias_init,
        )
        self.norm = LayerNorm(dim, export=spec.export)
        self.fused = spec.fused
        if spec.fused:
            require_compile()
            self.forward = self.fused_forward

    def gate_values(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """alpha, beta, gamma, each ``(seq_len, batch, 1)``."""
        gates = self.gates(x, fx)  # S([x; F]) without building [x; F]
        alpha, beta = gates[..., 0:1], gates[..., 1:2]
        gamma = gates[..., 2:3] if self.gamma_from_gate else (1 - alpha) * (1 - beta)
        return {"alpha": alpha, "beta": beta, "gamma": gamma}

    def combine(self, x: Tensor, fx: Tensor, alpha: Tensor, beta: Tensor, gamma: Tensor) -> Tensor:
        return alpha * x + beta * fx + gamma * self.norm(x + fx)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.combine(x, fx, **self.gate_values(x, fx))

    def fused_forward(self, x: Tensor, fx: Tensor) -> Tensor:
        """``forward`` with the sigmoids, gamma, LN and the weighted sum compiled as one
        function (``--fused-connections``); the gates' matmuls stay as they are."""
        norm = self.norm
        return fused_sas_output(x, fx, self.gates.logits(x, fx), norm.weight, norm.bias, norm.eps, self.gamma_from_gate)


class HighwayConnection(SublayerConnection):
    """``t*F + (1-t)*x`` with a per-dimension transform gate ``t = sigmoid(x W_T + b_T)``.

    ``b_T`` starts negative (``--highway-bias-init``) so that training begins close to
    the identity, as Srivastava et al. recommend.
    """

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.transform_gate = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.transform_gate.weight)
        nn.init.constant_(self.transform_gate.bias, spec.highway_bias_init)

    def gate_values(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.transform_gate(x))

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        t = self.gate_values(x)
        return x + t * (fx - x)


CONNECTION_CLASSES: Dict[str, Callable[[int, ConnectionSpec], SublayerConnection]] = {
    "post_ln": PostLNConnection,
    "pre_ln": PreLNConnection,
    "xskip": XSkipConnection,
    "xskip_ln": XSkipLNConnection,
    "rskip_ln": RSkipLNConnection,
    "sas": SASConnection,
    "highway": HighwayConnection,
}
assert tuple(CONNECTION_CLASSES) == CONNECTION_KINDS


def build_connection(dim: int, spec: ConnectionSpec) -> SublayerConnection:
    """The one place that chooses among connection kinds."""
    return CONNECTION_CLASSES[spec.kind](dim, spec)
