"""Normalized activations NReLU and NSwish for the FFN sublayers.

After Peiwen Yuan et al. (2022), "ANAct: Adaptive Normalization for Activation
Functions" (``papers/anact-normalized-activations-2022.txt``, section 2.2 and
appendix A.1). The extracted paper lost its equations; this module implements the
reading in ``docs/normalized-activations.md`` (and ``../shared/docs/methods.md``).

For the fc1 output ``h`` and ``a = f(h)`` (f = ReLU, or Swish ``h * sigmoid(h)``)::

    mu      = E[a]
    rho     = Var[a] / (Var[h] + eps)        forward gain
    rho'    = P(h > 0)                       backward gain: f'(h) read as Bernoulli(p)
    lambda  = sqrt((1/rho + 1/rho') / 2)     reciprocal of the harmonic mean
    output  = 2 * sigmoid(omega) * lambda * (a - mu)

``omega`` is one learnable scalar per activation (initialised 0, so the gate starts at
1); ``mu``, ``rho`` and ``rho'`` are constants for autograd. ``rho`` and ``rho'`` are
clamped to ``[lo, hi]`` (so ``lambda**2`` lies in ``[1/hi, 1/lo]``); ``mu`` is not
clamped (it has the units of ``h`` and is negative for Swish on mostly negative inputs).

Statistics ("--normalized-activation-stats"):

* ``instance`` (the paper's Transformer setting, default): per token over the
  ``ffn_dim`` hidden features; no running state, padding irrelevant.
* ``batch``: over every non-padding position and feature of the mini-batch, kept as
  momentum estimates ``r <- m_n * r + (1 - m_n) * clamp(r_batch)`` with
  ``m_n = min(m, 1 - 1/n)`` at the n-th update. Training uses the just-updated
  estimate, evaluation the stored one. The estimates are buffers (saved in checkpoints,
  averaged by checkpoint averaging).

Statistics are computed in float32 whatever the input dtype; the output has the input
dtype. The top ``--{encoder,decoder}-unnormalized-top-layers`` FFNs get
:class:`UnnormalizedActivation` (plain ReLU / Swish), the paper's "NSwish+kSwish".
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

PAPER = 'Yuan et al. 2022, "ANAct: Adaptive Normalization for Activation Functions"'

KINDS = ("nrelu", "nswish")
STATS_MODES = ("instance", "batch")
SIDES = ("encoder", "decoder")

DEFAULT_STATS = "instance"
DEFAULT_MOMENTUM = 0.9
DEFAULT_CLAMP_MIN = 0.01
DEFAULT_CLAMP_MAX = 2.0
DEFAULT_EPS = 1e-6


class NormalizedActivation(nn.Module):
    """NReLU / NSwish: ``2*sigmoid(omega) * lambda * (f(h) - mu)``, statistics detached.

    Args:
        kind: "nrelu" or "nswish".
        stats: "instance" (per token over features) or "batch" (over the mini-batch's
            real tokens, with momentum estimates kept in buffers).
        momentum: m in ``r <- m*r + (1-m)*r_batch``, in [0, 1) (batch mode only).
        clamp_min, clamp_max: the bounds ``[lo, hi]`` applied to rho and rho'.
        eps: added to ``Var[h]`` before dividing.

    Call as ``activation(h, padding_mask)``: ``h`` is ``(seq_len, batch, ffn_dim)``,
    ``padding_mask`` is ``(batch, seq_len)`` with True at padding, or None. Returns a
    tensor shaped and typed like ``h``.
    """

    def __init__(
        self,
        kind: str,
        stats: str = DEFAULT_STATS,
        momentum: float = DEFAULT_MOMENTUM,
        clamp_min: float = DEFAULT_CLAMP_MIN,
        clamp_max: float = DEFAULT_CLAMP_MAX,
        eps: float = DEFAULT_EPS,
    ):
        super().__init__()
        problems = _check_values(kind, stats, momentum, clamp_min, clamp_max)
        if problems:
            raise ValueError("; ".join(problems))
        self.kind = kind
        self.stats = stats
        self.swish = kind == "nswish"
        self.batch_stats = stats == "batch"
        self.momentum = float(momentum)
        self.clamp_min = float(clamp_min)
        self.clamp_max = float(clamp_max)
        self.eps = float(eps)
        self.omega = nn.Parameter(torch.zeros(()))
        if self.batch_stats:
            # Before the first update the estimates make the output f(h) itself.
            self.register_buffer("running_mu", torch.zeros(()))
            self.register_buffer("running_rho", torch.ones(()))
            self.register_buffer("running_rho_prime", torch.ones(()))
            self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    def forward(self, h: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        with torch.autocast(device_type=h.device.type, enabled=False):
            if torch.is_grad_enabled() and (h.requires_grad or self.omega.requires_grad):
                return _NormalizedActivationFn.apply(h, self.omega, self, padding_mask)
            # inference (decoding, validation): the same values without the autograd
            # function's bookkeeping, which costs as much as the arithmetic at decode size
            return _normalized_output(h, self.omega, self, padding_mask)[0]

    def activate(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """``(f(x), positive)`` for float32 ``x``: the plain activation and the per-token
        count of ``x > 0`` ``(seq_len, batch)``, the inputs of :meth:`statistics`.

        One full-size temporary: first 1.0 where x > 0 (counted as float: summing a bool
        tensor is slow on CPU), then ``f(x)``.
        """
        buf = torch.empty_like(x)
        positive = torch.gt(x, 0.0, out=buf).sum(dim=-1)
        a = torch.ops.aten.silu.out(x, out=buf) if self.swish else torch.clamp_min(x, 0.0, out=buf)
        return a, positive

    def statistics(
        self, x: Tensor, a: Tensor, positive: Tensor, padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """(mu, rho, rho') for ``x = h`` in float32, ``a = f(x)`` and ``positive``, the
        per-token count of ``x > 0`` ``(seq_len, batch)``; no gradient.

        Per token, each ``(seq_len, batch, 1)``, in instance mode; scalars in batch mode
        (in training this updates the running estimates and returns the new values).
        """
        if self.batch_stats:
            return self._batch_estimates(x, a, positive, padding_mask)
        return self._instance_stats(x, a, positive)

    def _token_stats(self, x: Tensor, a: Tensor, positive: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Per-token mean and (biased) variance of h and a, and the fraction of h > 0.

        Each ``(seq_len, batch)``. The five per-token sums are stacked so that the
        arithmetic on them is a handful of ops whatever the number of statistics: at
        decoding sizes the cost is the number of tiny ops, not their size.
        ``torch.var_mean`` (Welford) is several times slower on CPU; in float32 the
        one-pass variance loses ~1e-7 * (mean/std)**2 relative accuracy: negligible.
        """
        sums = torch.stack(
            (x.sum(dim=-1), torch.linalg.vecdot(x, x), a.sum(dim=-1), torch.linalg.vecdot(a, a), positive)
        ).mul_(1.0 / x.size(-1))
        means = sums[0:4:2]
        variances = (sums[1:4:2] - means.square()).clamp_(min=0.0)
        return means[0], variances[0], means[1], variances[1], sums[4]

    def _instance_stats(self, x: Tensor, a: Tensor, positive: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Per-token (mu, rho, rho'), each ``(seq_len, batch, 1)``."""
        _, var_h, mu, var_a, p = self._token_stats(x, a, positive)
        gains = torch.stack((var_a / (var_h + self.eps), p)).clamp_(self.clamp_min, self.clamp_max)
        gains = gains.unsqueeze(-1)
        return mu.unsqueeze(-1), gains[0], gains[1]

    def _batch_estimates(
        self, x: Tensor, a: Tensor, positive: Tensor, padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """Scalar (mu, rho, rho'): updated estimates in training, stored ones in eval."""
        if not self.training:
            return (
                self.running_mu.float(),
                self.running_rho.float(),
                self.running_rho_prime.float(),
            )
        mu_b, rho_b, p_b = self._batch_stats(x, a, positive, padding_mask)
        self.num_updates.add_(1)
        n = self.num_updates.float()
        # m_n = min(m, 1 - 1/n): the first update takes the batch value as it is
        weight = 1.0 - torch.clamp(1.0 - n.reciprocal(), max=self.momentum)
        lo, hi = self.clamp_min, self.clamp_max
        mu = torch.lerp(self.running_mu.float(), mu_b, weight)
        rho = torch.lerp(self.running_rho.float(), rho_b.clamp(lo, hi), weight).clamp(lo, hi)
        rho_prime = torch.lerp(
            self.running_rho_prime.float(), p_b.clamp(lo, hi), weight
        ).clamp(lo, hi)
        self.running_mu.copy_(mu)
        self.running_rho.copy_(rho)
        self.running_rho_prime.copy_(rho_prime)
        return mu, rho, rho_prime

    def _batch_stats(
        self, x: Tensor, a: Tensor, positive: Tensor, padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """(mu, rho, p) over all features of all non-padding tokens, as scalars.

        Per-token means and variances are combined with the law of total variance,
        so the mask only touches ``(seq_len, batch)`` tensors, never ``h`` itself.
        """
        mean_h_t, var_h_t, mean_a_t, var_a_t, p_t = self._token_stats(x, a, positive)
        if padding_mask is None:
            w = torch.ones_like(mean_h_t)
        else:
            w = _token_weights(padding_mask, x)
        w = w / w.sum().clamp(min=1.0)
        mu = (w * mean_a_t).sum()
        var_a = (w * (var_a_t + (mean_a_t - mu).square())).sum()
        mean_h = (w * mean_h_t).sum()
        var_h = (w * (var_h_t + (mean_h_t - mean_h).square())).sum()
        p = (w * p_t).sum()
        return mu, var_a / (var_h + self.eps), p

    def extra_repr(self) -> str:
        s = f"{self.kind}, stats={self.stats}, clamp=[{self.clamp_min}, {self.clamp_max}]"
        if self.batch_stats:
            s += f", momentum={self.momentum}"
        return s



class UnnormalizedActivation(nn.Module):
    """The plain f of a normalized activation (ReLU for nrelu, Swish for nswish), for the
    top FFNs that ``--{encoder,decoder}-unnormalized-top-layers`` keep unnormalized."""

    def __init__(self, kind: str):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"--normalized-activation must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.swish = kind == "nswish"

    def forward(self, h: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        return F.silu(h) if self.swish else F.relu(h)

    def extra_repr(self) -> str:
        return "swish" if self.swish else "relu"


class _NormalizedActivationFn(torch.autograd.Function):
    """``out = 2*sigmoid(omega) * lambda * (f(h) - mu)`` with mu and lambda constants.

    Written by hand so that the forward makes one full-size temporary (``f(h)``, then
    overwritten by the output) and the backward keeps what plain Swish/ReLU would, plus
    the output (which fc2 keeps anyway, so it costs nothing), using
    ``d out / d omega = (1 - sigmoid(omega)) * out``: NSwish keeps ``h`` (Swish' needs
    it), NReLU only the boolean mask ``h > 0`` (1 byte per element, a quarter of a
    float32 ``h``). The mask is kept rather than read back from the output
    (``h > 0`` iff ``out > -mu * scale``) because rounding makes that test wrong for
    tiny positive ``h``.
    """

    @staticmethod
    def forward(ctx, h: Tensor, omega: Tensor, act: "NormalizedActivation", padding_mask: Optional[Tensor]):
        out, scale, x = _normalized_output(h, omega, act, padding_mask)
        ctx.swish = act.swish
        if act.swish:
            ctx.save_for_backward(h, out, scale, omega)
        else:
            relu_mask = torch.gt(x, 0.0) if ctx.needs_input_grad[0] else None
            ctx.save_for_backward(relu_mask, out, scale, omega)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        h_or_mask, out, scale, omega = ctx.saved_tensors
        grad_h = grad_omega = None
        with torch.autocast(device_type=out.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                g = grad_out.float()
                if ctx.swish:
                    grad_h = torch.ops.aten.silu_backward(g, h_or_mask.float())
                else:
                    grad_h = torch.mul(g, h_or_mask)
                grad_h = grad_h.mul_(scale).to(out.dtype)
            if ctx.needs_input_grad[1]:
                dot = torch.dot(grad_out.reshape(-1).float(), out.reshape(-1).float())
                grad_omega = ((1.0 - torch.sigmoid(omega.float())) * dot).to(omega.dtype)
        return grad_h, grad_omega, None, None


def normalization_factor(rho: Tensor, rho_prime: Tensor) -> Tensor:
    """``lambda = sqrt((1/rho + 1/rho') / 2)``, the reciprocal of the harmonic mean of the
    forward and backward gains (a new tensor)."""
    return (rho.reciprocal() + rho_prime.reciprocal()).mul_(0.5).sqrt_()


def _normalized_output(
    h: Tensor, omega: Tensor, act: NormalizedActivation, padding_mask: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, scale, x)``: the output in ``h``'s dtype, ``scale = 2*sigmoid(omega)*lambda``
    and ``x = h.float()``. No autograd bookkeeping (the caller decides what to save)."""
    x = h.float()
    a, positive = act.activate(x)  # a is the one full-size temporary, overwritten below
    mu, rho, rho_prime = act.statistics(x, a, positive, padding_mask)
    scale = normalization_factor(rho, rho_prime).mul_(2.0 * torch.sigmoid(omega.detach().float()))
    # scale * (a - mu), written over the temporary a (two in-place passes: a broadcast
    # addcmul is 3x slower at decoding sizes on CPU, and no faster at training sizes)
    out = a.sub_(mu).mul_(scale).to(h.dtype)
    return out, scale, x


def _token_weights(padding_mask: Tensor, x: Tensor) -> Tensor:
    """1.0 at real tokens, 0.0 at padding, shaped ``(seq_len, batch)`` like ``x[..., 0]``."""
    if padding_mask.dim() != 2 or padding_mask.t().shape != x.shape[:2]:
        raise ValueError(
            f"padding_mask must be (batch, seq_len) = {tuple(x.shape[1::-1])} for "
            f"h of shape {tuple(x.shape)}, got {tuple(padding_mask.shape)}"
        )
    return (~padding_mask.t()).to(x.dtype)


# --------------------------------------------------------------------------- flags


def add_normalized_activation_args(parser) -> None:
    """Add the ``--normalized-activation*`` and ``--*-unnormalized-top-layers`` flags.

    No defaults here (fairseq parses model flags with ``argparse.SUPPRESS``): the arch
    functions call :func:`normalized_activation_defaults`.
    """
    parser.add_argument(
        "--normalized-activation", choices=KINDS, metavar="{nrelu,nswish}",
        help=f"FFN activation normalized as in {PAPER}: 2*sigmoid(omega)*lambda*(f(h)-E[f(h)]) "
        "with f = ReLU (nrelu) or Swish (nswish), lambda**2 = (1/rho + 1/rho')/2, "
        "rho = Var[f(h)]/Var[h], rho' = fraction of positive h. Replaces --activation-fn "
        "in every FFN (see --encoder/decoder-unnormalized-top-layers). "
        "Unset: the plain --activation-fn",
    )
    parser.add_argument(
        "--normalized-activation-stats", choices=STATS_MODES, metavar="{instance,batch}",
        help="where mu, rho, rho' come from: 'instance' = per token over the FFN hidden "
        "features, no running state (the paper's Transformer setting; default); "
        "'batch' = over all real (non-padding) tokens of the mini-batch, kept as "
        "momentum estimates used at evaluation",
    )
    parser.add_argument(
        "--normalized-activation-momentum", type=float, metavar="M",
        help=f"batch stats only: r <- m_n*r + (1-m_n)*r_batch with m_n = min(M, 1-1/n) at "
        f"the n-th update ({PAPER}, eq. 16-18); in [0, 1); default {DEFAULT_MOMENTUM}. "
        "Note: M weights the history (PyTorch BatchNorm's momentum is 1-M)",
    )
    parser.add_argument(
        "--normalized-activation-clamp-min", type=float, metavar="LO",
        help=f"lower bound for rho and rho' (the paper's bounds against abnormal values): "
        f"bounds lambda <= 1/sqrt(LO); > 0; default {DEFAULT_CLAMP_MIN}",
    )
    parser.add_argument(
        "--normalized-activation-clamp-max", type=float, metavar="HI",
        help="upper bound for rho and rho' (rho' <= 1; rho <= 1 for ReLU, <= 1.21 for "
        f"Swish, so the default {DEFAULT_CLAMP_MAX} only catches numerical garbage); > LO",
    )
    for side in SIDES:
        parser.add_argument(
            f"--{side}-unnormalized-top-layers", type=int, metavar="K",
            help=f"the top K {side} FFNs keep the unnormalized activation (ReLU for nrelu, "
            f"Swish for nswish): the paper's 'NSwish+kSwish' (NSwish in every FFN "
            "collapsed at FFN size 2048); 0 <= K <= layers; default 0",
        )


def normalized_activation_defaults(args) -> None:
    """Fill in unset flags (call from every arch function; getattr chains only)."""
    args.normalized_activation = getattr(args, "normalized_activation", None)
    args.normalized_activation_stats = getattr(args, "normalized_activation_stats", DEFAULT_STATS)
    args.normalized_activation_momentum = getattr(
        args, "normalized_activation_momentum", DEFAULT_MOMENTUM
    )
    args.normalized_activation_clamp_min = getattr(
        args, "normalized_activation_clamp_min", DEFAULT_CLAMP_MIN
    )
    args.normalized_activation_clamp_max = getattr(
        args, "normalized_activation_clamp_max", DEFAULT_CLAMP_MAX
    )
    args.encoder_unnormalized_top_layers = getattr(args, "encoder_unnormalized_top_layers", 0)
    args.decoder_unnormalized_top_layers = getattr(args, "decoder_unnormalized_top_layers", 0)


def _get(cfg, name: str, default):
    value = getattr(cfg, name, None)
    return default if value is None else value


def _check_values(kind, stats, momentum, clamp_min, clamp_max) -> list:
    problems = []
    if kind not in KINDS:
        problems.append(f"--normalized-activation must be one of {', '.join(KINDS)}, got {kind!r}")
    if stats not in STATS_MODES:
        problems.append(
            f"--normalized-activation-stats must be one of {', '.join(STATS_MODES)}, got {stats!r}"
        )
    if not 0.0 <= momentum < 1.0:
        problems.append(f"--normalized-activation-momentum must be in [0, 1), got {momentum}")
    if not clamp_min > 0.0:
        problems.append(f"--normalized-activation-clamp-min must be > 0, got {clamp_min}")
    if not clamp_min < clamp_max:
        problems.append(
            f"--normalized-activation-clamp-max must be > --normalized-activation-clamp-min "
            f"({clamp_min}), got {clamp_max}"
        )
    return problems


def _check_top_layers(side: str, k, num_layers) -> Optional[str]:
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= num_layers:
        return (
            f"--{side}-unnormalized-top-layers must be an integer in [0, {num_layers}] "
            f"(--{side}-layers), got {k!r}"
        )
    return None


def validate_normalized_activation_args(args) -> None:
    """Raise ValueError naming every bad flag, its value and the allowed range."""
    kind = getattr(args, "normalized_activation", None)
    problems = []
    if kind is not None:
        problems += _check_values(
            kind,
            _get(args, "normalized_activation_stats", DEFAULT_STATS),
            _get(args, "normalized_activation_momentum", DEFAULT_MOMENTUM),
            _get(args, "normalized_activation_clamp_min", DEFAULT_CLAMP_MIN),
            _get(args, "normalized_activation_clamp_max", DEFAULT_CLAMP_MAX),
        )
        if _get(args, "normalized_activation_stats", DEFAULT_STATS) == "batch" and getattr(
            args, "checkpoint_activations", False
        ):
            problems.append(
                "--normalized-activation-stats batch cannot be used with --checkpoint-activations: "
                "the recomputed forward would update the running estimates twice per step; "
                "use --normalized-activation-stats instance"
            )
    for side in SIDES:
        k = _get(args, f"{side}_unnormalized_top_layers", 0)
        num_layers = getattr(args, f"{side}_layers", None)
        if num_layers is not None:
            problem = _check_top_layers(side, k, num_layers)
            if problem:
                problems.append(problem)
        if k and kind is None:
            problems.append(
                f"--{side}-unnormalized-top-layers {k} has no effect without "
                "--normalized-activation {nrelu,nswish}"
            )
    if problems:
        raise ValueError("; ".join(problems))


def normalized_activation_from_cfg(cfg, side: str, layer_index: int, num_layers: int) -> Optional[nn.Module]:
    """The activation of FFN ``layer_index`` (0-based) of ``side`` under
    ``--normalized-activation``, or None when that flag is unset ("use --activation-fn").

    The top ``--{side}-unnormalized-top-layers`` FFNs (``layer_index >= num_layers - K``)
    get the unnormalized counterpart, :class:`UnnormalizedActivation` (ReLU for nrelu,
    Swish for nswish), not --activation-fn: fairseq's --activation-fn cannot be swish, and
    the paper's "NSwish+kSwish" keeps Swish. ``cfg`` is a TransformerConfig or Namespace
    with the flat attributes above; missing ones (old checkpoints) read as defaults.
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if not 0 <= layer_index < num_layers:
        raise ValueError(f"layer_index must be in [0, {num_layers}), got {layer_index}")
    kind = getattr(cfg, "normalized_activation", None)
    if kind is None:
        return None
    k = _get(cfg, f"{side}_unnormalized_top_layers", 0)
    problem = _check_top_layers(side, k, num_layers)
    if problem:
        raise ValueError(problem)
    if layer_index >= num_layers - k:
        return UnnormalizedActivation(kind)
    return NormalizedActivation(
        kind,
        stats=_get(cfg, "normalized_activation_stats", DEFAULT_STATS),
        momentum=_get(cfg, "normalized_activation_momentum", DEFAULT_MOMENTUM),
        clamp_min=_get(cfg, "normalized_activation_clamp_min", DEFAULT_CLAMP_MIN),
        clamp_max=_get(cfg, "normalized_activation_clamp_max", DEFAULT_CLAMP_MAX),
    )
