"""Per-position scalar gates, several computed in one pass (SAS's alpha, beta, gamma)."""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ScalarGates(nn.Module):
    """``n`` independent scalar gates ``sigmoid(S_i(z))`` on the same input ``z``.

    Two-layer form (SAS paper, the default)::

        S_i(z) = tanh(z W_f,i + b_f,i) W_ff,i + b_ff,i      W_f,i: in x hidden, W_ff,i: hidden x 1

    Single-layer form (``hidden_dim=None``)::

        S_i(z) = z W_i + b_i                                 W_i: in x 1

    The gates keep separate parameters; their first layers are stored stacked in one
    matrix so that all of them cost one matmul. Per gate, the two-layer form holds
    ``in*hidden + hidden + hidden + 1`` parameters (525,313 for in = 2*512, hidden = 512,
    the paper's size).

    Args:
        input_dim: size of ``z``'s last dimension.
        hidden_dim: hidden size of the two-layer form, or None for the single-layer form.
        bias_init: the initial output bias ``b_ff,i`` of each gate; its length is ``n``.

    Input: the two halves of ``z = [x; fx]`` (``gates(x, fx)``), each ``(..., input_dim / 2)``:
    they are multiplied by the matching column blocks of the weights and summed, which is
    ``z W`` without materializing ``z`` (autograd would otherwise keep the concatenated
    copy alive for the backward pass). Output ``(..., n)`` in ``(0, 1)``.
    """

    def __init__(self, input_dim: int, hidden_dim: Optional[int], bias_init: Sequence[float]):
        super().__init__()
        self.num_gates = len(bias_init)
        self.hidden_dim = hidden_dim
        if hidden_dim is None:
            self.hidden = None
            self.out_weight = nn.Parameter(torch.empty(self.num_gates, input_dim))
        else:
            self.hidden = nn.Linear(input_dim, self.num_gates * hidden_dim)
            self.out_weight = nn.Parameter(torch.empty(self.num_gates, hidden_dim))
        self.out_bias = nn.Parameter(torch.tensor([float(b) for b in bias_init]))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.hidden is not None:
            for i in range(self.num_gates):  # each gate's block initialised as its own layer
                rows = slice(i * self.hidden_dim, (i + 1) * self.hidden_dim)
                nn.init.xavier_uniform_(self.hidden.weight.data[rows])
            nn.init.zeros_(self.hidden.bias)
        for i in range(self.num_gates):  # W_ff,i is hidden x 1 (or in x 1)
            nn.init.xavier_uniform_(self.out_weight.data[i : i + 1])

    def logits(self, x: Tensor, fx: Tensor) -> Tensor:
        """``S_i(z)`` before the sigmoid, ``(..., n)``, for ``z = [x; fx]`` given in its two pieces."""
        if self.hidden is None:
            return self._linear_on_pieces(x, fx, self.out_weight, self.out_bias)
        h = torch.tanh(self._linear_on_pieces(x, fx, self.hidden.weight, self.hidden.bias))
        h = h.unflatten(-1, (self.num_gates, h.size(-1) // self.num_gates))
        return torch.einsum("...gh,gh->...g", h, self.out_weight) + self.out_bias

    @staticmethod
    def _linear_on_pieces(x: Tensor, fx: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """``[x; fx] W^T + b`` computed piece by piece."""
        width = x.size(-1)
        return F.linear(x, weight[:, :width]) + F.linear(fx, weight[:, width:]) + bias

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(x, fx))

    def extra_repr(self) -> str:
        form = "single_layer" if self.hidden is None else f"two_layer(hidden={self.hidden_dim})"
        return f"num_gates={self.num_gates}, {form}"
