"""``--optimizer adam_fused``: fairseq's ``adam`` in a few multi-tensor kernels per update.

fairseq 0.12's ``adam`` (``fairseq.optim.adam.Adam``, where neither apex nor fairseq's
own CUDA extension is installed, as with the ve-fairseq wheels) steps each parameter
in Python: about ten kernel launches per parameter per update, some 2,000 for the
base Transformer. ``adam_fused`` computes the same update, fairseq's AdamW form::

    m <- beta1 m + (1 - beta1) g          v <- beta2 v + (1 - beta2) g^2
    p <- p - lr wd p - lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)

(decoupled weight decay, and ``eps`` added to ``sqrt(v)`` before the bias correction of
``v``, which differs from torch's AdamW), over all parameters at once, by one of

* ``fused``: torch's fused AdamW kernel (``torch._fused_adamw_``: one kernel per
  parameter chunk for the whole update; CUDA, and the CPU where torch has it), with
  torch's ``eps`` set each step to ``eps / sqrt(1 - beta2^t)``, which makes torch's
  bias-corrected denominator fairseq's;
* ``foreach``: fairseq's own sequence of operations as torch ``_foreach`` multi-tensor
  operations (the same arithmetic as ``adam``, parameter for parameter).

``--adam-kernel auto`` (the default) takes ``fused`` for float32 parameters on CUDA and
``foreach`` elsewhere. Its gradient norm (``--clip-norm``) takes the per-tensor norms
of float32 gradients in one multi-tensor call. Step counts are kept on the host (as ``adam`` does, in the same
``step``/``exp_avg``/``exp_avg_sq`` state), so an update reads nothing back from the
device. Works under fairseq's ``--fp16``/``--bf16`` wrappers: with ``FP16Optimizer`` it
steps the float32 master weights; with ``--memory-efficient-fp16``/``-bf16`` the
half-precision parameters are stepped in float32 and written back, with float32 moments,
as ``adam`` does. Nothing changes for runs that do not ask for it.
"""
import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

ADAM_KERNELS = ("auto", "fused", "foreach")


def fused_adamw_supported(device: torch.device) -> bool:
    """Whether this torch has a fused AdamW kernel for ``device`` (CUDA; the CPU from torch 2.4)."""
    if not hasattr(torch, "_fused_adamw_"):
        return False
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        try:
            from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

            return "cpu" in _get_fused_kernels_supported_devices()
        except ImportError:
            return False
    return False


class MultiTensorAdam(torch.optim.Optimizer):
    """fairseq's Adam (AdamW form, see the module docstring) with multi-tensor kernels."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, kernel="auto"):
        if kernel not in ADAM_KERNELS:
            raise ValueError(f"--adam-kernel {kernel}: choose one of {', '.join(ADAM_KERNELS)}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.kernel = kernel

    @property
    def supports_memory_efficient_fp16(self):
        return True

    @property
    def supports_flat_params(self):
        return True

    def kernel_for(self, device: torch.device, dtype: torch.dtype) -> str:
        if self.kernel == "fused":
            if not fused_adamw_supported(device):
                raise RuntimeError(f"--adam-kernel fused: this torch ({torch.__version__}) has no fused AdamW "
                                   f"kernel for {device.type}; use --adam-kernel foreach")
            return "fused"
        if self.kernel == "auto":
            return "fused" if device.type == "cuda" and fused_adamw_supported(device) else "foreach"
        return "foreach"

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            buckets = defaultdict(list)  # (device, dtype, step) -> params: one kernel call each
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("adam_fused does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32,
                                                           memory_format=torch.preserve_format)
                else:  # as fairseq's Adam: moments in float32 on the parameter's device
                    for key in ("exp_avg", "exp_avg_sq"):
                        if state[key].dtype != torch.float32 or state[key].device != p.device:
                            state[key] = state[key].to(device=p.device, dtype=torch.float32)
                buckets[(p.device, p.dtype, int(state["step"]))].append(p)
            for (device, dtype, step), params in buckets.items():
                self._step_bucket(group, params, device, dtype, step + 1)
                for p in params:
                    self.state[p]["step"] = step + 1
        return loss

    def _step_bucket(self, group, params: List[torch.Tensor], device, dtype, step: int) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        half = dtype != torch.float32
        # half-precision parameters (--memory-efficient-fp16/-bf16): step float32 copies
        values = [p.float() for p in params] if half else params
        grads = [p.grad.float() if p.grad.dtype != torch.float32 else p.grad for p in params]
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        if self.kernel_for(device, dtype) == "fused":
            steps = [torch.full((), float(step), dtype=torch.float32, device=device)] * len(params)
            torch._fused_adamw_(values, grads, exp_avgs, exp_avg_sqs, [], steps, lr=float(lr), beta1=beta1,
                                beta2=beta2, weight_decay=wd, eps=eps / math.sqrt(bias_correction2),
                                amsgrad=False, maximize=False)
        else:  # fairseq's Adam.step, operation for operation, over all the tensors at once
            denom = adam_moments(exp_avgs, exp_avg_sqs, grads, beta1, beta2, eps)
            step_size = lr * math.sqrt(bias_correction2) / bias_correction1
            if wd != 0:
                torch._foreach_add_(values, values, alpha=-wd * lr)
            torch._foreach_addcdiv_(values, exp_avgs, denom, value=-step_size)
        if half:
            torch._foreach_copy_(params, values)


def adam_moments(exp_avgs: List[torch.Tensor], exp_avg_sqs: List[torch.Tensor], grads: List[torch.Tensor],
                 beta1: float, beta2: float, eps: float) -> List[torch.Tensor]:
    """fairseq's ``Adam.step`` up to the parameter update, over all the tensors at once: the
    moments updated in place, and the denominators ``sqrt(v) + eps`` returned (eps outside
    the bias correction, as fairseq has it). Shared with the fast path's update."""
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps)
    return denom


@dataclass
class FairseqFusedAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    adam_kernel: ChoiceEnum(ADAM_KERNELS) = field(
        default="auto",
        metadata={"help": "how adam_fused computes fairseq's adam update: 'fused', torch's fused AdamW kernel "
                          "(CUDA; the CPU where torch has it); 'foreach', torch's multi-tensor operations; "
                          "'auto', fused for float32 parameters on CUDA, else foreach"},
    )
    lr: List[float] = II("optimization.lr")


@register_optimizer("adam_fused", dataclass=FairseqFusedAdamConfig)
class FairseqFusedAdam(FairseqOptimizer):
    """fairseq's ``adam`` (its AdamW form and flags: --adam-betas, --adam-eps,
    --weight-decay) computed with torch's fused or multi-tensor kernels (resnmt.training.optim)."""

    def __init__(self, cfg: FairseqFusedAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = MultiTensorAdam(params, kernel=str(cfg.adam_kernel), **self.optimizer_config)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq's ``utils.clip_grad_norm_`` (the same total norm and clipping) with the
        per-tensor norms of float32 gradients in one multi-tensor call instead of one
        kernel each; other cases are fairseq's own."""
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad.detach() for p in params]
        if len(grads) < 2 or any(hasattr(p, "expert") for p in params) \
                or any(g.dtype != torch.float32 or g.is_sparse for g in grads):
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, 2)))
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
            torch._foreach_mul_(grads, clip_coef)
        return total_norm

    @property
    def optimizer_config(self):
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas  # as fairseq's adam reads --adam-betas
        if isinstance(betas, str):
            betas = eval(betas)
        elif OmegaConf.is_config(betas):
            betas = OmegaConf.to_container(betas)
        return {"lr": lr, "betas": tuple(betas), "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay}
