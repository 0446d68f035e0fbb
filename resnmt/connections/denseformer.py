"""DenseFormer's depth-weighted average (DWA).

Pagliardini et al., "DenseFormer: Enhancing Information Flow in Transformers via Depth
Weighted Averaging", NeurIPS 2024 (arXiv 2402.02622; code epfml/DenseFormer). In a stack
of L pre-LN blocks, block i reads ``Y_{i-1}`` and its raw output ``X_i = Block_i(Y_{i-1})``
is replaced by

    Y_i = Σ_{j=0..i} α_ij X_j        (X_0 the embedded input, Y_0 = X_0)

for i = 1..L; the final norm follows ``Y_L``. ``α_ii = 1`` and every other ``α_ij = 0`` at
init, so the stack is exactly the plain stack then (``0·X_j`` adds exact zeros). Every X_j
is a (T, B, C) tensor and the average is per position, so one step of incremental
decoding computes what the full forward computes there.

Parameter layout (ours, as DLCL's in :mod:`resnmt.connections.streams`): one matrix
``weights`` of shape (L, L+1), row i-1 holding α_i0..α_ii; entries right of the diagonal
(j > i) are never read and get no gradient, so the learned scalars are the paper's
L(L+3)/2. Not here: the paper's dilation and period options (every block averages all
earlier outputs), which the issue defers.

Compared with DLCL (:class:`resnmt.connections.streams.DLCLStream`): the identity, not the
average, at init; no norm on the stored outputs; the averaged outputs are the raw X_j.
"""
from typing import Dict, List

import torch
from torch import Tensor, nn


def denseformer_initial_weights(num_layers: int) -> Tensor:
    """(L, L+1): row i-1 is block i's α_i· with α_ii = 1, the rest 0."""
    weights = torch.zeros(num_layers, num_layers + 1)
    for i in range(1, num_layers + 1):
        weights[i - 1, i] = 1.0
    return weights


class DepthWeightedAverage(nn.Module):
    """``forward(outputs)`` with ``outputs = [X_0, ..., X_i]`` (1 <= i <= L, each (T, B, C))
    returns ``Y_i = Σ_j weights[i-1, j] X_j`` (T, B, C); which block is given by the list's length."""

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
