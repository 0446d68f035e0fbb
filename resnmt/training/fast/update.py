"""``--fast-path``'s parameter update, every number of it on the device.

fairseq's update after the backward passes (``Trainer.train_step``): the gradients times
``world size / sample size``, their norm, clipping to ``--clip-norm``, the check that the
norm is finite, the optimizer's step on the float32 master weights, the master weights
copied into the half-precision model (``--bf16``), the gradients zeroed. fairseq reads
the norm on the host twice (the finiteness check, the clipping's ``if``) and its
optimizer keeps the step count and learning rate on the host, so the update cannot run
without waiting for the device, nor be captured as a CUDA graph.

:class:`DeviceUpdate` computes the same with multi-tensor (``torch._foreach_*``) kernels
and no read of a device value: the norm, the clipping factor and a non-finite flag stay on
the device, and the three numbers that change from one update to the next (the gradients'
scale ``world size / sample size``, and fairseq's Adam step size and weight decay from the
learning rate and step count) are 0-dimensional device tensors that :meth:`prepare` fills
in place before each update (a kernel launch each, no copy from host memory, so no wait
and nothing for a captured graph to bake in). :meth:`__call__` is then the whole update,
the same kernels every time: capture it once and replay it (``capture.py``).

The arithmetic is fairseq's:

* norm and clipping as fairseq's, operation for operation: in float32 the gradients
  times ``scale``, ``gnorm`` their norm, then times ``min(1, clip / (gnorm + 1e-6))``
  (``--clip-norm 0``: not); with ``--bf16`` (``FP16Optimizer``) ``gnorm = scale *
  ||g||`` of the master gradients, which are multiplied once, by ``scale`` times that
  factor;
* the step is fairseq's ``adam`` (``fairseq.optim.adam.Adam``, the AdamW form that
  ``--optimizer adam_fused`` computes too): ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2)
  g^2``, ``p -= wd * lr * p``, ``p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) +
  eps)``, with ``eps`` outside the bias correction (torch's ``AdamW`` puts it inside,
  which its ``capturable`` mode cannot give fairseq's value of, so its fused kernel is not
  used here);
* on CUDA (where Triton is) the scaling, clipping, the step, the copy into the ``--bf16``
  model and the zeroing are one Triton kernel launch over all the parameters
  (``fused_adam.py``: the same arithmetic to float32 rounding; the gradient norm of the
  unscaled gradients times the scale, the gradients multiplied once by the scale times the
  clipping factor); elsewhere, or if that kernel fails to build, the multi-tensor
  operations above (one line says so; also where it cannot step the tensors);
* the moments live in the wrapped optimizer's own state (``exp_avg``, ``exp_avg_sq``,
  ``step``), so checkpoints are fairseq's and a run resumes with or without
  ``--fast-path``.

The model's gradients are allocated once (a captured graph accumulates into the same
memory every time); the update zeroes them at its end, and :meth:`DeviceUpdate.hold_grads`
(before every update) binds back any that fairseq or torch set to ``None``.
"""
import logging
import math
from typing import List

import torch

from resnmt.training.optim import adam_moments

logger = logging.getLogger(__name__)

ADAM_STATE_KEYS = {"step", "exp_avg", "exp_avg_sq"}
ADAM_KERNELS = ("auto", "triton", "foreach")


def adam_kernel_for(device, kernel: str = "auto") -> str:
    """``triton`` (fused_adam.py) or ``foreach`` for ``kernel`` on ``device``: ``auto`` takes
    Triton on CUDA where it is installed."""
    from resnmt.training.fast.fused_adam import triton_available

    if kernel not in ADAM_KERNELS:
        raise ValueError(f"--fast-path Adam kernel {kernel!r}: choose one of {', '.join(ADAM_KERNELS)}")
    if kernel == "auto":
        return "triton" if torch.device(device).type == "cuda" and triton_available() else "foreach"
    return kernel


def torch_adam(optimizer):
    """The torch optimizer stepping ``optimizer``'s (float32) parameters, and its
    hyper-parameters; one line where it is not fairseq's adam math."""
    from fairseq.optim.adam import Adam

    from resnmt.training.optim import MultiTensorAdam

    inner = optimizer.fp32_optimizer if hasattr(optimizer, "fp32_optimizer") else optimizer
    opt = inner.optimizer
    fairseq_fused = type(opt).__name__ in ("FusedAdamV1", "FusedAdamV2")  # fairseq's CUDA extension / apex
    if not isinstance(opt, (Adam, MultiTensorAdam)) and not fairseq_fused:
        raise ValueError(f"--fast-path steps with fairseq's adam; this run's optimizer is {type(opt).__name__} "
                         "(train with --optimizer adam or --optimizer adam_fused)")
    if len(opt.param_groups) != 1:
        raise ValueError(f"--fast-path: the optimizer has {len(opt.param_groups)} parameter groups; it steps one")
    group = opt.param_groups[0]
    if group.get("amsgrad", False):
        raise ValueError("--fast-path: --amsgrad is not fairseq's adam math here; train without it")
    if not group.get("bias_correction", True) or group.get("eps_inside_sqrt", False):
        raise ValueError("--fast-path: this adam variant (no bias correction / eps inside the square root) "
                         "is not fairseq's adam; train with --optimizer adam_fused")
    betas = tuple(float(b) for b in group["betas"])
    return opt, {"betas": betas, "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"])}


class DeviceUpdate:
    """The update of module docstring for ``optimizer`` (fairseq's optimizer as the
    Trainer built it: a float32 ``FairseqOptimizer``, or ``FP16Optimizer`` with float32
    master weights for ``--bf16``) and ``model_params`` (the trained parameters); ``adam``:
    which kernel steps them (:func:`adam_kernel_for`)."""

    def __init__(self, optimizer, model_params: List[torch.Tensor], clip_norm: float, device, adam: str = "auto"):
        self.opt, hyper = torch_adam(optimizer)
        self.beta1, self.beta2 = hyper["betas"]
        self.eps, self.weight_decay = hyper["eps"], hyper["weight_decay"]
        self.clip_norm = float(clip_norm)
        self.model_params = list(model_params)
        self.master = hasattr(optimizer, "fp32_params")
        if self.master:
            if not isinstance(optimizer.fp32_params, list):
                raise ValueError("--fast-path: flat fp16 master weights are not supported (train with --bf16)")
            self.params = list(optimizer.fp32_params)
            if len(self.params) != len(self.model_params):
                raise ValueError("--fast-path: the master weights do not match the model's trained parameters")
        else:
            self.params = list(self.model_params)
        opt_params = [p for g in self.opt.param_groups for p in g["params"]]
        if {id(p) for p in opt_params} != {id(p) for p in self.params}:
            raise ValueError("--fast-path: the optimizer's parameters are not the model's (or its master weights)")
        for p in self.model_params + self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.model_grads = [p.grad for p in self.model_params]
        self.grads = [p.grad for p in self.params]
        self.step_count = self._init_state()
        self.exp_avgs = [self.opt.state[p]["exp_avg"] for p in self.params]
        self.exp_avg_sqs = [self.opt.state[p]["exp_avg_sq"] for p in self.params]
        scalar = dict(dtype=torch.float32, device=device)
        self.grad_scale = torch.ones((), **scalar)     # world size / sample size
        self.neg_step_size = torch.zeros((), **scalar)  # -lr * sqrt(1 - b2^t) / (1 - b1^t)
        self.decay = torch.zeros((), **scalar)          # -weight decay * lr
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # any non-finite norm since cleared
        self.fused = None
        if adam_kernel_for(device, adam) == "triton":
            from resnmt.training.fast.fused_adam import FusedAdam

            try:
                self.fused = FusedAdam(self.params, self.model_grads, self.exp_avgs, self.exp_avg_sqs,
                                       self.model_params if self.master else None, (self.beta1, self.beta2), self.eps)
            except ValueError as error:  # tensors it cannot step (dtypes, layouts): the multi-tensor update
                logger.warning("[fast path] %s; Adam runs as multi-tensor operations", error)
        self.fused_checked = False  # the kernel has built and run once

    @property
    def adam_kernel(self) -> str:
        return "triton" if self.fused is not None else "foreach"

    def _init_state(self) -> int:
        """The moments of every parameter in the optimizer's state (zeros where it has
        none yet), float32 on the parameter's device; the step count they are at."""
        steps = set()
        for p in self.params:
            state = self.opt.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(p, dtype=torch.float32),
                             exp_avg_sq=torch.zeros_like(p, dtype=torch.float32))
            extra = set(state) - ADAM_STATE_KEYS
            if extra:
                raise ValueError(f"--fast-path: the optimizer state holds {sorted(extra)}, which fairseq's adam "
                                 "does not keep")
            for key in ("exp_avg", "exp_avg_sq"):
                if state[key].dtype != torch.float32 or state[key].device != p.device:
                    state[key] = state[key].to(device=p.device, dtype=torch.float32)
            steps.add(int(state["step"]))
        if len(steps) > 1:
            raise ValueError(f"--fast-path: the parameters are at different Adam steps {sorted(steps)}")
        return steps.pop() if steps else 0

    def hold_grads(self) -> int:
        """Bind every parameter's ``.grad`` again to the tensor the update (and any recorded
        step) reads and writes: one set to None (fairseq's ``FP16Optimizer.zero_grad``,
        torch's ``zero_grad(set_to_none=True)``) gets it back zeroed, one replaced by
        another tensor gets that tensor's values. Returns how many were bound again."""
        rebound = 0
        for params, grads in ((self.model_params, self.model_grads), (self.params, self.grads)):
            for p, g in zip(params, grads):
                if p.grad is not g:
                    if p.grad is None:
                        g.zero_()
                    else:
                        g.copy_(p.grad)
                    p.grad = g
                    rebound += 1
        return rebound

    def state_tensors(self) -> List[torch.Tensor]:
        """Every tensor an update changes: weights, master weights, moments, gradients, the flag."""
        return [*self.model_params, *self.params, *self.exp_avgs, *self.exp_avg_sqs, *self.model_grads, *self.grads,
                self.nonfinite]

    def prepare(self, grad_scale: float, lr: float) -> None:
        """Set the next update's numbers (host floats; no wait): the gradients' scale, and
        the step size and decay of Adam's next step at learning rate ``lr``."""
        t = self.step_count + 1
        bias_correction1 = 1 - self.beta1 ** t
        bias_correction2 = 1 - self.beta2 ** t
        self.grad_scale.fill_(grad_scale)
        self.neg_step_size.fill_(-(lr * math.sqrt(bias_correction2) / bias_correction1))
        self.decay.fill_(-self.weight_decay * lr)

    @torch.no_grad()
    def __call__(self) -> torch.Tensor:
        """The update (module docstring); returns the gradient norm (after the scale,
        before clipping: fairseq's logged ``gnorm``), a device tensor."""
        if self.fused is not None:
            return self._fused_update()
        grads = self.grads
        if self.master:  # FP16Optimizer's order: the norm of the unscaled gradients, one multiply
            torch._foreach_copy_(grads, self.model_grads)
            gnorm = self._norm(grads) * self.grad_scale
            factor = self.grad_scale if self.clip_norm <= 0 else self.grad_scale * self._clip_coefficient(gnorm)
            torch._foreach_mul_(grads, factor)
        else:  # the float32 optimizer's: scale, norm, clip
            torch._foreach_mul_(grads, self.grad_scale)
            gnorm = self._norm(grads)
            if self.clip_norm > 0:
                torch._foreach_mul_(grads, self._clip_coefficient(gnorm))
        self.nonfinite.logical_or_(torch.isfinite(gnorm).logical_not())
        self._adam(grads)
        if self.master:
            torch._foreach_copy_(self.model_params, self.params)
        torch._foreach_zero_(self.model_grads)
        return gnorm

    def _fused_update(self) -> torch.Tensor:
        """The update in one kernel launch after the norm (fused_adam.py); where the kernel
        fails at its first call (it raises before it writes), the multi-tensor update."""
        gnorm = self._norm(self.model_grads) * self.grad_scale
        factor = self.grad_scale if self.clip_norm <= 0 else self.grad_scale * self._clip_coefficient(gnorm)
        try:
            self.fused(factor, self.neg_step_size, self.decay)
        except Exception as error:
            if self.fused_checked:
                raise
            logger.warning("[fast path] the fused Adam kernel failed (%s: %s); Adam runs as multi-tensor operations",
                           type(error).__name__, (str(error).strip().splitlines() or [""])[0])
            self.fused = None
            return self()
        self.fused_checked = True
        self.nonfinite.logical_or_(torch.isfinite(gnorm).logical_not())
        return gnorm

    @staticmethod
    def _norm(grads: List[torch.Tensor]) -> torch.Tensor:
        """fairseq's total norm: the 2-norm of the per-tensor 2-norms (in float32)."""
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))

    def _clip_coefficient(self, gnorm: torch.Tensor) -> torch.Tensor:
        """fairseq's ``clip_grad_norm_`` factor: ``min(1, clip / (gnorm + 1e-6))``."""
        return (self.clip_norm / (gnorm + 1e-6)).clamp(max=1)

    def _adam(self, grads: List[torch.Tensor]) -> None:
        """fairseq's ``Adam.step`` over all the parameters at once (module docstring)."""
        m, params = self.exp_avgs, self.params
        denom = adam_moments(m, self.exp_avg_sqs, grads, self.beta1, self.beta2, self.eps)
        if self.weight_decay != 0:
            torch._foreach_add_(params, torch._foreach_mul(params, self.decay))
        steps = torch._foreach_mul(m, self.neg_step_size)  # addcdiv's order: (value * m) / denom
        torch._foreach_div_(steps, denom)
        del denom
        torch._foreach_add_(params, steps)

    def advance(self) -> None:
        """Count the step just taken in the optimizer's state (host integers)."""
        self.step_count += 1
        for p in self.params:
            self.opt.state[p]["step"] = self.step_count
