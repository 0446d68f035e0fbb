"""Kinds that weigh the skip and the sublayer with learned, per-position gates: SAS (its
gates: :class:`ScalarGates`) and highway."""
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from resnmt.connections.base import SublayerConnection
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, Statistic, register_connection
from resnmt.training.compile import compiled, require_compile
from resnmt.options import Option

SAS_GATE_FORMS = ("two_layer", "single_layer")
SAS_GAMMA_FORMS = ("product", "gate")



def sas_output(
    x: Tensor, fx: Tensor, logits: Tensor, norm_weight: Tensor, norm_bias: Tensor, eps: float, gamma_from_gate: bool
) -> Tensor:
    """``alpha*x + beta*F + gamma*LN(x + F)`` from the gates' logits ``(..., 2 or 3)``:
    alpha, beta (and gamma with ``gamma_from_gate``) are their sigmoids, otherwise
    ``gamma = (1-alpha)(1-beta)`` (SAS paper eq. 3/4). The LayerNorm is fairseq's
    (``torch.nn.LayerNorm`` with ``norm_weight``, ``norm_bias``, ``eps``). Compiled as
    ``fused_sas_output`` for ``--fused-connections`` (:mod:`resnmt.training.compile`)."""
    gates = torch.sigmoid(logits)
    alpha, beta = gates[..., 0:1], gates[..., 1:2]
    gamma = gates[..., 2:3] if gamma_from_gate else (1 - alpha) * (1 - beta)
    s = x + fx
    normed = F.layer_norm(s, (s.size(-1),), norm_weight, norm_bias, eps)
    return alpha * x + beta * fx + gamma * normed


fused_sas_output = compiled(sas_output)


class ScalarGates(nn.Module):
    """``n`` independent scalar gates ``sigmoid(S_i(z))`` on the same input ``z``.

    Two-layer form (SAS paper, the default)::

        S_i(z) = tanh(z W_f,i + b_f,i) W_ff,i + b_ff,i      W_f,i: in x hidden, W_ff,i: hidden x 1

    Single-layer form (``hidden_dim=None``)::

        S_i(z) = z W_i + b_i                                 W_i: in x 1

    The gates keep separate parameters; their first layers are stored stacked in one
    matrix so that all of them cost one matmul. Per gate, the two-layer form holds
    ``in*hidden + hidden + hidden + 1`` parameters (525,313 for in = 2*512, hidden = 512,
    the paper's size).

    Args:
        input_dim: size of ``z``'s last dimension.
        hidden_dim: hidden size of the two-layer form, or None for the single-layer form.
        bias_init: the initial output bias ``b_ff,i`` of each gate; its length is ``n``.

    Input: the two halves of ``z = [x; fx]`` (``gates(x, fx)``), each ``(..., input_dim / 2)``:
    they are multiplied by the matching column blocks of the weights and summed, which is
    ``z W`` without materializing ``z`` (autograd would otherwise keep the concatenated
    copy alive for the backward pass). Output ``(..., n)`` in ``(0, 1)``.
    """

    def __init__(self, input_dim: int, hidden_dim: Optional[int], bias_init: Sequence[float]):
        super().__init__()
        self.num_gates = len(bias_init)
        self.hidden_dim = hidden_dim
        if hidden_dim is None:
            self.hidden = None
            self.out_weight = nn.Parameter(torch.empty(self.num_gates, input_dim))
        else:
            self.hidden = nn.Linear(input_dim, self.num_gates * hidden_dim)
            self.out_weight = nn.Parameter(torch.empty(self.num_gates, hidden_dim))
        self.out_bias = nn.Parameter(torch.tensor([float(b) for b in bias_init]))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.hidden is not None:
            for i in range(self.num_gates):  # each gate's block initialised as its own layer
                rows = slice(i * self.hidden_dim, (i + 1) * self.hidden_dim)
                nn.init.xavier_uniform_(self.hidden.weight.data[rows])
            nn.init.zeros_(self.hidden.bias)
        for i in range(self.num_gates):  # W_ff,i is hidden x 1 (or in x 1)
            nn.init.xavier_uniform_(self.out_weight.data[i : i + 1])

    def logits(self, x: Tensor, fx: Tensor) -> Tensor:
        """``S_i(z)`` before the sigmoid, ``(..., n)``, for ``z = [x; fx]`` given in its two pieces."""
        if self.hidden is None:
            return self._linear_on_pieces(x, fx, self.out_weight, self.out_bias)
        h = torch.tanh(self._linear_on_pieces(x, fx, self.hidden.weight, self.hidden.bias))
        h = h.unflatten(-1, (self.num_gates, h.size(-1) // self.num_gates))
        return torch.einsum("...gh,gh->...g", h, self.out_weight) + self.out_bias

    @staticmethod
    def _linear_on_pieces(x: Tensor, fx: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """``[x; fx] W^T + b`` computed piece by piece."""
        width = x.size(-1)
        return F.linear(x, weight[:, :width]) + F.linear(fx, weight[:, width:]) + bias

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(x, fx))

    def extra_repr(self) -> str:
        form = "single_layer" if self.hidden is None else f"two_layer(hidden={self.hidden_dim})"
        return f"num_gates={self.num_gates}, {form}"


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
        Option("sas_gate", "two_layer", kind="choice", choices=SAS_GATE_FORMS,
               help="SAS gate S(x,F): two_layer = tanh([x;F] W_f + b_f) W_ff + b_ff (paper); "
               "single_layer = [x;F] W + b (paper's ablation) (default: two_layer)"),
        Option("sas_gamma", "product", kind="choice", choices=SAS_GAMMA_FORMS,
               help="SAS weight of LN(x+F): product = (1-alpha)(1-beta) (paper eq. 4, default) or "
               "gate = a third gate sigmoid(S_gamma) (paper eq. 3)"),
        Option("sas_gate_dim", None, kind="int", above=0, metavar="N",
               help="hidden size of the two-layer SAS gates (default: the model dimension h, as in the paper; "
               "e.g. 64 cuts the gates' cost ~8x at d=512)"),
        Option("sas_alpha_bias_init", 0.0, kind="number", metavar="B",
               help="initial output bias b_ff of the alpha (skip) gate (default: 0; the paper's image models used +3)"),
        Option("sas_beta_bias_init", 0.0, kind="number", metavar="B",
               help="initial output bias b_ff of the beta (residual) gate (default: 0; the paper's image models used -3)"),
        Option("sas_gamma_bias_init", 0.0, kind="number", metavar="B",
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
        Option("highway_bias_init", -2.0, kind="number", metavar="B",
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
