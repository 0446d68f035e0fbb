"""The benchmarks' own training loop over fairseq's model (speed.py's measurements,
profile_ops.py's profiles, fp16.py's first step): fairseq-train's training batches, Adam
with fairseq's half-precision scheme, and one update.
"""
from itertools import islice

# the precisions a benchmark trains in, as torch names them
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def training_batches(task, max_tokens, n, *, seed=1, max_positions=(1024, 1024), max_sentences=None,
                     required_batch_size_multiple=8, at_most=False):
    """The first ``n`` training batches of epoch 1 (the train split loaded) as fairseq-train
    batches them: shuffled with ``seed``, sentences longer than ``max_positions`` left out
    (``at_most``: all of the epoch's where it has fewer; else an epoch too short raises)."""
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens, max_sentences=max_sentences,
        max_positions=max_positions, ignore_invalid_inputs=True,
        required_batch_size_multiple=required_batch_size_multiple, seed=seed,
    ).next_epoch_itr(shuffle=True)
    return list(islice(itr, n)) if at_most else [next(itr) for _ in range(n)]


# fp16's initial loss scale (fairseq's dynamic scaler starts at 128 too); halved at each
# overflow, never raised (a measurement is a few dozen updates)
FP16_LOSS_SCALE = 128.0


class Optimizer:
    """Adam (0.9/0.98) on the model's weights; for a half-precision model, fairseq's
    ``--fp16``/``--bf16`` scheme: float32 master weights stepped by Adam, gradients copied
    up (and unscaled for fp16), the half weights copied back after each step."""

    def __init__(self, model, dtype):
        import torch

        self.params = [p for p in model.parameters() if p.requires_grad]
        self.half = dtype != torch.float32
        self.loss_scale = FP16_LOSS_SCALE if dtype == torch.float16 else 1.0
        self.overflows = 0
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params] if self.half else self.params
        self.adam = torch.optim.Adam(self.masters, lr=1e-4, betas=(0.9, 0.98), eps=1e-8)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def backward(self, loss):
        (loss * self.loss_scale).backward() if self.loss_scale != 1.0 else loss.backward()

    def step(self):
        """Adam's step; in fp16 an update whose gradients overflowed is skipped and the loss
        scale halved, as fairseq's dynamic loss scaler does (so the weights stay finite)."""
        import torch

        if self.half:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    m.grad = None if p.grad is None else p.grad.float().div_(self.loss_scale)
                grads = [m.grad for m in self.masters if m.grad is not None]
                if self.loss_scale != 1.0 and not all(torch.isfinite(g).all() for g in grads):
                    self.loss_scale /= 2
                    self.overflows += 1
                    return
        self.adam.step()
        if self.half:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)


def train_step(model, optimizer, batch, pad):
    """One update: label-smoothed (0.1) cross-entropy, backward, optimizer step."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    model.train()
    optimizer.zero_grad()
    net_output = model(**batch["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), batch["target"].view(-1), 0.1,
                                      ignore_index=pad, reduce=True)
    optimizer.backward(loss)
    optimizer.step()
