"""``--sdpa-backends``: which of torch's attention kernels fairseq's attention may use.

fairseq's ``MultiheadAttention`` computes attention with torch's
``scaled_dot_product_attention`` (through ``F.multi_head_attention_forward``), and torch
picks one of its kernels for each call: FlashAttention (``flash``), the memory-efficient
kernel (``efficient``), cuDNN's (``cudnn``) or the plain composition (``math``). On Hopper
GPUs recent torch prefers cuDNN's kernel, which builds an execution plan for every new
shape of its inputs (batch size, heads, source and target lengths) before it runs; fairseq
batches by length, so nearly every batch of a training run's first epoch has a shape not
seen before and waits for its plans (forward and backward), and from the second epoch on
the batches repeat and the plans are cached (docs/benchmarks.md, "GPU training
through fairseq's trainer": on an H200 the first epoch ran at a third of the later ones' speed, stock
fairseq's too).

``--sdpa-backends flash,efficient,math`` (a flag of the ``resnmt_translation`` task) lets
torch choose among the listed kernels only, for the whole process: training, validation
and decoding. The kernels compute the same attention (to rounding). Left empty (the
default), torch chooses as it always does. On the CPU torch's own kernels stand in for
``flash`` and ``math``; at least one of those two must be listed there.
"""
from typing import Iterable, Tuple

import torch

# the flag's names -> torch.backends.cuda's switch for each kernel
SDPA_BACKENDS = {
    "flash": "flash",
    "efficient": "mem_efficient",
    "cudnn": "cudnn",
    "math": "math",
}


def parse_sdpa_backends(text: str) -> Tuple[str, ...]:
    """``"flash,efficient"`` -> ``("flash", "efficient")``; one line naming a bad value and
    what is allowed."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    bad = [n for n in names if n not in SDPA_BACKENDS]
    if bad or not names:
        shown = ",".join(bad) if bad else repr(str(text))
        raise ValueError(f"--sdpa-backends {shown}: give a comma-separated list of {', '.join(SDPA_BACKENDS)}")
    return names


def sdpa_backends_enabled() -> Tuple[str, ...]:
    """The kernels torch may use now."""
    return tuple(n for n, switch in SDPA_BACKENDS.items() if getattr(torch.backends.cuda, f"{switch}_sdp_enabled")())


def use_sdpa_backends(names: Iterable[str]) -> Tuple[str, ...]:
    """Let torch's attention use exactly the kernels ``names`` (process-wide); returns the
    kernels enabled before, for putting them back."""
    chosen = parse_sdpa_backends(",".join(names))
    if not torch.cuda.is_available() and not {"flash", "math"} & set(chosen):
        raise ValueError(f"--sdpa-backends {','.join(chosen)}: without a GPU torch's attention runs only "
                         "flash or math; list one of them")
    before = sdpa_backends_enabled()
    for name, switch in SDPA_BACKENDS.items():
        getattr(torch.backends.cuda, f"enable_{switch}_sdp")(name in chosen)
    return before
