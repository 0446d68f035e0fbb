"""Gradient norm of each block's (encoder/decoder layer's) output, teacher-forced.

For a batch with summed loss ``L`` (label-smoothed NLL, or plain NLL with smoothing 0,
summed over the real target tokens) and ``h_t`` the output of a layer at position ``t``,
the statistic is ``||dL/dh_t||_2`` (over features), averaged over the real positions of
that side. In evaluation mode the sentences of a batch do not interact, so ``dL/dh_t``
only involves its own sentence and the value does not depend on how sentences are
batched. ``torch.autograd.grad`` computes only these gradients: parameters get none.
"""
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from torch import Tensor, nn

from resnmt.analysis.hooks import Site, model_layers


def teacher_forced_loss(model: nn.Module, sample: dict, label_smoothing: float, pad: int) -> Tuple[Tensor, Tensor]:
    """(summed label-smoothed NLL, summed NLL) of ``sample``'s targets, teacher-forced."""
    net_output = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    target = sample["target"]
    loss, nll = label_smoothed_nll_loss(
        lprobs.view(-1, lprobs.size(-1)), target.view(-1), label_smoothing, ignore_index=pad, reduce=True
    )
    return loss, nll


class BlockOutputs:
    """Forward hooks keeping every layer's output tensor ``(seq_len, batch, dim)`` of one
    forward pass, by site ``(side, layer, "output")``."""

    def __init__(self, model: nn.Module):
        self.outputs: Dict[Site, Tensor] = {}
        self.handles = []
        for side, i, layer in model_layers(model):
            self.handles.append(layer.register_forward_hook(self._keep((side, i, "output"))))

    def _keep(self, site: Site):
        def hook(module, inputs, output):
            self.outputs[site] = output[0] if isinstance(output, tuple) else output

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def block_gradient_norms(
    model: nn.Module, sample: dict, label_smoothing: float, pad: int, blocks: Optional[BlockOutputs] = None
) -> Tuple[Dict[Site, Tuple[Tensor, Tensor]], Tensor, Tensor]:
    """Forward and backward of one batch.

    Returns ``({site: (sum over real positions of ||dL/dh_t||, number of real positions)},
    loss, nll)``. Real positions: source tokens that are not padding (encoder), target
    positions whose target is not padding (decoder). ``blocks`` lets a caller keep its own
    :class:`BlockOutputs` attached across batches.
    """
    own = blocks is None
    blocks = blocks or BlockOutputs(model)
    try:
        blocks.outputs.clear()
        loss, nll = teacher_forced_loss(model, sample, label_smoothing, pad)
        sites: List[Site] = sorted(blocks.outputs)
        grads = torch.autograd.grad(loss, [blocks.outputs[s] for s in sites], allow_unused=True)
    finally:
        if own:
            blocks.remove()
    masks = {
        "encoder": sample["net_input"]["src_tokens"].ne(pad).t(),  # (src_len, batch)
        "decoder": sample["target"].ne(pad).t(),  # (tgt_len, batch)
    }
    result = {}
    for site, grad in zip(sites, grads):
        keep = masks[site[0]].to(torch.float64)
        if grad is None:
            norms = torch.zeros_like(keep)
        else:
            # over the position's whole state: its C features, or its n streams' n*C (hyper, mhc)
            norms = torch.linalg.vector_norm(grad.double().flatten(2), dim=-1)
        result[site] = ((norms * keep).sum(), keep.sum())
    blocks.outputs.clear()
    return result, loss.detach(), nll.detach()
