"""``--fused-master-weights``: fairseq's per-update bookkeeping in multi-tensor kernels.

With ``--fp16`` or ``--bf16`` fairseq's ``FP16Optimizer`` keeps float32 master weights
beside the half-precision model, and every update it copies each parameter's gradient
into its master gradient, copies each master weight back into the model after the step,
and (``--bf16``, where the master weights are one tensor per parameter) zeroes each
master gradient: one kernel per parameter each. The base Transformer has 253 parameter
tensors; one update of it on an H200 launched 1,470 kernels, 533 of them copies. Every
update also computes the gradient norm (for logging, the overflow check and
``--clip-norm``), one kernel per parameter unless NVIDIA's apex is installed. On a GPU
whose update waits on launching kernels (docs/benchmarks.md) these are launches without
arithmetic.

``--fused-master-weights`` (a flag of the ``resnmt_translation`` task) does the same
copies and zeroing with torch's multi-tensor (``torch._foreach_*``) kernels, which
handle many tensors per launch, and hands fairseq's gradient norm torch's multi-tensor
norm where fairseq would look for apex's. The copies and zeroing are exact (the same
bits); the norm's per-tensor sums may round differently in the last place, so the logged
``gnorm`` can differ by a unit in the last place and, with ``--clip-norm``, so can the
clipping factor. The switch is process-wide (fairseq's classes are patched while the
task lives in the process); without the flag nothing changes.
"""
import logging
from collections import defaultdict
from typing import List

import torch

logger = logging.getLogger(__name__)
_ORIGINAL = {}


def _flat_groups(opt, grads_only: bool):
    """fairseq's grouping of the model's parameters by device for the flat master
    weights (one float32 tensor per device); for gradients only those that require them."""
    groups = defaultdict(list)
    for p in opt.fp16_params:
        if p.requires_grad or not grads_only:
            groups[p.device.index].append(p)
    return groups


def _flat_views(flat: torch.Tensor, params) -> List[torch.Tensor]:
    """The slices of ``flat`` (a device's flat master weights or their gradient) that hold
    ``params``, in order, each shaped like its parameter."""
    sizes = [p.data.numel() for p in params]
    return [v.view_as(p.data) for v, p in zip(flat[:sum(sizes)].split(sizes), params)]


def sync_grads_to_fp32(self) -> None:
    """``_FP16OptimizerMixin._sync_fp16_grads_to_fp32`` with multi-tensor copies."""
    if not self._needs_sync:
        return
    if self.has_flat_params:
        groups = _flat_groups(self, grads_only=True)
        for device, flat in self.fp32_params.items():
            params = groups[device]
            if params:
                torch._foreach_copy_(_flat_views(flat.grad.data, params),
                                     [p.grad.data if p.grad is not None else p.data.new_zeros(p.data.shape)
                                      for p in params])
    else:
        targets, sources = [], []
        for p, p32 in zip(self.fp16_params, self.fp32_params):
            if not p.requires_grad:
                continue
            if p.grad is None:
                p32.grad = torch.zeros_like(p.data, dtype=torch.float)
            elif p32.grad is None:
                p32.grad = p.grad.data.float()
            else:
                targets.append(p32.grad.data)
                sources.append(p.grad.data)
        if targets:
            torch._foreach_copy_(targets, sources)
    self._needs_sync = False


def sync_params_to_fp16(self) -> None:
    """``_FP16OptimizerMixin._sync_fp32_params_to_fp16`` with multi-tensor copies."""
    if self.has_flat_params:
        groups = _flat_groups(self, grads_only=False)
        for device, flat in self.fp32_params.items():
            params = groups[device]
            if params:
                torch._foreach_copy_([p.data for p in params], _flat_views(flat.data, params))
    else:
        pairs = [(p.data, p32.data) for p, p32 in zip(self.fp16_params, self.fp32_params) if p.requires_grad]
        if pairs:
            torch._foreach_copy_([t for t, _ in pairs], [s for _, s in pairs])


def zero_grad(self) -> None:
    """``_FP16OptimizerMixin.zero_grad`` with the per-parameter master gradients zeroed
    by one multi-tensor call."""
    if self.has_flat_params:
        _ORIGINAL["zero_grad"](self)
        return
    for p in self.fp16_params:
        p.grad = None
    master_grads = [p32.grad for p32 in self.fp32_params if p32.grad is not None]
    if master_grads:
        torch._foreach_zero_(master_grads)
    self._needs_sync = False
    if self.scaler is not None:
        self._multiply_factor = 1.0 / float(self.scaler.loss_scale)


def total_norm(grads: List[torch.Tensor], chunk_size=None) -> torch.Tensor:
    """``fairseq.utils.multi_tensor_total_norm`` (apex's) from torch's multi-tensor norm:
    the 2-norm of all ``grads`` together, in float32, on the first one's device."""
    by_device = defaultdict(list)
    for g in grads:
        by_device[g.device].append(g)
    norms = []
    for tensors in by_device.values():
        norms += torch._foreach_norm(tensors, 2, dtype=torch.float32)
    device = grads[0].device
    return torch.norm(torch.stack([n.to(device) for n in norms]))


def install() -> None:
    """Patch fairseq's optimizer wrapper and gradient norm (idempotent)."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    if _ORIGINAL:
        return
    _ORIGINAL.update(sync_grads=_FP16OptimizerMixin._sync_fp16_grads_to_fp32,
                     sync_params=_FP16OptimizerMixin._sync_fp32_params_to_fp16,
                     zero_grad=_FP16OptimizerMixin.zero_grad,
                     norm_available=utils.multi_tensor_l2norm_available, norm=utils.multi_tensor_total_norm)
    _FP16OptimizerMixin._sync_fp16_grads_to_fp32 = sync_grads_to_fp32
    _FP16OptimizerMixin._sync_fp32_params_to_fp16 = sync_params_to_fp16
    _FP16OptimizerMixin.zero_grad = zero_grad
    fused_norm = not utils.multi_tensor_l2norm_available  # apex's kernel, where installed, stays
    if fused_norm:
        utils.multi_tensor_l2norm_available, utils.multi_tensor_total_norm = True, total_norm
    logger.info("--fused-master-weights: master-weight copies and zeroing in multi-tensor kernels; gradient norm: "
                + ("torch's multi-tensor norm" if fused_norm else "apex's"))


def uninstall() -> None:
    """fairseq's own code back."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    if not _ORIGINAL:
        return
    _FP16OptimizerMixin._sync_fp16_grads_to_fp32 = _ORIGINAL["sync_grads"]
    _FP16OptimizerMixin._sync_fp32_params_to_fp16 = _ORIGINAL["sync_params"]
    _FP16OptimizerMixin.zero_grad = _ORIGINAL["zero_grad"]
    utils.multi_tensor_l2norm_available, utils.multi_tensor_total_norm = _ORIGINAL["norm_available"], _ORIGINAL["norm"]
    _ORIGINAL.clear()


def installed() -> bool:
    return bool(_ORIGINAL)
