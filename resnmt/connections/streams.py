"""Residual streams: what a stack carries from layer to layer besides the hidden state ``x``.

A sublayer connection (:mod:`resnmt.connections`) sees one sublayer's ``x`` and
``F``. Methods that cross layers need more: ResiDual adds every sublayer's ``F`` into a
second, unnormalized stream; DLCL feeds each layer a learned combination of all earlier
layers' outputs. Such a method is a :class:`ResidualStream`, returned by its connection
kind's ``build_stream``, built once per stack, and driven by the one layer loop of both
stacks (``ResidualStack.run_layers``, :mod:`resnmt.models.encoder_decoder`)::

    state = stream.begin(x)                      # x: the embedded input (T, B, C)
    for i, layer in enumerate(layers):
        x, extra, residual_sum = layer(stream.layer_input(state, i, x), ...)
        state = stream.after_layer(state, i, x, residual_sum)   # residual_sum: the sum of
    x = stream.end(state, x)                     # the sublayers' dropout(F); then the final norm

The state is a tuple of tensors and every method is pure (it returns a new state), so
activation checkpointing recomputes the same values, and every operation is per
position, so one step of incremental decoding computes what the full forward computes at
that position. Kinds without a stream of their own get the base class, plain stacking.
What the stream hands a layer need not be ``(T, B, C)``: a stream may carry a wider
state (n copies of ``x``, say) that its kind's connections read and update; only
:meth:`ResidualStream.end` must return ``(T, B, C)``.

========  ===============================================================  =====================
stream    what it carries                                                  source
========  ===============================================================  =====================
ResiDual  d_0 = s*x_0, d_{k+1} = d_k + s*F_k; output alpha*x_N + LN(d_N)   Xie et al. 2023
DLCL      y_0..y_l; layer l+1 reads sum_k W[l+1,k] LN(y_k) (pre-norm)       Wang et al., ACL 2019
          or LN(sum_k W[l+1,k] y_k) (post-norm); W from the average
Dense     X_0..X_l; block l+1 reads Y_l = sum_j alpha[l,j] X_j, the output  Pagliardini et al.,
Former    Y_L (then the final norm); alpha from the identity                NeurIPS 2024
========  ===============================================================  =====================

Hyper-Connections' and mHC's stream, n copies of ``x`` that their connections read and
write, lives with the rest of those methods (:class:`resnmt.connections.hyper.HyperStream`).
"""
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

State = Tuple[Tensor, ...]


class ResidualStream(nn.Module):
    """Base class: plain stacking (each layer reads the previous layer's output).

    ``reads_sublayer_outputs``: the stack builds its layers to return the sum of their
    sublayers' ``dropout(F)`` (passed to :meth:`after_layer` as ``residual_sum``).
    """

    reads_sublayer_outputs: ClassVar[bool] = False

    def begin(self, x: Tensor) -> State:
        return ()

    def layer_input(self, state: State, index: int, x: Tensor) -> Tensor:
        return x

    def after_layer(self, state: State, index: int, y: Tensor, residual_sum: Optional[Tensor]) -> State:
        return state

    def end(self, state: State, x: Tensor) -> Tensor:
        return x

    def learned(self) -> Dict[str, List[List[float]]]:
        """What ``resnmt-analyze`` reports of the stream's learned weights, by name (a matrix each)."""
        return {}


class ResiDualStream(ResidualStream):
    """ResiDual (Xie et al. 2023, arXiv:2304.14802): beside the post-LN stream
    ``x_{k+1} = LN(x_k + F_k)``, an unnormalized stream ``d`` that adds up the same
    sublayer outputs, ``d_0 = s*x_0``, ``d_{k+1} = d_k + s*F_k``; the stack's output is
    ``alpha*x_N + LN(d_N)`` (s = ``--resi-dual-scale``, alpha = ``--resi-dual-alpha``,
    both 1 in the paper; ``norm`` is the stream's own LN, of ``--normalization``)."""

    reads_sublayer_outputs = True

    def __init__(self, norm: nn.Module, scale: float = 1.0, alpha: float = 1.0):
        super().__init__()
        self.scale = float(scale)
        self.alpha = float(alpha)
        self.norm = norm

    def begin(self, x: Tensor) -> State:
        return (x * self.scale if self.scale != 1.0 else x,)

    def after_layer(self, state: State, index: int, y: Tensor, residual_sum: Optional[Tensor]) -> State:
        (d,) = state
        return (torch.add(d, residual_sum, alpha=self.scale),)

    def end(self, state: State, x: Tensor) -> Tensor:
        (d,) = state
        return torch.add(self.norm(d), x, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"scale={self.scale:g}, alpha={self.alpha:g}"


def window_start(row: int, window: Optional[int]) -> int:
    """The first of y_0..y_row that row ``row`` of DLCL's weights combines (0 without a window)."""
    return max(0, row + 1 - window) if window else 0


def dlcl_initial_weights(num_layers: int, window: Optional[int]) -> Tensor:
    """DLCL's combination weights at the start: row l (the input of layer l, l = N the
    stack's output) averages the ``window`` most recent of y_0..y_l (all of them without a
    window); entries outside the window, and above the diagonal, are 0 and stay 0."""
    n = num_layers + 1
    weights = torch.zeros(n, n, dtype=torch.float64)
    for row in range(n):
        weights[row, window_start(row, window):row + 1] = 1.0
    return (weights / weights.sum(dim=1, keepdim=True)).float()


class DLCLStream(ResidualStream):
    """DLCL, dynamic linear combination of layers (Wang et al., ACL 2019, arXiv:1906.01787).

    With y_0 the embedded input and y_k the output of layer k, layer l reads

    * pre-norm: ``x_l = sum_{k<l} W[l,k] * LN_k(y_k)`` (y_0 not normalized), the stack's
      output ``sum_{k<=N} W[N,k] LN_k(y_k)`` then the stack's final LN;
    * post-norm: ``x_l = LN_l(sum_{k<l} W[l,k] * y_k)`` (layer 0 reads ``W[0,0] y_0``), the
      output ``LN_N(sum_{k<=N} W[N,k] y_k)``;

    W a learned (N+1) x (N+1) lower-triangular matrix starting at the average
    (:func:`dlcl_initial_weights`), optionally limited to a ``window`` of the most recent
    outputs; LN_k the stream's own ``norms`` (one per layer, of ``--normalization``).
    """

    def __init__(self, norms: Sequence[nn.Module], pre_norm: bool, window: Optional[int] = None):
        super().__init__()
        self.num_layers = len(norms)
        self.pre_norm = pre_norm
        self.window = window
        initial = dlcl_initial_weights(self.num_layers, self.window)
        self.weights = nn.Parameter(initial)
        self.register_buffer("mask", initial > 0, persistent=False)
        self.norms = nn.ModuleList(norms)

    def combination(self) -> Tensor:
        """The weights as used: W with the entries outside the window and above the diagonal at 0."""
        return self.weights * self.mask

    def learned(self) -> Dict[str, List[List[float]]]:
        """``dlcl_weights``: row l = the weights layer l (row N: the stack's output) gives
        y_0 (the embedding) ... y_l."""
        return {"dlcl_weights": self.combination().detach().float().cpu().tolist()}

    def _combine(self, state: State, row: int) -> Tensor:
        first = window_start(row, self.window)
        weights = self.weights[row, first:row + 1]
        sources = state[first:row + 1]
        out = sources[0] * weights[0].to(sources[0].dtype)
        # by index, not by iterating over weights[1:]: torch.export cannot load back the empty
        # unbind that iterating over an empty tensor records (row 0)
        for k in range(1, len(sources)):
            out = torch.addcmul(out, sources[k], weights[k].to(sources[k].dtype))
        return out

    def begin(self, x: Tensor) -> State:
        return (x,)

    def layer_input(self, state: State, index: int, x: Tensor) -> Tensor:
        combined = self._combine(state, index)
        if self.pre_norm or index == 0:
            return combined
        return self.norms[index - 1](combined)

    def after_layer(self, state: State, index: int, y: Tensor, residual_sum: Optional[Tensor]) -> State:
        return state + ((self.norms[index](y) if self.pre_norm else y),)

    def end(self, state: State, x: Tensor) -> Tensor:
        combined = self._combine(state, self.num_layers)
        return combined if self.pre_norm else self.norms[self.num_layers - 1](combined)

    def extra_repr(self) -> str:
        window = f", window={self.window}" if self.window else ""
        return f"{'pre' if self.pre_norm else 'post'}-norm, layers={self.num_layers}{window}"


def denseformer_initial_weights(num_layers: int) -> Tensor:
    """(L, L+1): row i-1 is block i's α_i· with α_ii = 1, the rest 0."""
    weights = torch.zeros(num_layers, num_layers + 1)
    for i in range(1, num_layers + 1):
        weights[i - 1, i] = 1.0
    return weights


class DepthWeightedAverage(nn.Module):
    """DenseFormer's depth-weighted average (DWA): ``forward(outputs)`` with ``outputs =
    [X_0, ..., X_i]`` (1 <= i <= L, each (T, B, C)) returns ``Y_i = Σ_j weights[i-1, j] X_j``
    (T, B, C); which block is given by the list's length.

    ``α_ii = 1`` and every other ``α_ij = 0`` at init, so the stack is exactly the plain
    stack then (``0·X_j`` adds exact zeros). Parameter layout (ours, as DLCL's): one matrix
    ``weights`` of shape (L, L+1), row i-1 holding α_i0..α_ii; entries right of the
    diagonal (j > i) are never read and get no gradient, so the learned scalars are the
    paper's L(L+3)/2. Not here: the paper's dilation and period options (every block
    averages all earlier outputs). Compared with DLCL: the identity, not the average, at
    init; no norm on the stored outputs; the averaged outputs are the raw X_j."""

    def __init__(self, num_layers: int):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers {num_layers}: expected >= 1")
        self.num_layers = num_layers
        self.weights = nn.Parameter(denseformer_initial_weights(num_layers))

    def forward(self, outputs: List[Tensor]) -> Tensor:
        block = len(outputs) - 1
        if block < 1 or block > self.num_layers:
            raise ValueError("DepthWeightedAverage expects [X_0, ..., X_i] with 1 <= i <= num_layers")
        row = self.weights[block - 1]
        first = outputs[0]
        out = first * row[0].to(first.dtype)
        for j in range(1, block + 1):
            source = outputs[j]
            out = torch.addcmul(out, source, row[j].to(source.dtype))
        return out

    def learned(self) -> Dict[str, List[List[float]]]:
        """``denseformer_weights``: row i-1 = block i's weights on X_0 (the embedding) ... X_i
        (entries right of the diagonal are unused zeros)."""
        return {"denseformer_weights": self.weights.detach().float().cpu().tolist()}

    def extra_repr(self) -> str:
        return f"layers={self.num_layers}"


class DenseFormerStream(ResidualStream):
    """DenseFormer (Pagliardini et al., NeurIPS 2024, arXiv:2402.02622): with X_0 the
    embedded input and X_i the output of block i, block i+1 reads
    ``Y_i = sum_{j<=i} alpha[i-1, j] X_j`` (block 1 reads X_0), the stack's output is
    ``Y_L`` (then the final norm); alpha a :class:`DepthWeightedAverage` starting at the
    identity (alpha_ii = 1), so the stack starts as the plain pre-LN stack (code:
    epfml/DenseFormer). Every X_j is (T, B, C) and the average is per position."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.average = DepthWeightedAverage(num_layers)

    def begin(self, x: Tensor) -> State:
        return (x,)

    def layer_input(self, state: State, index: int, x: Tensor) -> Tensor:
        return state[0] if index == 0 else self.average(list(state))

    def after_layer(self, state: State, index: int, y: Tensor, residual_sum: Optional[Tensor]) -> State:
        return state + (y,)

    def end(self, state: State, x: Tensor) -> Tensor:
        return self.average(list(state))

    def learned(self) -> Dict[str, List[List[float]]]:
        return self.average.learned()
