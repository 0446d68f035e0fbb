"""What every connection kind is, and the forms several kinds share.

A kind is one :class:`SublayerConnection` subclass registered with
:func:`~resnmt.connections.spec.register_connection`. Every kind offers the same two steps
around its sublayer (:meth:`SublayerConnection.read` and :meth:`SublayerConnection.write`),
so the layers (:mod:`resnmt.models.layers`) write each sublayer once for every kind. Kinds
with the same form share a base here instead of inheriting another kind and undoing it:
:class:`ScaledSkipConnection` is ``[LN](s (.) x + F)`` with ``s`` a constant or a learned
vector (xSkip, xSkip+LN, DeepNorm, Admin differ only in where ``s`` comes from).
"""
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from resnmt.connections.spec import CONNECTION_CLASSES, ConnectionSpec, Statistic
from resnmt.connections.streams import ResidualStream
from resnmt.options import Option

# roles of the projections a layer hands to ``initialize_sublayer``
QUERY, KEY, VALUE, OUTPUT, FFN_IN, FFN_OUT = "query", "key", "value", "output", "ffn_in", "ffn_out"


class SublayerConnection(nn.Module):
    """Base class: how a sublayer ``F`` is connected, in two steps around it.

    Every layer runs each of its sublayers (self-attention, cross-attention, FFN), whatever
    the kind, as::

        branch_input, carry = connection.read(x)
        x = connection.write(x, dropout(F(branch_input)), layer_input, carry)

    ``x`` is what the stack hands the layer and what the layer returns (``(seq_len, batch,
    embed_dim)``, or the n streams ``(seq_len, batch, n, embed_dim)`` of Hyper-Connections);
    ``layer_input`` the layer's own input (B2T's last connection adds it); ``carry`` what
    :meth:`read` computed for :meth:`write` (nothing for a kind with one stream; the mixed
    streams and their write-back weights for HC and mHC). The layer passes everything to
    every connection and never learns which kind it runs; a kind ignores what it does
    not need. A kind with one stream defines :meth:`prenorm` (what the sublayer reads;
    default: ``x`` itself) and :meth:`forward` ``(x, F) -> y``, its equation; the default
    steps call them (:meth:`write` through the module's call, so that forward hooks, such
    as ``resnmt-analyze``'s, see ``x`` and ``F``).

    Class attributes a kind sets (read by the flags, the archs, the docs and the analysis):

    * ``kind``, ``equation``, ``note``, ``source``: its ``--residual`` name, its output
      as a formula (and a few words more), the paper; ``--residual``'s help and the
      tables of kinds in the documentation are made of them;
    * ``flags``: its :class:`~resnmt.options.Option` s (shared flags are the same
      object in several kinds);
    * ``final_norm``: the stack ends with a norm (pre-LN);
    * ``statistics``: the :class:`Statistic` s :meth:`measure` returns;
    * ``arch_family``, ``arch_options``: named archs ``transformer_<family>_{base,big}``
      and the flag values they choose (no family: no named arch);
    * ``normalized``: the kind owns normalizations (``--normalization`` replaces them);
    * ``multi_stream``: ``x`` is n streams (Hyper-Connections, mHC);
    * ``crosses_layers`` and :meth:`build_stream`: the stack carries a
      :class:`~resnmt.connections.streams.ResidualStream` from layer to layer besides ``x``
      (ResiDual, DLCL, DenseFormer, HC, mHC), which :meth:`build_stream` builds (None:
      plain stacking);
    * ``no_gradient_by_design``: patterns (``fnmatch``) of the model's parameter names that
      get no gradient by the method's design (the contract, :mod:`resnmt.testing`, checks
      that every other parameter gets one and these none);
    * :meth:`learned`: what ``resnmt-analyze`` reports of a connection's learned weights
      (HC's and mHC's static mixing; nothing by default);
    * :meth:`build_attention`: the layer's attentions (fairseq's, or HybridNorm's with
      per-head normalized Q, K, V).

    A connection is built once per sublayer from its layer's spec (``spec.layer_index`` is
    the layer, ``spec.sublayer`` the sublayer), so a kind may depend on both.
    """

    kind: ClassVar[str]
    equation: ClassVar[str]
    note: ClassVar[str] = ""
    source: ClassVar[str]
    flags: ClassVar[Tuple[Option, ...]] = ()
    final_norm: ClassVar[bool] = False
    statistics: ClassVar[Tuple[Statistic, ...]] = ()
    arch_family: ClassVar[Optional[str]] = None
    arch_options: ClassVar[Mapping[str, Any]] = {}
    normalized: ClassVar[bool] = True
    multi_stream: ClassVar[bool] = False
    crosses_layers: ClassVar[bool] = False
    no_gradient_by_design: ClassVar[Tuple[str, ...]] = ()

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        """Kind-specific checks beyond each flag's own (raise ConnectionConfigError)."""

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        """The stack's residual stream for this kind; None: the layers are simply stacked."""
        return None

    @classmethod
    def build_attention(cls, spec: ConnectionSpec, fairseq_attention: Callable[[], nn.Module], embed_dim: int,
                        num_heads: int, **kwargs) -> nn.Module:
        """A layer's attention (self or cross), built before its connections: fairseq's own
        (``fairseq_attention()``), unless the kind changes it; ``kwargs`` are the arguments
        fairseq builds it with (``dropout``, ``self_attention``, ``kdim``, ``q_noise``, ...)."""
        return fairseq_attention()

    def prenorm(self, x: Tensor) -> Tensor:
        return x

    def read(self, x: Tensor) -> Tuple[Tensor, List[Tensor]]:
        """``x`` -> (what the sublayer reads ``(seq_len, batch, embed_dim)``, what
        :meth:`write` needs from this step besides ``x``)."""
        carry: List[Tensor] = []
        return self.prenorm(x), carry

    def write(self, x: Tensor, fx: Tensor, layer_input: Tensor, carry: List[Tensor]) -> Tensor:
        """The sublayer's output ``fx`` (its dropout included) written into ``x``: what the
        next sublayer reads (``layer_input`` and ``carry``: see the class docstring)."""
        return self(x, fx)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def initialize_sublayer(self, projections: Mapping[str, nn.Module]) -> None:
        """Called by the layer, once, for the sublayer this connection wraps, with its
        linear projections by role (``query``, ``key``, ``value``, ``output`` for
        attention; ``ffn_in``, ``ffn_out`` for the FFN). Default: keep fairseq's init."""

    def measured_statistics(self) -> Tuple[Statistic, ...]:
        """The statistics :meth:`measure` returns for this instance."""
        return self.statistics

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """``{statistic name: per-position values (seq_len, batch)}``; run under no_grad."""
        return {}

    def learned(self) -> Dict[str, List[float]]:
        """What ``resnmt-analyze`` reports of this connection's learned weights, one row per
        name (the stack gives one row per sublayer); nothing by default."""
        return {}


def build_connection(dim: int, spec: ConnectionSpec) -> SublayerConnection:
    """The one place that chooses among connection kinds."""
    return CONNECTION_CLASSES[spec.kind](dim, spec)


def build_stream(dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
    """The residual stream of ``spec``'s stack (None: plain stacking)."""
    return CONNECTION_CLASSES[spec.kind].build_stream(dim, spec)


def build_attention(spec: ConnectionSpec, fairseq_attention: Callable[[], nn.Module], embed_dim: int,
                    num_heads: int, **kwargs) -> nn.Module:
    """A layer's attention for ``spec``'s kind (:meth:`SublayerConnection.build_attention`)."""
    return CONNECTION_CLASSES[spec.kind].build_attention(spec, fairseq_attention, embed_dim, num_heads, **kwargs)


# ---------------------------------------------------------------------------- helpers the kinds share


def layer_norm_sigma(norm, z: Tensor) -> Tensor:
    """What ``norm`` divides ``z - mean`` by: ``sqrt(Var[z] + eps)`` over features
    (biased variance, the LayerNorm's own eps), shape ``z.shape[:-1]``."""
    z = z.float()
    return torch.sqrt(z.var(dim=-1, unbiased=False) + float(norm.eps))


def per_position(value: Tensor, like: Tensor) -> Tensor:
    """A per-sublayer number broadcast to every position of ``like`` ``(seq_len, batch, dim)``."""
    return value.detach().float().expand(like.shape[:-1])


SKIP_RATIO = Statistic(
    "skip_ratio", "skip_ratio", "skip:residual norm ratio ||lambda*x|| / ||F||", "||lambda (.) x|| / ||F||"
)


# ---------------------------------------------------------------------------- a shared form


class ScaledSkipConnection(SublayerConnection):
    """The form ``s (.) x + F``, followed by a norm when ``with_norm``.

    The skip scale ``s`` is a constant (``skip_scale`` a float) or, when
    :meth:`learned_scale` says so, a learned per-dimension vector (``skip_scale`` a
    parameter) initialised to :meth:`initial_scale`. A kind of this form says only where
    ``s`` starts, whether it is learned and whether a norm follows; its ``statistics``
    are the skip ratio and, for a kind that may learn ``s``, the mean of ``s``.
    """

    with_norm: ClassVar[bool] = True
    statistics = (SKIP_RATIO,)

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        initial = float(self.initial_scale(spec))
        if self.learned_scale(spec):
            self.skip_scale = nn.Parameter(torch.full((dim,), initial))
        else:
            self.skip_scale = initial
        self.norm = spec.norm(dim) if self.with_norm else None

    @classmethod
    def initial_scale(cls, spec: ConnectionSpec) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def learned_scale(cls, spec: ConnectionSpec) -> bool:
        return False

    @property
    def scale_is_learned(self) -> bool:
        return isinstance(self.skip_scale, Tensor)

    def scaled_sum(self, x: Tensor, fx: Tensor) -> Tensor:
        scale = self.skip_scale
        if isinstance(scale, Tensor):
            return torch.addcmul(fx, x, scale.to(x.dtype))
        # one fused pass (fx + lambda * x) instead of a scaled copy of x and then a sum
        return torch.add(fx, x, alpha=scale)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        if self.norm is not None:
            return self.norm(self.scaled_sum(x, fx))
        return self.scaled_sum(x, fx)

    def measured_statistics(self) -> Tuple[Statistic, ...]:
        return self.statistics if self.scale_is_learned else self.statistics[:1]

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """The skip:residual ratio ``||s (.) x|| / ||F||`` per position (norms over
        features), and with a learned scale its mean over features."""
        scale = self.skip_scale.detach().float() if self.scale_is_learned else self.skip_scale
        skip = torch.linalg.vector_norm(x.float() * scale, dim=-1)
        residual = torch.linalg.vector_norm(fx.float(), dim=-1).clamp(min=1e-12)
        out = {SKIP_RATIO.name: skip / residual}
        if self.scale_is_learned:
            out[self.statistics[1].name] = per_position(self.skip_scale.mean(), x)
        return out

    def extra_repr(self) -> str:
        if self.scale_is_learned:
            return f"learned, dim={self.skip_scale.numel()}"
        return f"lambda={self.skip_scale:g}"
