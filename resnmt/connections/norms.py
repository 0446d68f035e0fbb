"""The normalization a connection (and a stack's final norm) uses: ``--normalization``.

=============  ==========================================  ================================
name           y                                           source
=============  ==========================================  ================================
layer_norm     g * (x - mean(x)) / sqrt(Var[x] + eps) + b  Ba et al. 2016 (fairseq's)
rms_norm       g * x / sqrt(mean(x^2) + eps)               Zhang and Sennrich, NeurIPS 2019
dyt            g * tanh(a * x) + b, a a learned scalar     Zhu et al., CVPR 2025
=============  ==========================================  ================================

``layer_norm`` is fairseq's ``LayerNorm`` (so checkpoints and results of every kind are
what they were before this choice existed); ``rms_norm`` is torch's ``nn.RMSNorm`` with
fairseq's LayerNorm eps (1e-5); ``dyt`` is Dynamic Tanh with ``a`` starting at
``--dyt-alpha-init`` (0.5, the DyT paper's default for non-LLM models), ``g`` ones and
``b`` zeros. Every norm module is built by :func:`build_norm`, the one place that chooses.
"""
from typing import Tuple

import torch
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from resnmt.options import Option

NORMALIZATIONS: Tuple[str, ...] = ("layer_norm", "rms_norm", "dyt")
DEFAULT_NORMALIZATION = "layer_norm"
DEFAULT_DYT_ALPHA = 0.5
EPS = 1e-5  # fairseq's LayerNorm eps, used by RMSNorm too

# the normalization's model flags (resnmt.models.flags puts them on fairseq's parser)
NORMALIZATION = Option(
    "normalization", DEFAULT_NORMALIZATION, kind="choice", choices=NORMALIZATIONS, metavar="NORM",
    help="every normalization the connections and the stacks own: layer_norm (fairseq's LayerNorm), "
    "rms_norm (x/sqrt(mean(x^2)+eps)*g, Zhang and Sennrich 2019) or dyt (g*tanh(a*x)+b, a a learned "
    "scalar, Zhu et al. 2025); kinds without a normalization (xskip, highway, rezero) refuse a change "
    f"(default: {DEFAULT_NORMALIZATION})",
)
DYT_ALPHA_INIT = Option(
    "dyt_alpha_init", DEFAULT_DYT_ALPHA, kind="number", above=0, metavar="A",
    help=f"initial alpha of every DyT with --normalization dyt (default: {DEFAULT_DYT_ALPHA:g}, the DyT paper's)",
)


class DynamicTanh(nn.Module):
    """DyT: ``weight * tanh(alpha * x) + bias`` with one learned scalar ``alpha``
    ("Transformers without Normalization", Zhu et al., CVPR 2025)."""

    def __init__(self, dim: int, alpha_init: float = DEFAULT_DYT_ALPHA):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addcmul(self.bias.to(x.dtype), self.weight.to(x.dtype), torch.tanh(self.alpha.to(x.dtype) * x))

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, alpha={float(self.alpha.detach()[0]):.4g}"


def build_norm(dim: int, normalization: str = DEFAULT_NORMALIZATION, *, export: bool = False,
               dyt_alpha_init: float = DEFAULT_DYT_ALPHA) -> nn.Module:
    """A normalization over the last dimension of size ``dim``."""
    if normalization == "layer_norm":
        return LayerNorm(dim, export=export)
    if normalization == "rms_norm":
        return nn.RMSNorm(dim, eps=EPS)
    if normalization == "dyt":
        return DynamicTanh(dim, dyt_alpha_init)
    raise ValueError(f"--normalization {normalization!r}: choose one of {', '.join(NORMALIZATIONS)}")


def is_layer_norm(norm: nn.Module) -> bool:
    """Whether ``norm`` is a LayerNorm (what rSkip's ratio and SAS's fused path assume)."""
    return isinstance(norm, nn.LayerNorm) or type(norm).__name__ == "FusedLayerNorm"
