"""Forward hooks that measure connections and activations while a model runs.

:class:`StatsCollector` registers hooks on the connection and activation modules of a
``resnmt_transformer`` (nothing else: a model whose connections measure nothing and
that has no normalized activations gets no hook at all) and hands every measurement
to a *sink*. What a connection measures is its own class's ``measured_statistics()`` and
``measure(x, fx)`` (``resnmt.connections``); the hooks know no kind.
Sinks:

* :class:`Accumulator` (``resnmt-analyze``) sums values and counts over every real
  token seen, for token-weighted means over many batches;
* :class:`MetricsSink` (training, ``--log-connection-stats``) logs the batch means
  through ``fairseq.logging.metrics.log_scalar``.

Sites are named ``(side, layer, sublayer)`` with side ``"encoder"``/``"decoder"``, layer
the 0-based index in the stack and sublayer ``"self"``, ``"cross"`` (encoder-decoder
attention) or ``"ffn"``. The hooks compute their statistics under ``torch.no_grad`` from
the tensors the module was called with, so they never change the model's output or
gradients. Padding positions are excluded: each layer's padding mask is captured by a
forward pre-hook on the layer and read by the hooks of its sublayers.
"""
from collections import defaultdict
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from resnmt.activations.normalized import NormalizedActivation
from resnmt.analysis import statistics as S
from resnmt.connections import CONNECTION_CLASSES, Statistic, SublayerConnection

SIDES = ("encoder", "decoder")
SUBLAYERS = {  # connection attribute of a layer -> sublayer name
    "self_attn_connection": "self",
    "encoder_attn_connection": "cross",
    "ffn_connection": "ffn",
}
SUBLAYER_LABELS = {"self": "self-attention", "cross": "enc-dec attention", "ffn": "FFN", "output": "block output"}


def _connection_statistics() -> Dict[str, Statistic]:
    """Every statistic a registered connection kind reports, in registry order."""
    found: Dict[str, Statistic] = {}
    for cls in CONNECTION_CLASSES.values():
        for stat in cls.statistics:
            found.setdefault(stat.name, stat)
    return found


# statistic name -> Statistic (log key, description, plot label): the connections' own,
# then the FFN activations' gains and the block-output gradient norm
STATISTICS: Dict[str, Statistic] = {
    **_connection_statistics(),
    "act_rho": Statistic("act_rho", "act_rho", "activation forward gain rho", "rho = Var[f(h)] / Var[h]"),
    "act_rho_prime": Statistic("act_rho_prime", "act_rhop", "activation backward gain rho'", "rho' = P(h > 0)"),
    "act_lambda": Statistic("act_lambda", "act_lambda", "activation normalization factor lambda", "lambda"),
    "grad_norm": Statistic("grad_norm", "grad_norm", "gradient norm of the block output", "mean ||dL/dh_t|| per token"),
}
CONNECTION_STATISTICS = tuple(_connection_statistics())

Site = Tuple[str, int, str]
Sink = Callable[[Site, str, Tensor, Tensor], None]  # (site, statistic, sum, count)


def model_layers(model: nn.Module) -> Iterator[Tuple[str, int, nn.Module]]:
    """(side, index, layer) of every encoder and decoder layer of a fairseq
    encoder-decoder model."""
    for side in SIDES:
        stack = getattr(model, side, None)
        for i, layer in enumerate(getattr(stack, "layers", None) or []):
            yield side, i, layer


def side_kinds(model: nn.Module) -> Dict[str, str]:
    """The connection kind of each side, e.g. ``{"encoder": "sas", "decoder": "sas"}``."""
    kinds = {}
    for side in SIDES:
        spec = getattr(getattr(model, side, None), "connection_spec", None)
        if spec is not None:
            kinds[side] = spec.kind
    return kinds


class _MaskSlot:
    """The padding mask ``(batch, seq_len)`` (or None) of the layer now running."""

    def __init__(self):
        self.mask: Optional[Tensor] = None


def _padding_mask_from_call(side: str, args, kwargs) -> Optional[Tensor]:
    """The mask over the layer's own positions, from a layer's forward arguments."""
    if side == "encoder":
        mask = kwargs.get("encoder_padding_mask", args[1] if len(args) > 1 else None)
    else:
        mask = kwargs.get("self_attn_padding_mask")
    return mask


class StatsCollector:
    """Hooks on the connection/activation modules of ``model`` reporting to ``sink``.

    Args:
        model: a ``resnmt_transformer`` model (any fairseq encoder-decoder whose layers
            hold resnmt connections).
        sink: called as ``sink(site, statistic, sum, count)`` for each measurement, with
            ``sum`` and ``count`` 0-dim tensors over the real positions of the batch.
        training_only: measure only when the model is in training mode (the training
            logger: validation and generation are left alone).

    Use as a context manager or call :meth:`remove`.
    """

    def __init__(self, model: nn.Module, sink: Sink, training_only: bool = False):
        self.sink = sink
        self.training_only = training_only
        self.handles: List = []
        self.sites: Dict[str, List[Site]] = defaultdict(list)  # statistic -> sites measured
        for side, i, layer in model_layers(model):
            self._attach_layer(side, i, layer)

    # ------------------------------------------------------------------ registration
    def _attach_layer(self, side: str, index: int, layer: nn.Module) -> None:
        slot = _MaskSlot()
        measured = False
        for attr, sublayer in SUBLAYERS.items():
            conn = getattr(layer, attr, None)
            if not isinstance(conn, SublayerConnection) or not conn.measured_statistics():
                continue
            site = (side, index, sublayer)
            names = [stat.name for stat in conn.measured_statistics()]
            self._hook(conn, self._connection_hook(site, slot), names, site)
            measured = True
        act = getattr(layer, "ffn_activation", None)
        if isinstance(act, NormalizedActivation):
            site = (side, index, "ffn")
            self._hook(act, self._activation_hook(site), ("act_rho", "act_rho_prime", "act_lambda"), site)
            # the activation receives its padding mask directly
        if measured:
            def capture_mask(module, args, kwargs):
                slot.mask = _padding_mask_from_call(side, args, kwargs)

            self.handles.append(layer.register_forward_pre_hook(capture_mask, with_kwargs=True))

    def _hook(self, module: nn.Module, fn, statistics, site: Site) -> None:
        self.handles.append(module.register_forward_hook(fn))
        for name in statistics:
            self.sites[name].append(site)

    def _active(self, module: nn.Module) -> bool:
        return module.training or not self.training_only

    def _emit(self, site: Site, values: Dict[str, Tensor], mask: Optional[Tensor]) -> None:
        for name, per_position in values.items():
            total, count = S.masked_sum_count(per_position, mask)
            self.sink(site, name, total, count)

    # ------------------------------------------------------------------ hooks
    def _connection_hook(self, site: Site, slot: _MaskSlot):
        """What the connection's own ``measure(x, fx)`` returns, from its call's inputs."""

        def hook(module, inputs, output):
            if self._active(module):
                with torch.no_grad():
                    values = module.measure(*inputs)
                self._emit(site, values, slot.mask)

        return hook

    def _activation_hook(self, site: Site):
        def hook(module, inputs, output):
            if self._active(module):
                h = inputs[0]
                mask = inputs[1] if len(inputs) > 1 else None
                with torch.no_grad():
                    stats = S.activation_stats(module, h, mask)
                self._emit(site, {f"act_{k}": v for k, v in stats.items()}, mask)

        return hook

    # ------------------------------------------------------------------ lifetime
    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def __enter__(self) -> "StatsCollector":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class Accumulator:
    """A sink keeping token-weighted sums: ``means()`` gives, per statistic and site, the
    mean over every real position seen since the last ``reset()``."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sums: Dict[Tuple[str, Site], Tensor] = {}
        self.counts: Dict[Tuple[str, Site], Tensor] = {}

    def __call__(self, site: Site, name: str, total: Tensor, count: Tensor) -> None:
        key = (name, site)
        total, count = total.detach().double().cpu(), count.detach().double().cpu()
        if key in self.sums:
            self.sums[key] += total
            self.counts[key] += count
        else:
            self.sums[key], self.counts[key] = total.clone(), count.clone()

    def means(self) -> Dict[str, Dict[Site, float]]:
        out: Dict[str, Dict[Site, float]] = defaultdict(dict)
        for (name, site), total in self.sums.items():
            count = float(self.counts[(name, site)])
            out[name][site] = float(total) / count if count > 0 else float("nan")
        return dict(out)
