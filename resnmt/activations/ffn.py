"""The activation between fc1 and fc2 of every FFN sublayer.

All FFN activations share one call signature so the layers need not know which one
they hold::

    activation(h, padding_mask) -> Tensor

``h`` is the fc1 output, shape ``(seq_len, batch, ffn_dim)``; ``padding_mask`` is
``(batch, seq_len)`` with True at padding positions, or None. Plain activations ignore
the mask; the normalized activations (NReLU/NSwish, ``normalized.py``) use it
to take batch statistics over real tokens only.
"""
from typing import Optional

import torch.nn.functional as F
from fairseq import utils
from torch import Tensor, nn

from resnmt.activations.normalized import ActivationSpec

# fairseq's get_activation_fn("swish") returns the torch.nn.SiLU *class*, not a function
FUNCTIONS_FAIRSEQ_GETS_WRONG = {"swish": F.silu}


class PlainActivation(nn.Module):
    """fairseq's ``--activation-fn`` (relu, gelu, swish, ...), unchanged."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.fn = FUNCTIONS_FAIRSEQ_GETS_WRONG.get(name) or utils.get_activation_fn(name)

    def forward(self, h: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.fn(h)

    def extra_repr(self) -> str:
        return self.name


def build_ffn_activation(
    spec: ActivationSpec, activation_fn: str, side: str, layer_index: int, num_layers: int
) -> nn.Module:
    """The activation of FFN ``layer_index`` (0-based) of ``side`` ("encoder"/"decoder").

    ``--normalized-activation`` (``spec.kind``) selects NReLU/NSwish for every FFN except
    the top ``--{side}-unnormalized-top-layers`` ones, which keep plain ReLU/Swish;
    without it every FFN gets fairseq's ``--activation-fn``.
    """
    normalized = spec.build(side, layer_index, num_layers)
    if normalized is not None:
        return normalized
    return PlainActivation(activation_fn)
