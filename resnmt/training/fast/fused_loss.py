"""fairseq's label-smoothed cross-entropy for the fast path straight from the logits: one
Triton kernel computes the loss and its gradient, and no float32 tensor over the vocabulary
is ever made.

fairseq's criteria (``label_smoothed_cross_entropy``, ``cross_entropy``) turn the decoder's
logits ``x`` (``N`` rows of ``V``, bf16 with ``--bf16``) into float32 log-probabilities
(``log_softmax``: an ``N x V`` float32 tensor, kept for the backward pass, whose gradient is
another), then gather and sum them (``label_smoothed_nll_loss``). With ``eps_i = eps / (V - 1)``
and ``lse`` a row's log-sum-exp, a row of target ``t`` costs::

    nll    = lse - x[t]                      smooth = V lse - sum_v x[v]
    loss   = (1 - eps - eps_i) nll + eps_i smooth
    d loss / d x[v] = softmax(x)[v] - eps_i - (1 - eps - eps_i) [v = t]

(the softmax's coefficients add up to 1). A padding row (its target the dictionary's pad,
fairseq's ``ignore_index``) costs nothing and gets no gradient. On CUDA each row is a program
of its own (under Triton's interpreter a program takes 32 rows): a first sweep over ``V`` in
blocks keeps a running maximum, the sum of exponentials scaled to it (the online
log-sum-exp) and the sum of the logits, all float32; a second sweep writes the gradient, in
the logits' dtype (bf16 rounded to nearest even, as torch rounds), where the logits need one.
:func:`label_smoothed_cross_entropy` returns the summed loss and ``nll_loss`` as fairseq's
criterion does; the backward pass multiplies the stored gradient by the incoming one (1 in
fairseq's trainer; 0 for its dummy batches), with no read on the host.

:func:`use_fused_loss` gives a criterion this loss (its ``compute_loss``) on CUDA where Triton
is installed; elsewhere, for a model whose log-probabilities are not a plain ``log_softmax``
of its output (an adaptive softmax), for ``--ignore-prefix-size`` or an unreduced loss,
fairseq's own runs. A kernel that fails at its first call (one line says why) leaves the loss
to fairseq's criterion from then on. tests/test_fused_loss_kernel.py checks it against
fairseq's ``label_smoothed_nll_loss`` under Triton's interpreter (``TRITON_INTERPRET=1``) and
compiles it for sm_90.
"""
import logging

import torch

from resnmt.fairseq_patches import Replacement

logger = logging.getLogger(__name__)

MAX_BLOCK = 4096  # logits of a row read at once
INTERPRETED_ROWS = 32  # rows a program takes off CUDA

try:
    import triton
    import triton.language as tl

    from resnmt.training.fast.fused_adam import _round_to_bf16
except ImportError:  # fairseq's criterion serves (use_fused_loss)
    triton = None


if triton is not None:
    @triton.jit
    def _label_smoothed_rows(X, TARGET, LOSS, NLL, DX, n_rows, stride, V, ignore_index, eps_i, confidence,
                             WITH_GRAD: tl.constexpr, BF16: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        real = rows < n_rows
        read = tl.minimum(rows, n_rows - 1)  # rows past the last read it (nothing of theirs is stored)
        target = tl.load(TARGET + read)
        kept = target != ignore_index
        starts = X + read[:, None] * stride
        cols = tl.arange(0, BLOCK)
        peak = tl.full([ROWS], float("-inf"), tl.float32)  # each row's largest logit so far
        scaled = tl.zeros([ROWS], tl.float32)  # its sum of exp(x - peak)
        total = tl.zeros([ROWS], tl.float32)   # its sum of x
        for start in range(0, V, BLOCK):
            inside = (start + cols < V)[None, :]
            x = tl.load(starts + start + cols[None, :], mask=inside, other=float("-inf")).to(tl.float32)
            new_peak = tl.maximum(peak, tl.max(x, axis=1))
            scaled = scaled * tl.exp(peak - new_peak) + tl.sum(tl.exp(x - new_peak[:, None]), axis=1)
            total += tl.sum(tl.where(inside, x, 0.0), axis=1)
            peak = new_peak
        lse = peak + tl.log(scaled)
        nll = lse - tl.load(X + read * stride + tl.where(kept, target, 0)).to(tl.float32)
        loss = confidence * nll + eps_i * (V * lse - total)
        tl.store(LOSS + rows, tl.where(kept, loss, 0.0), mask=real)
        tl.store(NLL + rows, tl.where(kept, nll, 0.0), mask=real)
        if WITH_GRAD:
            grad_starts = DX + read[:, None] * stride
            for start in range(0, V, BLOCK):
                inside = real[:, None] & (start + cols < V)[None, :]
                x = tl.load(starts + start + cols[None, :], mask=inside, other=0.0).to(tl.float32)
                hit = (start + cols)[None, :] == target[:, None]
                grad = tl.exp(x - lse[:, None]) - eps_i - tl.where(hit, confidence, 0.0)
                grad = tl.where(kept[:, None], grad, 0.0)
                if BF16:
                    tl.store(grad_starts + start + cols[None, :], _round_to_bf16(grad), mask=inside)
                else:
                    tl.store(grad_starts + start + cols[None, :], grad, mask=inside)


def _kernel():
    if triton is None:
        raise RuntimeError("fused cross-entropy: Triton is not installed")
    return _label_smoothed_rows


class _LabelSmoothedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, eps, ignore_index, with_grad, block, rows_per_program):
        x = logits.reshape(-1, logits.size(-1)).contiguous()  # (a copy only where it is not; the gradient's layout)
        rows, vocab = x.shape
        losses = torch.empty(rows, dtype=torch.float32, device=x.device)
        nlls = torch.empty_like(losses)
        grad = torch.empty_like(x) if with_grad else losses  # (not written without the gradient)
        eps_i = eps / (vocab - 1)
        _kernel()[(-(-rows // rows_per_program),)](
            x, target.reshape(-1), losses, nlls, grad, rows, x.stride(0), vocab, ignore_index, eps_i, 1.0 - eps - eps_i,
            WITH_GRAD=with_grad, BF16=x.dtype == torch.bfloat16, ROWS=rows_per_program, BLOCK=block)
        ctx.shape = logits.shape
        if with_grad:
            ctx.save_for_backward(grad)
        nll = nlls.sum()
        ctx.mark_non_differentiable(nll)
        return losses.sum(), nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_loss).view(ctx.shape), None, None, None, None, None, None  # in place: one backward pass


def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, eps: float, ignore_index: int,
                                 block: int = None, rows_per_program: int = None):
    """fairseq's ``label_smoothed_nll_loss(log_softmax(logits), target, eps, ignore_index,
    reduce=True)`` (module docstring): ``(loss, nll_loss)``, float32 sums; ``logits`` ``(...,
    V)`` float32 or bfloat16, ``target`` of its leading shape. ``block``: logits of a row read
    at once (a power of 2; default ``V``'s, at most ``MAX_BLOCK``); ``rows_per_program`` (a
    power of 2): 1 on CUDA, ``INTERPRETED_ROWS`` elsewhere (Triton's interpreter, whose cost is
    per operation). The loss's gradient is computed here, with the loss, where ``logits``
    needs one."""
    if logits.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"fused cross-entropy: logits in {logits.dtype}; it takes float32 and bfloat16")
    if target.shape != logits.shape[:-1] or logits.size(-1) < 2:
        raise ValueError(f"fused cross-entropy: logits {tuple(logits.shape)}, target {tuple(target.shape)}: give a "
                         "target per row of logits over at least 2 classes")
    vocab = logits.size(-1)
    block = block or min(MAX_BLOCK, 1 << (vocab - 1).bit_length())
    rows_per_program = rows_per_program or (1 if logits.is_cuda else INTERPRETED_ROWS)
    with_grad = torch.is_grad_enabled() and logits.requires_grad
    return _LabelSmoothedLoss.apply(logits, target.contiguous(), float(eps), int(ignore_index), with_grad, block,
                                    rows_per_program)


def kernel_wanted(device) -> bool:
    """Whether the loss takes the kernel on ``device``: on CUDA, where Triton is installed."""
    return torch.device(device).type == "cuda" and triton is not None


def plain_log_softmax(model) -> bool:
    """Whether ``model``'s (or its wrapper's module's) log-probabilities are fairseq's
    ``log_softmax`` of its decoder's output: no adaptive softmax, nothing overridden."""
    from fairseq.models import BaseFairseqModel, FairseqDecoder
    from fairseq.models.transformer import TransformerModelBase

    while not isinstance(model, BaseFairseqModel) and hasattr(model, "module"):
        model = model.module
    decoder = getattr(model, "decoder", None)
    return (isinstance(model, BaseFairseqModel) and isinstance(decoder, FairseqDecoder)
            and type(model).get_normalized_probs in (BaseFairseqModel.get_normalized_probs,
                                                     TransformerModelBase.get_normalized_probs)
            and type(model).get_normalized_probs_scriptable is BaseFairseqModel.get_normalized_probs_scriptable
            and type(decoder).get_normalized_probs is FairseqDecoder.get_normalized_probs
            and type(decoder).get_normalized_probs_scriptable is FairseqDecoder.get_normalized_probs_scriptable
            and getattr(decoder, "adaptive_softmax", None) is None)


class FusedCompute(Replacement):
    """A criterion's ``compute_loss(model, net_output, sample, reduce)`` through
    :func:`label_smoothed_cross_entropy` where the model's log-probabilities are a plain
    ``log_softmax`` and the loss is summed, else fairseq's (module docstring). A kernel that
    fails at its first call for a dtype, with or without the gradient, gives the criterion back
    its own ``compute_loss``, with one line."""

    method = "compute_loss"

    def __init__(self, criterion):
        super().__init__(criterion)
        self.criterion = criterion
        self.eps = float(getattr(criterion, "eps", 0.0))  # cross_entropy: none
        self.checked = set()  # the (dtype, gradient) calls that ran
        self.calls = 0  # the calls that took the kernel

    def __call__(self, model, net_output, sample, reduce=True):
        if not reduce or not plain_log_softmax(model):
            return self.eager(model, net_output, sample, reduce=reduce)
        logits = net_output[0]
        key = (logits.dtype, torch.is_grad_enabled() and logits.requires_grad)
        try:
            loss, nll_loss = label_smoothed_cross_entropy(logits, model.get_targets(sample, net_output), self.eps,
                                                          self.criterion.padding_idx)
        except Exception as error:
            if key in self.checked:
                raise
            logger.warning("[fast path] the fused cross-entropy kernel failed (%s: %s); the loss runs as fairseq's "
                           "criterion", type(error).__name__, (str(error).strip().splitlines() or [""])[0])
            self.take_off()
            return self.eager(model, net_output, sample, reduce=reduce)
        self.checked.add(key)
        if not torch.compiler.is_compiling():
            self.calls += 1
        return loss, nll_loss


def fusable(criterion) -> bool:
    """Whether ``criterion`` computes its loss with fairseq's own ``compute_loss`` of
    ``label_smoothed_cross_entropy`` (no ``--ignore-prefix-size``) or ``cross_entropy``."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    own = type(criterion).compute_loss
    if own is LabelSmoothedCrossEntropyCriterion.compute_loss:
        return criterion.ignore_prefix_size == 0
    return own is CrossEntropyCriterion.compute_loss


def use_fused_loss(criterion, device) -> bool:
    """Give ``criterion`` the fused ``compute_loss`` (:class:`FusedCompute`) where the kernel
    runs on ``device`` (:func:`kernel_wanted`) and the criterion is one it computes
    (:func:`fusable`); returns whether it has it. Calling it again changes nothing."""
    if FusedCompute.on(criterion):
        return True
    if not kernel_wanted(device) or not fusable(criterion):
        return False
    FusedCompute.put_on(criterion)
    return True
