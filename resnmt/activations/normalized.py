"""Normalized activations NReLU and NSwish for the FFN sublayers.

After Peiwen Yuan et al. (2022), "ANAct: Adaptive Normalization for Activation
Functions" (arXiv:2208.13315, section 2.2 and appendix A.1). The text of the paper we
worked from lost its equations; this module implements the reading in
``docs/normalized-activations.md``.

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
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from resnmt.activations import native
from resnmt.options import OptionError
from resnmt.training.compile import FLAG, CompileUnavailableError, compiled, require_compile

PAPER = 'Yuan et al. 2022, "ANAct: Adaptive Normalization for Activation Functions"'

KINDS = ("nrelu", "nswish")
STATS_MODES = ("instance", "batch")
SIDES = ("encoder", "decoder")


class ActivationConfigError(OptionError):
    """A normalized-activation option with a value outside what is allowed."""


@dataclass(frozen=True)
class ActivationSpec:
    """Everything needed to build the FFN activations of a model, validated once.

    Built from the model args by ``resnmt.models.flags.activation_spec`` (which also
    declares the flags); the defaults below are the only statement of the flags'
    defaults. ``kind=None`` means "no normalized activation: fairseq's --activation-fn".
    The layer counts are only known once the arch has filled in the sizes; when given,
    the ``*_unnormalized_top_layers`` are checked against them.
    """

    kind: Optional[str] = None  # --normalized-activation
    stats: str = "instance"  # --normalized-activation-stats
    momentum: float = 0.9  # --normalized-activation-momentum
    clamp_min: float = 0.01  # --normalized-activation-clamp-min
    clamp_max: float = 2.0  # --normalized-activation-clamp-max
    eps: float = 1e-6  # guard on Var[h]; not a flag
    encoder_unnormalized_top_layers: int = 0  # --encoder-unnormalized-top-layers
    decoder_unnormalized_top_layers: int = 0  # --decoder-unnormalized-top-layers
    encoder_layers: Optional[int] = None
    decoder_layers: Optional[int] = None
    checkpoint_activations: bool = False  # fairseq's --checkpoint-activations
    fused: bool = False  # --fused-connections: torch.compile'd statistics and output

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ActivationConfigError("; ".join(problems))

    def problems(self) -> list:
        """Every option out of range, each naming the flag, its value and what is allowed."""
        problems = []
        if self.kind is not None:
            problems += _check_values(self.kind, self.stats, self.momentum, self.clamp_min, self.clamp_max)
            if self.stats == "batch" and self.checkpoint_activations:
                problems.append(
                    "--normalized-activation-stats batch cannot be used with --checkpoint-activations: "
                    "the recomputed forward would update the running estimates twice per step; "
                    "use --normalized-activation-stats instance"
                )
        for side in SIDES:
            k = self.top_layers(side)
            num_layers = getattr(self, f"{side}_layers")
            problem = _check_top_layers(side, k, num_layers)
            if problem:
                problems.append(problem)
            elif k and self.kind is None:
                problems.append(
                    f"--{side}-unnormalized-top-layers {k} has no effect without "
                    "--normalized-activation {nrelu,nswish}"
                )
        return problems

    def top_layers(self, side: str) -> int:
        """K of ``--{side}-unnormalized-top-layers``."""
        return getattr(self, f"{side}_unnormalized_top_layers")

    def build(self, side: str, layer_index: int, num_layers: int) -> Optional[nn.Module]:
        """The activation of FFN ``layer_index`` (0-based) of ``side``, or None when no
        normalized activation is asked for ("use --activation-fn").

        The top ``--{side}-unnormalized-top-layers`` FFNs (``layer_index >= num_layers - K``)
        get :class:`UnnormalizedActivation` (ReLU for nrelu, Swish for nswish), not
        --activation-fn: fairseq's --activation-fn cannot be swish, and the paper's
        "NSwish+kSwish" keeps Swish.
        """
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        if not 0 <= layer_index < num_layers:
            raise ValueError(f"layer_index must be in [0, {num_layers}), got {layer_index}")
        if self.kind is None:
            return None
        problem = _check_top_layers(side, self.top_layers(side), num_layers)
        if problem:
            raise ActivationConfigError(problem)
        if layer_index >= num_layers - self.top_layers(side):
            return UnnormalizedActivation(self.kind)
        return NormalizedActivation(self)


class NormalizedActivation(nn.Module):
    """NReLU / NSwish: ``2*sigmoid(omega) * lambda * (f(h) - mu)``, statistics detached.

    Built from an :class:`ActivationSpec` (``NormalizedActivation(spec)``), or from its
    fields (``NormalizedActivation("nswish", "batch", momentum=0.5)``); the spec validates.

    Args (the spec's fields):
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

    def __init__(self, kind: Union[str, ActivationSpec], stats: Optional[str] = None, **options):
        super().__init__()
        if isinstance(kind, ActivationSpec):
            spec = kind
        else:  # validated (once) by the spec
            spec = ActivationSpec(kind=kind, **({} if stats is None else {"stats": stats}), **options)
        if spec.kind is None:
            raise ActivationConfigError(f"--normalized-activation must be one of {', '.join(KINDS)}, got None")
        self.kind = spec.kind
        self.stats = spec.stats
        self.swish = spec.kind == "nswish"
        self.batch_stats = spec.stats == "batch"
        self.momentum = float(spec.momentum)
        self.clamp_min = float(spec.clamp_min)
        self.clamp_max = float(spec.clamp_max)
        self.eps = float(spec.eps)
        self.fused = spec.fused
        if spec.fused:
            require_compile()
            if not self.batch_stats:
                try:  # built here, so that a missing or failing compiler stops the model build
                    native.library()
                except native.NativeKernelError as err:
                    raise CompileUnavailableError(
                        f"{FLAG}: {err}; train without {FLAG} (the eager path computes the same)") from err
        self._output = self._fused_output if spec.fused else self._eager_output
        self.omega = nn.Parameter(torch.zeros(()))
        if self.batch_stats:
            # Before the first update the estimates make the output f(h) itself.
            self.register_buffer("running_mu", torch.zeros(()))
            self.register_buffer("running_rho", torch.ones(()))
            self.register_buffer("running_rho_prime", torch.ones(()))
            self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    def forward(self, h: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        with torch.autocast(device_type=h.device.type, enabled=False):
            return self._output(h, padding_mask)

    def _eager_output(self, h: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        return self._output_by(_normalized_output, h, padding_mask)

    def _output_by(self, values, h: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """The output with the forward ``values`` (``_normalized_output`` or ``_native_output``)
        and the hand-written backward of :class:`_NormalizedActivationFn`."""
        if torch.is_grad_enabled() and (h.requires_grad or self.omega.requires_grad):
            return _NormalizedActivationFn.apply(h, self.omega, self, padding_mask, values)
        # inference (decoding, validation): the same values without the autograd
        # function's bookkeeping, which costs as much as the arithmetic at decode size
        return values(h, self.omega, self, padding_mask)[0]

    def _fused_output(self, h: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """The same values, fused (``--fused-connections``): per-token statistics on the CPU
        by the native kernel (``resnmt.activations.native``; the backward is the eager one),
        otherwise through ``torch.compile``d functions (forward and backward)."""
        if not self.batch_stats:
            if h.device.type == "cpu":
                return self._output_by(_native_output, h, padding_mask)
            return fused_instance_activation(h, self.omega, self.swish, self.clamp_min, self.clamp_max, self.eps)
        if self.training:
            weights = torch.ones(h.shape[:2], device=h.device) if padding_mask is None else _token_weights(padding_mask, h)
            mu, rho, rho_prime = self._update_estimates(*fused_batch_statistics(h, weights, self.swish, self.eps))
        else:
            mu, rho, rho_prime = self.running_mu.float(), self.running_rho.float(), self.running_rho_prime.float()
        return fused_scaled_activation(h, self.omega, mu, rho, rho_prime, self.swish)

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
        return self._update_estimates(*self._batch_stats(x, a, positive, padding_mask))

    def _update_estimates(self, mu_b: Tensor, rho_b: Tensor, p_b: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Fold one batch's (mu, rho, p) into the running estimates; the new estimates."""
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
        if self.fused:
            s += ", fused"
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
    tiny positive ``h``. ``values`` computes the forward (``_normalized_output``, or the
    native kernel's ``_native_output`` with ``--fused-connections`` on the CPU).
    """

    @staticmethod
    def forward(ctx, h: Tensor, omega: Tensor, act: "NormalizedActivation", padding_mask: Optional[Tensor], values):
        out, scale, x = values(h, omega, act, padding_mask)
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
        return grad_h, grad_omega, None, None, None


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


def _native_output(
    h: Tensor, omega: Tensor, act: NormalizedActivation, padding_mask: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_normalized_output` for per-token statistics on the CPU, by the native kernel."""
    x = h.float()
    gate = 2.0 * torch.sigmoid(omega.detach().float()).item()
    out, scale = native.instance_activation(x, gate, act.swish, act.clamp_min, act.clamp_max, act.eps)
    return out.to(h.dtype), scale, x


def _token_weights(padding_mask: Tensor, x: Tensor) -> Tensor:
    """1.0 at real tokens, 0.0 at padding, shaped ``(seq_len, batch)`` like ``x[..., 0]``."""
    if padding_mask.dim() != 2 or padding_mask.t().shape != x.shape[:2]:
        raise ValueError(
            f"padding_mask must be (batch, seq_len) = {tuple(x.shape[1::-1])} for "
            f"h of shape {tuple(x.shape)}, got {tuple(padding_mask.shape)}"
        )
    return (~padding_mask.t()).to(x.dtype)


# --------------------------------------------------------------------------- checks


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


def _check_top_layers(side: str, k, num_layers: Optional[int]) -> Optional[str]:
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= (num_layers if num_layers is not None else k):
        bound = f"[0, {num_layers}] (--{side}-layers)" if num_layers is not None else ">= 0"
        return f"--{side}-unnormalized-top-layers must be an integer in {bound}, got {k!r}"
    return None


# ------------------------------------------------------------- the fused path (--fused-connections)
# pure functions of the same equations, compiled on first use (resnmt.training.compile)


def _activate(x: Tensor, swish: bool) -> Tensor:
    return F.silu(x) if swish else torch.relu(x)


def _scaled(h: Tensor, omega: Tensor, mu: Tensor, rho: Tensor, rho_prime: Tensor, swish: bool) -> Tensor:
    """``2*sigmoid(omega) * lambda * (f(h) - mu)`` in float32, output in ``h``'s dtype;
    the statistics are constants for autograd (detached), as in the eager path."""
    x = h.float()
    lam = ((rho.reciprocal() + rho_prime.reciprocal()) * 0.5).sqrt()
    scale = 2.0 * torch.sigmoid(omega.float()) * lam.detach()
    return (scale * (_activate(x, swish) - mu.detach())).to(h.dtype)


def instance_activation(h: Tensor, omega: Tensor, swish: bool, clamp_min: float, clamp_max: float, eps: float) -> Tensor:
    """NReLU/NSwish with per-token statistics over the last (feature) dimension."""
    x = h.float().detach()
    a = _activate(x, swish)
    mu = a.mean(dim=-1, keepdim=True)
    var_h = (x.square().mean(dim=-1, keepdim=True) - x.mean(dim=-1, keepdim=True).square()).clamp(min=0.0)
    var_a = (a.square().mean(dim=-1, keepdim=True) - mu.square()).clamp(min=0.0)
    rho = (var_a / (var_h + eps)).clamp(clamp_min, clamp_max)
    rho_prime = (x > 0).float().mean(dim=-1, keepdim=True).clamp(clamp_min, clamp_max)
    return _scaled(h, omega, mu, rho, rho_prime, swish)


def batch_statistics(h: Tensor, weights: Tensor, swish: bool, eps: float):
    """``(mu, rho, p)`` over every feature of the tokens weighted by ``weights``
    ``(seq_len, batch)`` (1 at real tokens, 0 at padding); unclamped, no gradient."""
    x = h.float().detach()
    a = _activate(x, swish)
    w = weights / weights.sum().clamp(min=1.0)
    mean_h_t, mean_a_t = x.mean(dim=-1), a.mean(dim=-1)
    var_h_t = (x.square().mean(dim=-1) - mean_h_t.square()).clamp(min=0.0)
    var_a_t = (a.square().mean(dim=-1) - mean_a_t.square()).clamp(min=0.0)
    mu = (w * mean_a_t).sum()
    mean_h = (w * mean_h_t).sum()
    var_a = (w * (var_a_t + (mean_a_t - mu).square())).sum()
    var_h = (w * (var_h_t + (mean_h_t - mean_h).square())).sum()
    p = (w * (x > 0).float().mean(dim=-1)).sum()
    return mu, var_a / (var_h + eps), p


def scaled_activation(h: Tensor, omega: Tensor, mu: Tensor, rho: Tensor, rho_prime: Tensor, swish: bool) -> Tensor:
    """The output for given (already clamped) statistics: batch mode's last step."""
    return _scaled(h, omega, mu, rho, rho_prime, swish)


fused_instance_activation = compiled(instance_activation)
fused_batch_statistics = compiled(batch_statistics)
fused_scaled_activation = compiled(scaled_activation)
