"""bf16 training with fairseq 0.12 on GPUs and CPUs, and exact resumption of
half-precision runs.

fairseq 0.12's option parser ties ``--bf16`` (and ``--memory-efficient-bf16``) to TPUs:
``fairseq/options.py`` sets ``args.tpu = True`` whenever bf16 is asked for (fairseq
issue #4696), and the Trainer then asks torch_xla for its device. Everything else in
fairseq's bf16 path is device-neutral: the Trainer casts the model and each batch to
bfloat16, and ``FP16Optimizer`` keeps float32 master weights, steps them with the
wrapped optimizer and copies them back into the bf16 model, with no loss scaling
(``MemoryEfficientFP16Optimizer`` updates the bf16 weights in place instead).

* :func:`untie_bf16_from_tpu` undoes that one coupling after parsing, unless ``--tpu``
  was given or torch_xla is installed; ``resnmt-train`` calls it, so ``resnmt-train
  --bf16`` trains in bf16 on CUDA, and on the CPU with ``--cpu``.
* :func:`check_bf16_device` is called where resnmt's code first sees the parsed flags
  in a stock ``fairseq-train --user-dir resnmt`` run (the resnmt model's and the
  resnmt_translation task's ``build_model``, before fairseq asks torch_xla for a
  device): without torch_xla it raises an OptionError, which ends the command with one
  line naming ``resnmt-train``.
* :func:`keep_fp32_master_weights` (applied when resnmt is imported: resnmt.fairseq_patches) adds the float32
  master weights of ``FP16Optimizer`` (``--bf16``, ``--fp16``) to the optimizer state
  that fairseq saves in checkpoints, and puts them back on load. fairseq saves only the
  half-precision model, so a resumed run restarted from rounded master weights and
  drifted from the uninterrupted run; with them it continues exactly. Checkpoints
  without them (older ones, stock fairseq's) load as before, and the key is ignored by
  stock fairseq.
"""
import importlib.util
import logging
from typing import List, Sequence

import torch

logger = logging.getLogger(__name__)

BF16_FLAGS = ("--bf16", "--memory-efficient-bf16")
MASTER_WEIGHTS_KEY = "resnmt_fp32_master_weights"


def torch_xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def tpu_asked(argv: Sequence[str]) -> bool:
    return any(a == "--tpu" or a.startswith("--tpu=") for a in argv)


def untie_bf16_from_tpu(args, argv: Sequence[str]) -> bool:
    """After fairseq's parse: train bf16 on this machine's device, not on a TPU, where
    ``argv`` did not ask for ``--tpu`` and torch_xla is not installed. Returns whether
    ``args.tpu`` was set back to False."""
    if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not tpu_asked(argv) \
            and not torch_xla_installed():
        args.tpu = False
        return True
    return False


def bf16_needs_resnmt_train_message() -> str:
    return ("--bf16: fairseq 0.12 sends bf16 training to a TPU (--bf16 implies --tpu) and torch_xla is not "
            "installed here; to train in bf16 on a GPU or the CPU run resnmt-train with the same arguments "
            "(it is fairseq-train with --user-dir resnmt and bf16 kept off the TPU)")


def check_bf16_device(args) -> None:
    """An OptionError (one line where it ends a command) where fairseq would send bf16 training
    to a missing TPU."""
    if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not torch_xla_installed():
        from resnmt.options import OptionError

        raise OptionError(bf16_needs_resnmt_train_message())


# --------------------------------------------------------------------------- master weights in checkpoints

def _master_tensors(fp32_params) -> List[torch.Tensor]:
    """FP16Optimizer's float32 master weights as a list: one flat tensor per device
    (``--fp16``, flattened) or one tensor per parameter (``--bf16``, ``--fp16-no-flatten-grads``)."""
    if isinstance(fp32_params, dict):
        return [fp32_params[k] for k in sorted(fp32_params)]
    return list(fp32_params)


def _state_dict_with_master_weights(original):
    def state_dict(self):
        state = original(self)
        state[MASTER_WEIGHTS_KEY] = [p.data.detach().to("cpu", copy=True) for p in _master_tensors(self.fp32_params)]
        return state

    state_dict.__doc__ = original.__doc__
    return state_dict


def _load_state_dict_with_master_weights(original):
    def load_state_dict(self, state_dict, optimizer_overrides=None):
        state_dict = dict(state_dict)
        saved = state_dict.pop(MASTER_WEIGHTS_KEY, None)
        original(self, state_dict, optimizer_overrides)
        if saved is None:
            return
        current = _master_tensors(self.fp32_params)
        if len(saved) != len(current) or any(s.shape != c.shape for s, c in zip(saved, current)):
            logger.warning("the checkpoint's float32 master weights do not match this optimizer's layout; "
                           "resuming from the model's half-precision weights")
            return
        with torch.no_grad():
            for target, value in zip(current, saved):
                target.data.copy_(value.to(device=target.device, dtype=target.dtype))

    load_state_dict.__doc__ = original.__doc__
    return load_state_dict


def keep_fp32_master_weights() -> None:
    """Save and restore FP16Optimizer's float32 master weights with its state (applied once,
    by resnmt.fairseq_patches)."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    FP16Optimizer.state_dict = _state_dict_with_master_weights(FP16Optimizer.state_dict)
    FP16Optimizer.load_state_dict = _load_state_dict_with_master_weights(FP16Optimizer.load_state_dict)
