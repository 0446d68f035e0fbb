"""The rSkip paper's kinds: a scaled skip ``lambda*x + F`` without and with a LayerNorm, and
the recursive skip ``rskip_ln``."""
from typing import Dict, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.base import SKIP_RATIO, ScaledSkipConnection, SublayerConnection, layer_norm_sigma
from resnmt.connections.norms import is_layer_norm
from resnmt.connections.spec import ConnectionConfigError, ConnectionSpec, Statistic, register_connection
from resnmt.options import Option

SKIP_LAMBDA = Option(
    "skip_lambda", 2.0, kind="number", above=0, metavar="LAMBDA",
    help="skip scale: the real lambda > 0 of xskip/xskip_ln (lambda*x), or the integer lambda >= 1 of "
    "rskip_ln (number of LNs; 1 is post_ln) (default: 2, the rSkip paper's best)",
)
SKIP_LAMBDA_LEARNED = Option(
    "skip_lambda_learned", False, kind="switch", owners_only=True,
    hint=" (a real lambda; rskip_ln's lambda is an integer count of LayerNorms)",
    help="xskip/xskip_ln: learn lambda as a per-dimension vector initialised to --skip-lambda "
    "(the rSkip paper's learned-lambda variant, LN(w*x+F)) (default: a fixed scalar)",
)


@register_connection
class XSkipConnection(ScaledSkipConnection):
    """``lambda*x + F`` without normalization (the rSkip paper's ablation); lambda a
    constant, or a learned per-dimension vector with ``--skip-lambda-learned``."""

    kind = "xskip"
    equation = "λ·x + F"
    note = "no normalization"
    source = "rSkip paper, eq. 2"
    flags = (SKIP_LAMBDA, SKIP_LAMBDA_LEARNED)
    with_norm = False
    normalized = False
    statistics = (
        SKIP_RATIO,
        Statistic("skip_lambda", "skip_lambda", "learned lambda: skip scale, mean over features", "mean lambda"),
    )

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        if not spec.skip_lambda > 0:
            raise ConnectionConfigError(
                f"--skip-lambda {spec.skip_lambda:g} is invalid for --residual {spec.kind}: it must be a real number > 0"
            )

    @classmethod
    def initial_scale(cls, spec: ConnectionSpec) -> float:
        return spec.skip_lambda

    @classmethod
    def learned_scale(cls, spec: ConnectionSpec) -> bool:
        return spec.skip_lambda_learned


@register_connection
class XSkipLNConnection(XSkipConnection):
    """``LN(lambda*x + F)``: a scaled skip before the post-LN (rSkip paper eq. 3)."""

    kind = "xskip_ln"
    equation = "LN(λ·x + F)"
    note = "--skip-lambda-learned: λ a learned vector"
    source = "rSkip paper, eq. 3"
    with_norm = True
    normalized = True
    arch_family = "xskip"
    arch_options = {"skip_lambda": 2.0}


@register_connection
class RSkipLNConnection(SublayerConnection):
    """Recursive skip: ``y1 = LN1(x + F)``, ``yk = LNk(x + y_{k-1})``, output ``y_lambda``.

    Each step adds the input again behind its own LayerNorm (rSkip paper eq. 4); with
    lambda = 1 this is post-LN.
    """

    kind = "rskip_ln"
    equation = "y₁ = LN₁(x + F), y_k = LN_k(x + y_{k-1}), output y_λ"
    note = "λ an integer ≥ 1"
    source = "rSkip paper, eq. 4"
    flags = (SKIP_LAMBDA,)
    statistics = (
        Statistic("rskip_ratio", "rskip_ratio", "rSkip effective skip:residual ratio", "effective skip : residual ratio"),
    )
    arch_family = "rskip"
    arch_options = {"skip_lambda": 2}

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norms = nn.ModuleList(spec.norm(dim) for _ in range(int(spec.skip_lambda)))

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        if spec.skip_lambda < 1 or spec.skip_lambda != int(spec.skip_lambda):
            raise ConnectionConfigError(
                f"--skip-lambda {spec.skip_lambda:g} is invalid for --residual rskip_ln: it must be an integer >= 1"
            )

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        y = fx
        for norm in self.norms:
            y = norm(x + y)
        return y

    def measured_statistics(self) -> Tuple[Statistic, ...]:
        """The ratio's derivation divides by each LayerNorm's sigma: LayerNorm only."""
        return self.statistics if is_layer_norm(self.norms[0]) else ()

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """Effective skip : residual ratio (rSkip paper, appendix A), per position.

        Writing ``LN_j(z) = w_j * (z - mean) / sigma_j + b_j`` and unrolling, the input of
        the last LayerNorm holds ``x`` and ``F`` in the per-feature ratio::

            x : F = 1 + sum_{i=1..lambda-1} prod_{j=1..i} sigma_j / w_j

        with ``sigma_j`` the standard deviation over features of the input of ``LN_j``
        at this position (``x + F`` for j = 1, ``x + y_{j-1}`` after), including the
        LayerNorm's eps, and ``w_j`` its gain (per feature). Mean over features;
        lambda = 1 (post-LN) gives 1.
        """
        x32, y = x.float(), fx.float()
        ratio = torch.ones_like(x32)
        product = torch.ones_like(x32)
        norms = list(self.norms)
        for j, norm in enumerate(norms):
            z = x32 + y
            if j < len(norms) - 1:  # the last LN's sigma does not enter the ratio
                product = product * layer_norm_sigma(norm, z).unsqueeze(-1) / norm.weight.float()
                ratio = ratio + product
            y = norm(z.to(fx.dtype)).float()
        return {"rskip_ratio": ratio.mean(dim=-1)}

