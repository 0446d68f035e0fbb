"""The connection kinds' registry and one side's resolved, validated spec.

This is the flag/spec layer of the connections, apart from their ``nn`` code: what a kind
declares beside its equation (its :class:`~resnmt.options.Option` s, the
:class:`Statistic` s it measures), the registry that maps ``--residual`` names to kind
classes (:func:`register_connection`), and :class:`ConnectionSpec`, everything one side's
connections are built from, checked once, when it is made.
"""
import copy
import sys
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from torch import nn

from resnmt.connections.norms import (
    DEFAULT_DYT_ALPHA,
    DEFAULT_NORMALIZATION,
    DYT_ALPHA_INIT,
    NORMALIZATION,
    build_norm,
)
from resnmt.options import Option, OptionError

SIDES = ("encoder", "decoder")


class ConnectionConfigError(OptionError):
    """A connection option with a value outside what is allowed, or a kind that cannot be had."""


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


# ---------------------------------------------------------------------------- the registry

CONNECTION_CLASSES: Dict[str, Type[nn.Module]] = {}  # --residual name -> kind class, in registration order
CONNECTION_FLAGS: Dict[str, Option] = {}  # dest -> flag, over every registered kind
BUILTIN_PACKAGE = "resnmt.connections."  # a kind whose class lives here is built in; any other is the user's


FILE_MODULE_PREFIX = "resnmt_user_connections_"  # the module of a kind loaded from a .py file


def origin(cls) -> str:
    """Where the kind class ``cls`` comes from: its module, or the file it was loaded from."""
    module = sys.modules.get(cls.__module__)
    if cls.__module__.startswith(FILE_MODULE_PREFIX) and getattr(module, "__file__", None):
        return module.__file__
    return cls.__module__


def is_builtin(cls) -> bool:
    """Whether the kind class ``cls`` is one of resnmt's own (defined in this package)."""
    return cls.__module__.startswith(BUILTIN_PACKAGE)


def register_connection(cls):
    """Class decorator: add a kind class (a ``SublayerConnection``) under ``cls.kind``.

    The built-in kinds and the user's (a module or package outside resnmt:
    :mod:`resnmt.connections.plugins`) register alike; a user's kind may not take a built-in
    kind's name, nor a name another module registered (ConnectionConfigError, one line)."""
    known = CONNECTION_CLASSES.get(cls.kind)
    if known is not None:
        if is_builtin(known) and not is_builtin(cls):
            raise ConnectionConfigError(
                f"connection kind {cls.kind!r} of module {origin(cls)} clashes with the built-in kind "
                f"{cls.kind}: give it another name")
        raise ConnectionConfigError(
            f"connection kind {cls.kind!r} registered twice: by {origin(known)} and by {origin(cls)}")
    for flag in cls.flags:  # every flag checked before any is added: a refused kind leaves nothing behind
        if CONNECTION_FLAGS.get(flag.dest, flag) is not flag:
            raise ConnectionConfigError(
                f"{flag.flag} of connection kind {cls.kind!r} ({origin(cls)}) is already a flag of another kind "
                "with a different definition: give it another name, or reuse that kind's Option")
    for flag in cls.flags:
        CONNECTION_FLAGS.setdefault(flag.dest, flag)
    CONNECTION_CLASSES[cls.kind] = cls
    return cls


def connection_class(kind: str):
    """The class registered as ``kind``. The look-up of a name not registered first imports the
    user's modules named by ``RESNMT_CONNECTIONS`` (:func:`resnmt.connections.plugins.load_user_kinds`);
    a name still unknown is one ConnectionConfigError line."""
    if kind not in CONNECTION_CLASSES:
        from resnmt.connections.plugins import load_user_kinds

        load_user_kinds()
    if kind not in CONNECTION_CLASSES:
        raise ConnectionConfigError(
            f"--residual {kind!r} is not a connection kind; choose one of {', '.join(CONNECTION_CLASSES)}")
    return CONNECTION_CLASSES[kind]


# ---------------------------------------------------------------------------- the spec

# a layer's sublayers in order, by side: the sublayer index k in the stack is
# layer_index * len(side's tuple) + position (multi-stream kinds start reading stream k mod n)
SUBLAYERS = {"encoder": ("self_attn", "ffn"), "decoder": ("self_attn", "encoder_attn", "ffn")}


@dataclass(frozen=True, init=False, repr=False)
class ConnectionSpec:
    """Everything one side's connections, stream and final norm are built from: immutable,
    and validated once, here.

    Args:
        kind: a registered connection kind (``CONNECTION_KINDS``).
        side: "encoder" or "decoder" (DeepNorm's and Admin's constants depend on it).
        encoder_layers, decoder_layers: the stacks' depths N and M.
        export: fairseq's ``--export`` (use torch's LayerNorm).
        fused: ``--fused-connections`` (SAS's combination compiled, :mod:`resnmt.training.compile`).
        normalization: ``--normalization`` (:mod:`resnmt.connections.norms`): what every norm
            the connections, the stream and the stack own is (layer_norm, rms_norm or dyt).
        dyt_alpha_init: ``--dyt-alpha-init``, DyT's initial alpha.
        no_final_norm: fairseq's ``--no-decoder-final-norm`` (the decoder side only).
        layer_index: the layer a connection is built for (0-based; :meth:`at_layer`),
            None for the side as a whole. A kind whose form depends on the layer reads it.
        sublayer: the sublayer a connection is built for (``SUBLAYERS``: self_attn,
            encoder_attn, ffn; :meth:`at_sublayer`), None where not given.
        **options: values of the kinds' flags by ``dest`` (``skip_lambda=2.0``,
            ``sas_gate_dim=64``, ...); a flag left out takes its default. They are kept,
            every registered flag's, in ``options`` (``(dest, value)`` pairs, sorted) and
            read as attributes (``spec.skip_lambda``).
    """

    kind: str = "post_ln"
    side: str = "encoder"
    encoder_layers: int = 6
    decoder_layers: int = 6
    export: bool = False
    fused: bool = False
    normalization: str = DEFAULT_NORMALIZATION
    dyt_alpha_init: float = DEFAULT_DYT_ALPHA
    no_final_norm: bool = False
    layer_index: Optional[int] = None
    sublayer: Optional[str] = None
    options: Tuple[Tuple[str, Any], ...] = ()

    def __init__(self, kind: str = "post_ln", **given):
        settings = {name: given.pop(name, default) for name, default in setting_defaults().items()}
        unknown = sorted(set(given) - set(CONNECTION_FLAGS))
        if unknown:
            raise TypeError(f"ConnectionSpec got unknown options {unknown}; flags are {sorted(CONNECTION_FLAGS)}")
        values = {dest: flag.default for dest, flag in CONNECTION_FLAGS.items()}
        values.update({k: v for k, v in given.items() if v is not None or CONNECTION_FLAGS[k].default is None})
        for name, value in settings.items():
            cast = self.__dataclass_fields__[name].type
            if cast in (int, bool, float):  # the numbers and switches, whatever type they came as
                settings[name] = cast(value)
        self._set(kind=kind, **settings, options=tuple(sorted(values.items())))
        check_connection_spec(self)

    def _set(self, **values) -> None:
        """Set fields (and the flags' values as attributes, from ``options``) of a spec in the making."""
        for name, value in values.items():
            object.__setattr__(self, name, value)
        for dest, value in values.get("options", ()):
            object.__setattr__(self, dest, value)

    def settings(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in setting_defaults()}

    def __repr__(self) -> str:
        own = {flag.dest for flag in connection_class(self.kind).flags} if self.kind in CONNECTION_CLASSES else set()
        shown = ", ".join(f"{k}={v!r}" for k, v in self.options if k in own)
        norm = "" if self.normalization == DEFAULT_NORMALIZATION else f", normalization={self.normalization!r}"
        layer = "" if self.layer_index is None else f", layer_index={self.layer_index}"
        layer += "" if self.sublayer is None else f", sublayer={self.sublayer!r}"
        return (f"ConnectionSpec(kind={self.kind!r}, side={self.side!r}, layers={self.encoder_layers}+"
                f"{self.decoder_layers}{norm}{layer}{', ' + shown if shown else ''})")

    def _derived(self, **changes) -> "ConnectionSpec":
        """A copy with ``changes`` to its settings (already validated: no check again)."""
        spec = copy.copy(self)
        spec._set(**changes)
        return spec

    def at_layer(self, index: int) -> "ConnectionSpec":
        """This spec for the connections of layer ``index``."""
        return self._derived(layer_index=int(index))

    def at_sublayer(self, name: str) -> "ConnectionSpec":
        """This spec for the connection of sublayer ``name`` of its layer."""
        if name not in SUBLAYERS[self.side]:
            raise ValueError(f"{self.side} layers have no sublayer {name!r}: {', '.join(SUBLAYERS[self.side])}")
        return self._derived(sublayer=name)

    @property
    def sublayer_index(self) -> int:
        """The sublayer's index k in its stack, every sublayer counted from 0 (encoder layer
        l: 2l, 2l+1; decoder layer l: 3l, 3l+1 cross-attention, 3l+2); 0 where the layer or
        sublayer is not given (a connection built for the side as a whole)."""
        if self.layer_index is None or self.sublayer is None:
            return 0
        order = SUBLAYERS[self.side]
        return self.layer_index * len(order) + order.index(self.sublayer)

    @property
    def last_of_layer(self) -> bool:
        """Whether the connection is its layer's last (the FFN's, ``SUBLAYERS``), or one built
        for the side as a whole."""
        return self.sublayer is None or self.sublayer == SUBLAYERS[self.side][-1]

    def norm(self, dim: int) -> nn.Module:
        """A new normalization of ``dim`` features, of this spec's ``--normalization``."""
        return build_norm(dim, self.normalization, export=self.export, dyt_alpha_init=self.dyt_alpha_init)

    @property
    def layers(self) -> int:
        """This side's depth (N for the encoder, M for the decoder)."""
        return self.encoder_layers if self.side == "encoder" else self.decoder_layers

    @property
    def has_final_norm(self) -> bool:
        """Whether the stack ends with a norm (pre-LN; fairseq's ``normalize_before``): the
        kind's rule, unless fairseq's ``--no-decoder-final-norm`` removes it."""
        return connection_class(self.kind).final_norm and not self.no_final_norm

    @property
    def num_sublayers(self) -> int:
        """Residual sublayers in this side's stack: 2N (encoder) or 3M (decoder)."""
        return 2 * self.encoder_layers if self.side == "encoder" else 3 * self.decoder_layers

    @property
    def crosses_layers(self) -> bool:
        """Whether this side's stack carries a residual stream (its layers combine by position)."""
        return connection_class(self.kind).crosses_layers


def setting_defaults() -> Dict[str, Any]:
    """ConnectionSpec's settings besides the kind and the kinds' flags, with their defaults."""
    return {f.name: f.default for f in fields(ConnectionSpec) if f.name not in ("kind", "options")}


def _rebuild_spec(kind, settings, options) -> ConnectionSpec:
    """What a ConnectionSpec pickled by an earlier version of this module unpickles through."""
    return ConnectionSpec(kind, **settings, **options)


def check_connection_spec(spec: ConnectionSpec) -> None:
    """Raise ConnectionConfigError naming the flag, the value and what is allowed."""
    cls = connection_class(spec.kind)
    if spec.side not in SIDES:
        raise ConnectionConfigError(f"connection side {spec.side!r}: choose encoder or decoder")
    problem = NORMALIZATION.problem(spec.normalization)
    if problem:
        raise ConnectionConfigError(problem)
    if spec.normalization != DEFAULT_NORMALIZATION and not cls.normalized:
        raise ConnectionConfigError(
            f"--normalization {spec.normalization} is invalid for --residual {spec.kind}: it has no normalization "
            f"to replace (kinds with one: {', '.join(k for k, c in CONNECTION_CLASSES.items() if c.normalized)})"
        )
    problem = DYT_ALPHA_INIT.problem(spec.dyt_alpha_init)
    if problem:
        raise ConnectionConfigError(problem)
    cls.check_spec(spec)  # the kind's own rules first: their messages name the kind
    for flag in cls.flags:
        problem = flag.problem(getattr(spec, flag.dest))
        if problem:
            raise ConnectionConfigError(problem)
    check_flags_used([spec.kind], dict(spec.options))


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
                f"{flag.flag} is invalid for --residual {'/'.join(dict.fromkeys(kinds))}: "
                f"it applies only to {owners}{flag.hint}"
            )
