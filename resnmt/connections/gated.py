"""Kinds that weigh the skip and the sublayer with learned, per-position gates: SAS and highway."""
from typing import Dict, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.base import SublayerConnection
from resnmt.connections.gates import ScalarGates
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, Statistic, register_connection
from resnmt.flags import Flag, positive_int
from resnmt.fused import fused_sas_output, require_compile

SAS_GATE_FORMS = ("two_layer", "single_layer")
SAS_GAMMA_FORMS = ("product", "gate")


@register_connection
class SASConnection(SublayerConnection):
    """Self-adaptive scaling: ``alpha*x + beta*F + gamma*LN(x + F)`` (SAS paper eq. 3/4).

    alpha and beta are per-position scalars from two gates on ``[x; F]``; gamma is
    ``(1-alpha)(1-beta)`` (eq. 4, the paper's default) or a third gate (eq. 3).
    """

    kind = "sas"
    equation = "α·x + β·F + γ·LN(x + F)"
    note = "α, β learned gates, γ = (1-α)(1-β) (--sas-gamma gate: a third gate)"
    source = "SAS eq.3/4"
    flags = (
        Flag("sas_gate", "two_layer", choices=SAS_GATE_FORMS,
             help="SAS gate S(x,F): two_layer = tanh([x;F] W_f + b_f) W_ff + b_ff (paper); "
             "single_layer = [x;F] W + b (paper's ablation) (default: two_layer)"),
        Flag("sas_gamma", "product", choices=SAS_GAMMA_FORMS,
             help="SAS weight of LN(x+F): product = (1-alpha)(1-beta) (paper eq. 4, default) or "
             "gate = a third gate sigmoid(S_gamma) (paper eq. 3)"),
        Flag("sas_gate_dim", None, check=positive_int, metavar="N",
             help="hidden size of the two-layer SAS gates (default: the model dimension h, as in the paper; "
             "e.g. 64 cuts the gates' cost ~8x at d=512)"),
        Flag("sas_alpha_bias_init", 0.0, check=float, metavar="B",
             help="initial output bias b_ff of the alpha (skip) gate (default: 0; the paper's image models used +3)"),
        Flag("sas_beta_bias_init", 0.0, check=float, metavar="B",
             help="initial output bias b_ff of the beta (residual) gate (default: 0; the paper's image models used -3)"),
        Flag("sas_gamma_bias_init", 0.0, check=float, metavar="B",
             help="initial output bias of the gamma gate with --sas-gamma gate (default: 0)"),
    )
    statistics = (
        Statistic("sas_alpha", "sas_alpha", "SAS alpha: weight of the skip x", "mean alpha (skip weight)", True),
        Statistic("sas_beta", "sas_beta", "SAS beta: weight of the residual F", "mean beta (residual weight)", True),
        Statistic("sas_gamma", "sas_gamma", "SAS gamma: weight of LN(x+F)", "mean gamma (weight of LN(x+F))", True),
    )
    arch_family = "sas"

    gamma_from_gate: torch.jit.Final[bool]
    fused: torch.jit.Final[bool]

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        if spec.fused and spec.normalization != "layer_norm":
            raise ConnectionConfigError(
                f"--fused-connections is invalid with --normalization {spec.normalization} for --residual sas: "
                "the fused combination computes a LayerNorm (use --normalization layer_norm)"
            )

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
        self.norm = spec.norm(dim)
        self.fused = spec.fused
        if spec.fused:
            require_compile()

    def gate_weights(self, x: Tensor, fx: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """alpha, beta, gamma, each ``(seq_len, batch, 1)``."""
        gates = self.gates(x, fx)  # S([x; F]) without building [x; F]
        alpha, beta = gates[..., 0:1], gates[..., 1:2]
        gamma = gates[..., 2:3] if self.gamma_from_gate else (1 - alpha) * (1 - beta)
        return alpha, beta, gamma

    def gate_values(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """``{"alpha", "beta", "gamma"}``, each ``(seq_len, batch, 1)``."""
        return dict(zip(("alpha", "beta", "gamma"), self.gate_weights(x, fx)))

    def combine(self, x: Tensor, fx: Tensor, alpha: Tensor, beta: Tensor, gamma: Tensor) -> Tensor:
        return alpha * x + beta * fx + gamma * self.norm(x + fx)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        if self.fused:
            return self.fused_output(x, fx)
        alpha, beta, gamma = self.gate_weights(x, fx)
        return self.combine(x, fx, alpha, beta, gamma)

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """alpha, beta and gamma per position: whatever the connection multiplies x, F and
        LN(x+F) by (gamma is (1-alpha)(1-beta), or the third gate with --sas-gamma gate)."""
        return {f"sas_{name}": value.squeeze(-1).float() for name, value in self.gate_values(x, fx).items()}

    @torch.jit.unused
    def fused_output(self, x: Tensor, fx: Tensor) -> Tensor:
        """The same values with the sigmoids, gamma, LN and the weighted sum compiled as one
        function (``--fused-connections``); the gates' matmuls stay as they are."""
        norm = self.norm
        return fused_sas_output(x, fx, self.gates.logits(x, fx), norm.weight, norm.bias, norm.eps, self.gamma_from_gate)


@register_connection
class HighwayConnection(SublayerConnection):
    """``t*F + (1-t)*x`` with a per-dimension transform gate ``t = sigmoid(x W_T + b_T)``.

    ``b_T`` starts negative (``--highway-bias-init``) so that training begins close to
    the identity, as Srivastava et al. recommend.
    """

    kind = "highway"
    equation = "t·F + (1-t)·x, t = σ(x W_T + b_T)"
    source = "Srivastava et al. 2015"
    flags = (
        Flag("highway_bias_init", -2.0, check=float, metavar="B",
             help="initial bias b_T of the highway transform gate; negative favours the skip x at the "
             "start (default: -2)"),
    )
    statistics = (
        Statistic("highway_gate", "hw_gate", "highway transform gate t (weight of F)", "mean transform gate t", True),
    )
    arch_family = "highway"
    normalized = False

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

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """The transform gate t (weight of F; 1-t weighs the skip), mean over features."""
        return {"highway_gate": self.gate_values(x).float().mean(dim=-1)}
