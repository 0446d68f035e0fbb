"""LayerScale: ``y = x + diag(λ)·F(LN(x))``, λ a learned vector, one per channel.

Touvron, Cord, Sablayrolles, Synnaeve, Jégou, "Going deeper with Image Transformers"
(ICCV 2021), Section 2, eq. (3)-(4): a pre-LN block whose residual branch is multiplied,
channel by channel, by a learned diagonal matrix initialised to a small ε, so that every
block starts close to the identity. The paper's ε depends on the depth: 0.1 up to 18
blocks, 1e-5 up to 24, 1e-6 beyond; ``--layer-scale-init`` sets it. As in pre-LN, each
stack ends with a LayerNorm.
"""
import torch
from torch import nn

from resnmt.connections import ConnectionSpec, Statistic, SublayerConnection, register_connection
from resnmt.options import Option

LAYER_SCALE_INIT = Option(
    "layer_scale_init", None, kind="number", above=0, metavar="EPS", owners_only=True,
    help="layerscale: the initial value of every λ (default: the paper's by depth, 0.1 up to 18 layers, "
    "1e-5 up to 24, 1e-6 beyond)",
)
MEAN_SCALE = Statistic("layer_scale", "ls_lambda", "layer scale: mean |λ| of the sublayer", "mean |lambda|")


def paper_epsilon(depth: int) -> float:
    """The paper's initial ε for a stack of ``depth`` blocks (Section 2)."""
    return 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6


@register_connection
class LayerScaleConnection(SublayerConnection):
    kind = "layerscale"
    equation = "x + diag(λ)·F(LN(x)), λ a learned per-channel vector"
    note = "λ starts at ε (--layer-scale-init; the paper's by depth); a final LN after each stack"
    source = "Touvron et al. 2021, Going deeper with Image Transformers (ICCV)"
    flags = (LAYER_SCALE_INIT,)
    final_norm = True
    statistics = (MEAN_SCALE,)

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        epsilon = spec.layer_scale_init if spec.layer_scale_init is not None else paper_epsilon(spec.layers)
        self.norm = spec.norm(dim)
        self.scale = nn.Parameter(torch.full((dim,), float(epsilon)))

    def prenorm(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def forward(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x, fx, self.scale.to(fx.dtype))

    def measure(self, x: torch.Tensor, fx: torch.Tensor):
        return {MEAN_SCALE.name: self.scale.detach().abs().mean().float().expand(x.shape[:-1])}
