"""Sublayer connections: how a sublayer's output F is combined with its input x.

Every Transformer sublayer (self-attention, encoder-decoder attention, FFN) is run as::

    fx = dropout(sublayer(connection.prenorm(x)))
    y  = connection(x, fx)

A connection owns its normalizations, gates and constants, so the encoder and decoder
layers hold one connection per sublayer and never branch on the kind. Shapes: ``x`` and
``fx`` are ``(seq_len, batch, embed_dim)``; every gate is computed per position, so a
step of incremental decoding sees exactly what the full forward sees.

**The registry is the one list of kinds.** Each connection class carries everything
about its kind (see :class:`SublayerConnection`): its name, equation and source (the
``--residual`` help), its own flags with defaults, help and checks, whether its stack
ends with a LayerNorm, what ``resnmt-analyze`` and ``--log-connection-stats`` measure,
its named architecture family, and how it initialises the sublayers it wraps. Adding a
kind is one class decorated with :func:`register_connection` in this module.

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
deepnorm   LN(alpha*x + F), beta-scaled Xavier init              Wang et al. 2022
rezero     x + a*F, a a learned scalar starting at 0             Bachlechner et al. 2020
admin      LN(omega (.) x + F), omega a learned vector           Liu et al. 2020
peri_ln    x + LN_out(F(LN_in(x))), final LN after the stack     Kim et al. 2025
b2t        post-LN; a layer's last LN: LN(h + F(h) + x_0)        Takase et al. 2023
resi_dual  post-LN, d += F; stack output x_N + LN(d_N)           Xie et al. 2023
dlcl       pre-LN; layer input sum_k W_k LN(y_k)                 Wang et al. 2019
dlcl_post  post-LN; layer input LN(sum_k W_k y_k)                Wang et al. 2019
=========  ====================================================  ==========================

Every normalization a kind owns is ``--normalization`` (LayerNorm, RMSNorm or DyT;
:mod:`resnmt.modules.norms`). The last four kinds cross layers: B2T's last connection of
a layer also reads the layer's input (``reads_layer_input``); ResiDual and DLCL add a
:class:`~resnmt.modules.streams.ResidualStream` that the stack carries from layer to
layer (``build_stream``).
"""
import argparse
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Tuple, Type

import torch
from torch import Tensor, nn

from resnmt.modules.fused import fused_sas_output, require_compile
from resnmt.modules.gates import ScalarGates
from resnmt.modules.streams import DLCLStream, ResiDualStream, ResidualStream
from resnmt.modules.norms import DEFAULT_DYT_ALPHA, DEFAULT_NORMALIZATION, NORMALIZATIONS, build_norm, is_layer_norm


class ConnectionConfigError(ValueError):
    """A connection option with a value outside what is allowed."""


# ---------------------------------------------------------------------------- flags


def positive(cast, allowed: str):
    """An argparse ``type``: ``cast(text)`` if that is > 0, else one error naming the value."""

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {allowed}")
        return value

    parse.allowed = allowed
    return parse


positive_float = positive(float, "a real number > 0")
positive_int = positive(int, "an integer > 0")


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a connection kind: ``--sas-gate-dim`` for ``dest`` sas_gate_dim.

    Declared without an argparse default (fairseq parses model flags with
    ``argparse.SUPPRESS``); ``default`` fills in what the command line and the arch left
    unset. ``check`` is the argparse ``type`` for values (its ``allowed`` text is reused in
    the error of a programmatic ConnectionSpec); ``choices`` limits the values; a ``switch``
    is a store_true flag. ``owners_only``: setting it with a kind that does not list this
    flag is an error (``hint`` says why).
    """

    dest: str
    default: Any
    help: str
    check: Optional[Callable[[str], Any]] = None
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None
    switch: bool = False
    owners_only: bool = False
    hint: str = ""

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")

    def add_to(self, parser) -> None:
        if self.switch:
            parser.add_argument(self.option, action="store_true", help=self.help)
            return
        kwargs = dict(help=self.help)
        if self.check is not None:
            kwargs["type"] = self.check
        if self.choices is not None:
            kwargs["choices"] = self.choices
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        parser.add_argument(self.option, **kwargs)

    def validate(self, value: Any) -> None:
        """The checks argparse makes, for a spec built in Python."""
        if value is None:
            return
        if self.choices is not None and value not in self.choices:
            raise ConnectionConfigError(f"{self.option} {value!r}: choose one of {', '.join(self.choices)}")
        allowed = getattr(self.check, "allowed", None)
        if allowed is not None and not value > 0:
            raise ConnectionConfigError(f"{self.option} {_shown(value)} is invalid: it must be {allowed}")


@dataclass(frozen=True)
class Statistic:
    """What ``resnmt-analyze`` and ``--log-connection-stats`` report for a connection:
    ``name`` (analysis.json, PNG file), ``log_key`` (training log), a one-line
    ``description`` (``"what: meaning"``), the plot's ``axis_label``, and whether the
    value lies in [0, 1] (plotted on that range)."""

    name: str
    log_key: str
    description: str
    axis_label: str
    unit_interval: bool = False


# ---------------------------------------------------------------------------- the spec


class ConnectionSpec:
    """Everything needed to build one side's connections; resolved from the model args,
    immutable, and validated once, here.

    Args:
        kind: a registered connection kind (``CONNECTION_KINDS``).
        side: "encoder" or "decoder" (DeepNorm's and Admin's constants depend on it).
        encoder_layers, decoder_layers: the stacks' depths N and M.
        export: fairseq's ``--export`` (use torch's LayerNorm).
        fused: ``--fused-connections`` (SAS's combination compiled, :mod:`resnmt.modules.fused`).
        normalization: ``--normalization`` (:mod:`resnmt.modules.norms`): what every norm
            the connections and the stack own is (layer_norm, rms_norm or dyt).
        dyt_alpha_init: ``--dyt-alpha-init``, DyT's initial alpha.
        **options: values of the kinds' flags by ``dest`` (``skip_lambda=2.0``,
            ``sas_gate_dim=64``, ...); a flag left out takes its default.
    """

    __slots__ = ("kind", "side", "encoder_layers", "decoder_layers", "export", "fused", "normalization",
                 "dyt_alpha_init", "options")

    def __init__(self, kind: str = "post_ln", *, side: str = "encoder", encoder_layers: int = 6,
                 decoder_layers: int = 6, export: bool = False, fused: bool = False,
                 normalization: str = DEFAULT_NORMALIZATION, dyt_alpha_init: float = DEFAULT_DYT_ALPHA, **options):
        unknown = sorted(set(options) - set(CONNECTION_FLAGS))
        if unknown:
            raise TypeError(f"ConnectionSpec got unknown options {unknown}; flags are {sorted(CONNECTION_FLAGS)}")
        values = {dest: flag.default for dest, flag in CONNECTION_FLAGS.items()}
        values.update({k: v for k, v in options.items() if v is not None or CONNECTION_FLAGS[k].default is None})
        for name, value in (("kind", kind), ("side", side), ("encoder_layers", int(encoder_layers)),
                            ("decoder_layers", int(decoder_layers)), ("export", bool(export)),
                            ("fused", bool(fused)), ("normalization", normalization),
                            ("dyt_alpha_init", float(dyt_alpha_init)), ("options", tuple(sorted(values.items())))):
            object.__setattr__(self, name, value)
        check_connection_spec(self)

    def __getattr__(self, name: str):
        if name in CONNECTION_FLAGS:
            return dict(object.__getattribute__(self, "options"))[name]
        raise AttributeError(f"ConnectionSpec has no attribute {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError("ConnectionSpec is immutable")

    def __reduce__(self):  # copy, deepcopy and pickle rebuild (and re-validate) through __init__
        return (_rebuild_spec, (self.kind, self.side, self.encoder_layers, self.decoder_layers, self.export,
                                self.fused, dict(self.options), self.normalization, self.dyt_alpha_init))

    def _key(self):
        return (self.kind, self.side, self.encoder_layers, self.decoder_layers, self.export, self.fused,
                self.normalization, self.dyt_alpha_init, self.options)

    def __eq__(self, other) -> bool:
        return isinstance(other, ConnectionSpec) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        own = {flag.dest for flag in connection_class(self.kind).flags} if self.kind in CONNECTION_CLASSES else set()
        shown = ", ".join(f"{k}={v!r}" for k, v in self.options if k in own)
        norm = "" if self.normalization == DEFAULT_NORMALIZATION else f", normalization={self.normalization!r}"
        return (f"ConnectionSpec(kind={self.kind!r}, side={self.side!r}, layers={self.encoder_layers}+"
                f"{self.decoder_layers}{norm}{', ' + shown if shown else ''})")

    def norm(self, dim: int) -> nn.Module:
        """A new normalization of ``dim`` features, of this spec's ``--normalization``."""
        return build_norm(dim, self.normalization, export=self.export, dyt_alpha_init=self.dyt_alpha_init)

    @property
    def has_final_norm(self) -> bool:
        """Whether the stack ends with a LayerNorm (pre-LN: fairseq's normalize_before)."""
        return connection_class(self.kind).final_norm

    @property
    def num_sublayers(self) -> int:
        """Residual sublayers in this side's stack: 2N (encoder) or 3M (decoder)."""
        return 2 * self.encoder_layers if self.side == "encoder" else 3 * self.decoder_layers


def _rebuild_spec(kind, side, encoder_layers, decoder_layers, export, fused, options,
                  normalization=DEFAULT_NORMALIZATION, dyt_alpha_init=DEFAULT_DYT_ALPHA) -> ConnectionSpec:
    return ConnectionSpec(kind, side=side, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
                          export=export, fused=fused, normalization=normalization, dyt_alpha_init=dyt_alpha_init,
                          **options)


def check_connection_spec(spec: ConnectionSpec) -> None:
    """Raise ConnectionConfigError naming the flag, the value and what is allowed."""
    if spec.kind not in CONNECTION_CLASSES:
        raise ConnectionConfigError(
            f"--residual {spec.kind!r} is not a connection kind; choose one of {', '.join(CONNECTION_KINDS)}"
        )
    if spec.side not in ("encoder", "decoder"):
        raise ConnectionConfigError(f"connection side {spec.side!r}: choose encoder or decoder")
    cls = connection_class(spec.kind)
    if spec.normalization not in NORMALIZATIONS:
        raise ConnectionConfigError(
            f"--normalization {spec.normalization!r}: choose one of {', '.join(NORMALIZATIONS)}"
        )
    if spec.normalization != DEFAULT_NORMALIZATION and not cls.normalized:
        raise ConnectionConfigError(
            f"--normalization {spec.normalization} is invalid for --residual {spec.kind}: it has no normalization "
            f"to replace (kinds with one: {', '.join(k for k, c in CONNECTION_CLASSES.items() if c.normalized)})"
        )
    if not spec.dyt_alpha_init > 0:
        raise ConnectionConfigError(f"--dyt-alpha-init {spec.dyt_alpha_init:g} is invalid: it must be a real number > 0")
    cls.check_spec(spec)  # the kind's own rules first: their messages name the kind
    for flag in cls.flags:
        flag.validate(getattr(spec, flag.dest))
    check_flags_used([spec.kind], {dest: getattr(spec, dest) for dest in CONNECTION_FLAGS})


def check_flags_used(kinds, values: Mapping[str, Any]) -> None:
    """Flags of other kinds are ignored, except ``owners_only`` ones: set to a
    non-default value while none of ``kinds`` (the encoder's and decoder's) takes it,
    they are an error."""
    for flag in CONNECTION_FLAGS.values():
        if not flag.owners_only or values.get(flag.dest, flag.default) in (None, flag.default):
            continue
        if not any(flag in CONNECTION_CLASSES[kind].flags for kind in kinds):
            owners = ", ".join(k for k, c in CONNECTION_CLASSES.items() if flag in c.flags)
            raise ConnectionConfigError(
                f"{flag.option} is invalid for --residual {'/'.join(dict.fromkeys(kinds))}: "
                f"it applies only to {owners}{flag.hint}"
            )


# ---------------------------------------------------------------------------- base class and registry

# roles of the projections a layer hands to ``initialize_sublayer``
QUERY, KEY, VALUE, OUTPUT, FFN_IN, FFN_OUT = "query", "key", "value", "output", "ffn_in", "ffn_out"


class SublayerConnection(nn.Module):
    """Base class. ``prenorm(x)`` is what the sublayer reads; ``forward(x, fx)`` is the output.

    Class attributes a kind sets (read by the flags, the archs and the analysis):

    * ``kind``, ``equation``, ``source``: its ``--residual`` name and help;
    * ``flags``: its :class:`Flag` s (shared flags are the same object in several kinds);
    * ``final_norm``: the stack ends with a LayerNorm (pre-LN);
    * ``statistics``: the :class:`Statistic` s :meth:`measure` returns;
    * ``arch_family``, ``arch_options``: named archs ``transformer_<family>_{base,big}``
      and the flag values they choose (no family: no named arch);
    * ``normalized``: the kind owns normalizations (``--normalization`` replaces them);
    * ``reads_layer_input``: :meth:`forward` of the layer's last sublayer also takes the
      layer's input (B2T);
    * :meth:`build_stream`: the :class:`~resnmt.modules.streams.ResidualStream` the stack
      carries from layer to layer besides ``x`` (ResiDual, DLCL; None: plain stacking).
    """

    kind: ClassVar[str]
    equation: ClassVar[str]
    source: ClassVar[str]
    flags: ClassVar[Tuple[Flag, ...]] = ()
    final_norm: ClassVar[bool] = False
    statistics: ClassVar[Tuple[Statistic, ...]] = ()
    arch_family: ClassVar[Optional[str]] = None
    arch_options: ClassVar[Mapping[str, Any]] = {}
    normalized: ClassVar[bool] = True
    reads_layer_input: ClassVar[bool] = False

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        """Kind-specific checks beyond each flag's own (raise ConnectionConfigError)."""

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        """The stack's residual stream for this kind; None: the layers are simply stacked."""
        return None

    @classmethod
    def crosses_layers(cls) -> bool:
        """Whether the kind's stack carries a residual stream (overrides :meth:`build_stream`)."""
        return cls.build_stream.__func__ is not SublayerConnection.build_stream.__func__

    def prenorm(self, x: Tensor) -> Tensor:
        return x

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


CONNECTION_CLASSES: Dict[str, Type[SublayerConnection]] = {}
CONNECTION_FLAGS: Dict[str, Flag] = {}  # dest -> flag, over every registered kind


def register_connection(cls: Type[SublayerConnection]) -> Type[SublayerConnection]:
    """Class decorator: add ``cls`` to the registry under ``cls.kind``."""
    if cls.kind in CONNECTION_CLASSES:
        raise ValueError(f"connection kind {cls.kind!r} registered twice")
    for flag in cls.flags:
        known = CONNECTION_FLAGS.setdefault(flag.dest, flag)
        if known is not flag:
            raise ValueError(f"{flag.option} is declared twice with different definitions")
    CONNECTION_CLASSES[cls.kind] = cls
    return cls


def connection_class(kind: str) -> Type[SublayerConnection]:
    return CONNECTION_CLASSES[kind]


# ---------------------------------------------------------------------------- shared flags and helpers

SKIP_LAMBDA = Flag(
    "skip_lambda", 2.0, check=positive_float, metavar="LAMBDA",
    help="skip scale: the real lambda > 0 of xskip/xskip_ln (lambda*x), or the integer lambda >= 1 of "
    "rskip_ln (number of LNs; 1 is post_ln) (default: 2, the rSkip paper's best)",
)
SKIP_LAMBDA_LEARNED = Flag(
    "skip_lambda_learned", False, switch=True, owners_only=True,
    hint=" (a real lambda; rskip_ln's lambda is an integer count of LayerNorms)",
    help="xskip/xskip_ln: learn lambda as a per-dimension vector initialised to --skip-lambda "
    "(the rSkip paper's learned-lambda variant, LN(w*x+F)) (default: a fixed scalar)",
)

SKIP_RATIO = Statistic(
    "skip_ratio", "skip_ratio", "skip:residual norm ratio ||lambda*x|| / ||F||", "||lambda (.) x|| / ||F||"
)


def layer_norm_sigma(norm, z: Tensor) -> Tensor:
    """What ``norm`` divides ``z - mean`` by: ``sqrt(Var[z] + eps)`` over features
    (biased variance, the LayerNorm's own eps), shape ``z.shape[:-1]``."""
    z = z.float()
    return torch.sqrt(z.var(dim=-1, unbiased=False) + float(norm.eps))


def per_position(value: Tensor, like: Tensor) -> Tensor:
    """A per-sublayer number broadcast to every position of ``like`` ``(seq_len, batch, dim)``."""
    return value.detach().float().expand(like.shape[:-1])


# ---------------------------------------------------------------------------- the kinds


@register_connection
class PostLNConnection(SublayerConnection):
    """``LN(x + F)``: the original Transformer (fairseq's default)."""

    kind = "post_ln"
    equation = "LN(x+F)"
    source = "Vaswani et al. 2017"
    arch_family = "postln"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = spec.norm(dim)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.norm(x + fx)


@register_connection
class PreLNConnection(SublayerConnection):
    """``x + F(LN(x))``: the identity path stays free of normalization."""

    kind = "pre_ln"
    equation = "x+F(LN(x)) and a final LN"
    source = "He et al. 2016"
    final_norm = True
    arch_family = "preln"

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        self.norm = spec.norm(dim)

    def prenorm(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return x + fx


@register_connection
class XSkipConnection(SublayerConnection):
    """``s*x + F`` without normalization: s = lambda (the rSkip paper's ablation).

    The skip scale ``s`` is a constant (``skip_scale`` a float) or, when
    :meth:`learned_scale` says so, a learned per-dimension vector (``skip_scale`` a
    parameter) initialised to :meth:`initial_scale`. Subclasses change only those two
    (and whether a LayerNorm follows).
    """

    kind = "xskip"
    equation = "lambda*x+F"
    source = "rSkip eq.2"
    flags = (SKIP_LAMBDA, SKIP_LAMBDA_LEARNED)
    normalized = False
    statistics = (
        SKIP_RATIO,
        Statistic("skip_lambda", "skip_lambda", "learned lambda: skip scale, mean over features", "mean lambda"),
    )

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__()
        initial = float(self.initial_scale(spec))
        if self.learned_scale(spec):
            self.skip_scale = nn.Parameter(torch.full((dim,), initial))
        else:
            self.skip_scale = initial

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        if not spec.skip_lambda > 0:
            raise ConnectionConfigError(
                f"--skip-lambda {spec.skip_lambda:g} is invalid for --residual {spec.kind}: it must be a real number > 0"
            )

    @staticmethod
    def initial_scale(spec: ConnectionSpec) -> float:
        return spec.skip_lambda

    @staticmethod
    def learned_scale(spec: ConnectionSpec) -> bool:
        return spec.skip_lambda_learned

    @property
    def learned(self) -> bool:
        return isinstance(self.skip_scale, nn.Parameter)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.scaled_sum(x, fx)

    def scaled_sum(self, x: Tensor, fx: Tensor) -> Tensor:
        if self.learned:
            return torch.addcmul(fx, x, self.skip_scale.to(x.dtype))
        # one fused pass (fx + lambda * x) instead of a scaled copy of x and then a sum
        return torch.add(fx, x, alpha=self.skip_scale)

    def measured_statistics(self) -> Tuple[Statistic, ...]:
        return self.statistics if self.learned else self.statistics[:1]

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """The skip:residual ratio ``||s (.) x|| / ||F||`` per position (norms over
        features), and with a learned scale its mean over features."""
        scale = self.skip_scale.detach().float() if self.learned else self.skip_scale
        skip = torch.linalg.vector_norm(x.float() * scale, dim=-1)
        residual = torch.linalg.vector_norm(fx.float(), dim=-1).clamp(min=1e-12)
        out = {SKIP_RATIO.name: skip / residual}
        if self.learned:
            out[self.statistics[1].name] = per_position(self.skip_scale.mean(), x)
        return out

    def extra_repr(self) -> str:
        return "learned, dim={}".format(self.skip_scale.numel()) if self.learned else f"lambda={self.skip_scale:g}"


@register_connection
class XSkipLNConnection(XSkipConnection):
    """``LN(s*x + F)``: a scaled skip before the post-LN (rSkip paper eq. 3)."""

    kind = "xskip_ln"
    equation = "LN(lambda*x+F)"
    source = "rSkip eq.3"
    arch_family = "xskip"
    arch_options = {"skip_lambda": 2.0}
    normalized = True

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        self.norm = spec.norm(dim)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.norm(self.scaled_sum(x, fx))


@register_connection
class RSkipLNConnection(SublayerConnection):
    """Recursive skip: ``y1 = LN1(x + F)``, ``yk = LNk(x + y_{k-1})``, output ``y_lambda``.

    Each step adds the input again behind its own LayerNorm (rSkip paper eq. 4); with
    lambda = 1 this is post-LN.
    """

    kind = "rskip_ln"
    equation = "y1=LN1(x+F), yk=LNk(x+y_{k-1})"
    source = "rSkip eq.4"
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


SAS_GATE_FORMS = ("two_layer", "single_layer")
SAS_GAMMA_FORMS = ("product", "gate")


@register_connection
class SASConnection(SublayerConnection):
    """Self-adaptive scaling: ``alpha*x + beta*F + gamma*LN(x + F)`` (SAS paper eq. 3/4).

    alpha and beta are per-position scalars from two gates on ``[x; F]``; gamma is
    ``(1-alpha)(1-beta)`` (eq. 4, the paper's default) or a third gate (eq. 3).
    """

    kind = "sas"
    equation = "alpha*x+beta*F+gamma*LN(x+F)"
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
        self._output = self._fused_output if spec.fused else self._eager_output

    def gate_values(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """alpha, beta, gamma, each ``(seq_len, batch, 1)``."""
        gates = self.gates(x, fx)  # S([x; F]) without building [x; F]
        alpha, beta = gates[..., 0:1], gates[..., 1:2]
        gamma = gates[..., 2:3] if self.gamma_from_gate else (1 - alpha) * (1 - beta)
        return {"alpha": alpha, "beta": beta, "gamma": gamma}

    def combine(self, x: Tensor, fx: Tensor, alpha: Tensor, beta: Tensor, gamma: Tensor) -> Tensor:
        return alpha * x + beta * fx + gamma * self.norm(x + fx)

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return self._output(x, fx)

    def _eager_output(self, x: Tensor, fx: Tensor) -> Tensor:
        return self.combine(x, fx, **self.gate_values(x, fx))

    def measure(self, x: Tensor, fx: Tensor) -> Dict[str, Tensor]:
        """alpha, beta and gamma per position: whatever the connection multiplies x, F and
        LN(x+F) by (gamma is (1-alpha)(1-beta), or the third gate with --sas-gamma gate)."""
        return {f"sas_{name}": value.squeeze(-1).float() for name, value in self.gate_values(x, fx).items()}

    def _fused_output(self, x: Tensor, fx: Tensor) -> Tensor:
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
    equation = "t*F+(1-t)*x, t=sigmoid(x W_T+b_T)"
    source = "Srivastava 2015"
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
class DeepNormConnection(XSkipLNConnection):
    """DeepNorm: ``LN(alpha*x + F)`` with the sublayer's value/output projections and FFN
    initialised Xavier-normal with gain beta, query/key with gain 1 (DeepNet, Wang et al.
    2022, Figure 2). alpha and beta follow the stack depths (:func:`deepnorm_constants`)."""

    kind = "deepnorm"
    equation = "LN(alpha*x+F), alpha,beta(N,M) and beta-scaled Xavier init"
    source = "Wang et al. 2022, arXiv:2203.00555"
    flags = ()
    statistics = (SKIP_RATIO,)
    arch_family = "deepnorm"
    arch_options = {}
    UNSCALED_ROLES = (QUERY, KEY)

    def __init__(self, dim: int, spec: ConnectionSpec):
        self.alpha, self.beta = deepnorm_constants(spec.side, spec.encoder_layers, spec.decoder_layers)
        super().__init__(dim, spec)

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        pass

    def initial_scale(self, spec: ConnectionSpec) -> float:
        return self.alpha

    @staticmethod
    def learned_scale(spec: ConnectionSpec) -> bool:
        return False

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
    equation = "x+a*F, a a learned scalar from 0, no LN"
    source = "Bachlechner et al. 2020, arXiv:2003.04887"
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
class AdminConnection(XSkipLNConnection):
    """Admin: ``LN(omega (.) x + F)`` with omega a learned per-dimension vector (Liu et al.
    2020, EMNLP, arXiv:2004.08249), initialised without the profiling pass as admin-torch
    does (:func:`admin_omega`, n = the side's residual sublayers: 2N encoder, 3M decoder)."""

    kind = "admin"
    equation = "LN(omega*x+F), omega a learned vector from omega0(n)"
    source = "Liu et al. 2020, EMNLP, arXiv:2004.08249"
    flags = (
        Flag("admin_output_change_scale", "O(logn)", choices=ADMIN_OUTPUT_CHANGE_SCALES, metavar="SCALE",
             help="Admin's target output change at init, which sets omega0 for n residual sublayers "
             "(2N encoder, 3M decoder): O(logn) = sqrt((n+1)/ln(n+1)-1) (admin-torch's default), "
             "O(n) = 1 (post-LN), O(1) = sqrt(n) (default: O(logn))"),
    )
    statistics = (
        SKIP_RATIO,
        Statistic("admin_omega", "admin_omega", "Admin omega: skip scale, mean over features", "mean omega"),
    )
    arch_family = "admin"
    arch_options = {}

    @classmethod
    def check_spec(cls, spec: ConnectionSpec) -> None:
        pass

    @staticmethod
    def initial_scale(spec: ConnectionSpec) -> float:
        return admin_omega(spec.num_sublayers, spec.admin_output_change_scale)

    @staticmethod
    def learned_scale(spec: ConnectionSpec) -> bool:
        return True


@register_connection
class PeriLNConnection(SublayerConnection):
    """Peri-LN: ``x + LN_out(F(LN_in(x)))`` and a final LN after the stack: the sublayer's
    input and output are normalized, the identity path is not (Kim et al. 2025,
    arXiv:2502.02732)."""

    kind = "peri_ln"
    equation = "x+LN_out(F(LN_in(x))) and a final LN"
    source = "Kim et al. 2025, arXiv:2502.02732"
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


@register_connection
class B2TConnection(PostLNConnection):
    """B2T, bottom-to-top: post-LN whose layer's last LN also receives the layer's input
    ``x_0``: ``h = LN(x_0 + F_1(x_0))`` ... and ``y = LN(h + F_last(h) + x_0)`` (encoder: after
    self-attention and FFN; decoder: after self-, cross-attention and FFN) (Takase et al.,
    Findings of ACL 2023, arXiv:2206.00330). With ``--b2t-rescale-init`` every projection
    of the layer starts scaled by ``L^-0.5`` (L the side's layers), the paper's option for
    deep stacks."""

    kind = "b2t"
    equation = "post-LN, last LN of a layer LN(h+F(h)+x_layer_input)"
    source = "Takase et al. 2023, Findings of ACL, arXiv:2206.00330"
    flags = (
        Flag("b2t_rescale_init", False, switch=True, owners_only=True,
             help="b2t: scale every attention and FFN projection's initial weights by L^-0.5, L the side's "
             "layers (the B2T paper's rescaling for deep stacks) (default: fairseq's init)"),
    )
    arch_family = "b2t"
    reads_layer_input = True

    def __init__(self, dim: int, spec: ConnectionSpec):
        super().__init__(dim, spec)
        layers = spec.encoder_layers if spec.side == "encoder" else spec.decoder_layers
        self.rescale = layers ** -0.5 if spec.b2t_rescale_init else None

    def forward(self, x: Tensor, fx: Tensor, layer_input: Optional[Tensor] = None) -> Tensor:
        if layer_input is None:
            return self.norm(x + fx)
        return self.norm(x + fx + layer_input)

    def initialize_sublayer(self, projections: Mapping[str, nn.Module]) -> None:
        if self.rescale is None:
            return
        with torch.no_grad():
            for linear in projections.values():
                linear.weight.mul_(self.rescale)


RESI_DUAL_FLAGS = (
    Flag("resi_dual_scale", 1.0, check=positive_float, metavar="S",
         help="resi_dual: scale s of the dual stream, d_0 = s*x_0, d_{k+1} = d_k + s*F_k (default: 1, the paper's)"),
    Flag("resi_dual_alpha", 1.0, check=float, metavar="A",
         help="resi_dual: the stack's output alpha*x_N + LN(d_N) (default: 1, the paper's)"),
)


@register_connection
class ResiDualConnection(PostLNConnection):
    """ResiDual: post-LN sublayers plus an unnormalized dual stream that adds up the same
    sublayer outputs; the stack's output is ``alpha*x_N + LN(d_N)``
    (:class:`~resnmt.modules.streams.ResiDualStream`; Xie et al. 2023, arXiv:2304.14802)."""

    kind = "resi_dual"
    equation = "x_{k+1}=LN(x_k+F_k), d_{k+1}=d_k+F_k, output x_N+LN(d_N)"
    source = "Xie et al. 2023, arXiv:2304.14802"
    flags = RESI_DUAL_FLAGS
    arch_family = "resi_dual"

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return ResiDualStream(spec.norm(dim), spec.resi_dual_scale, spec.resi_dual_alpha)


def stream_norms(dim: int, spec: ConnectionSpec):
    """One norm per layer of ``spec``'s side, for DLCL's stream."""
    layers = spec.encoder_layers if spec.side == "encoder" else spec.decoder_layers
    return [spec.norm(dim) for _ in range(layers)]


DLCL_WINDOW = Flag(
    "dlcl_window", None, check=positive_int, metavar="N",
    help="dlcl/dlcl_post: each layer combines only the N most recent of the earlier layers' outputs "
    "(the embedding counts as one) (default: all of them, the DLCL paper's)",
)


@register_connection
class DLCLConnection(PreLNConnection):
    """DLCL, pre-norm: pre-LN layers whose input is a learned linear combination of all
    earlier layers' normalized outputs, ``x_{l+1} = sum_{k<=l} W_k LN(y_k)``
    (:class:`~resnmt.modules.streams.DLCLStream`; Wang et al., ACL 2019, arXiv:1906.01787)."""

    kind = "dlcl"
    equation = "pre-LN layers, x_{l+1}=sum_k W[l+1,k] LN(y_k), W from the average"
    source = "Wang et al. 2019, ACL, arXiv:1906.01787"
    flags = (DLCL_WINDOW,)
    arch_family = "dlcl"

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return DLCLStream(stream_norms(dim, spec), pre_norm=True, window=spec.dlcl_window)


@register_connection
class DLCLPostConnection(PostLNConnection):
    """DLCL, post-norm: post-LN layers whose input is the normalized learned combination
    of all earlier layers' outputs, ``x_{l+1} = LN(sum_{k<=l} W_k y_k)``."""

    kind = "dlcl_post"
    equation = "post-LN layers, x_{l+1}=LN(sum_k W[l+1,k] y_k), W from the average"
    source = "Wang et al. 2019, ACL, arXiv:1906.01787"
    flags = (DLCL_WINDOW,)
    arch_family = "dlcl_post"

    @classmethod
    def build_stream(cls, dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
        return DLCLStream(stream_norms(dim, spec), pre_norm=False, window=spec.dlcl_window)


CONNECTION_KINDS = tuple(CONNECTION_CLASSES)


def build_connection(dim: int, spec: ConnectionSpec) -> SublayerConnection:
    """The one place that chooses among connection kinds."""
    return CONNECTION_CLASSES[spec.kind](dim, spec)


def build_stream(dim: int, spec: ConnectionSpec) -> Optional[ResidualStream]:
    """The residual stream of ``spec``'s stack (None: fairseq's plain stacking)."""
    return CONNECTION_CLASSES[spec.kind].build_stream(dim, spec)
