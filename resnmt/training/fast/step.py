"""``--fast-path``'s update without host synchronisation: :class:`FastPathTrainer`.

fairseq's ``Trainer.train_step`` waits for the device several times an update: it reads
the gradient norm to check it is finite and to decide on clipping, and it turns the
logged loss, nll_loss and gradient norm into Python floats every update (its legacy
return value). On a GPU each read stops the host from queueing the next update while
the device still runs this one. :class:`FastPathTrainer` (a ``Trainer``; fairseq-train
builds it in place of fairseq's when the task's ``--fast-path`` is set) runs the same
update with no read of a device value:

* forward and backward of each micro-batch (``--update-freq``) through the task's
  ``train_step`` as fairseq's, the losses summed on the device;
* the update of :class:`~resnmt.training.fast.update.DeviceUpdate`: the gradients times
  ``world size / sample size``, norm, clipping, fairseq's adam on the float32 (master)
  weights, the master weights into the ``--bf16`` model, the gradients zeroed;
* fairseq's metrics get device tensors (its meters sum them on the device and read them
  when ``--log-interval`` prints); the token and sentence counts are the batch's own host
  integers (over several ranks summed over a CPU (gloo) group, so that the device is not
  waited for either);
* a non-finite gradient norm sets a flag on the device; the flag is read every
  ``--log-interval`` updates, before validation and before a checkpoint is saved, and a
  set flag stops training with one line naming the updates it happened among (fairseq
  stops at the update itself; the fast path cannot know which update without waiting).

On CUDA the forward-backward of each batch shape and the update are captured as CUDA
graphs and replayed (``capture.py``; ``--no-step-capture`` runs them eagerly), all of them
warmed up and recorded before the first update on synthetic batches of each bucket's shape
(:meth:`FastPathTrainer.prime_graphs`; the state they touched put back), a shape that
cannot be recorded running eagerly with one line; a ``.grad`` set to None by fairseq or
torch is bound back before each update (``DeviceUpdate.hold_grads``). This
needs every step of the model free of host reads too: :func:`use_static_padding` asks
the model's modules that offer it to always pass the padding masks. Every attention
sublayer trains through ``scaled_dot_product_attention`` with the call pattern its fast
kernels take (``attention.py``), and the decoder's causal-mask cache is built once at its
longest (:func:`presize_future_masks`). On CUDA the criterion's loss and its gradient come
from one Triton kernel reading the logits (``fused_loss.py``), with no float32
log-probabilities over the vocabulary.

What it supports: float32 and ``--bf16`` (resnmt-train's), ``--update-freq``, data
parallel training (``--ddp-backend pytorch_ddp``/``legacy_ddp``; eager there), fairseq's
``adam`` or resnmt's ``adam_fused`` (their math: ``update.py``), the
``cross_entropy``/``label_smoothed_cross_entropy`` criteria. Everything else stops at
start-up with one line (:func:`unsupported`): ``--fp16``/``--amp`` (dynamic loss scaling
reads the norm every update), EMA, BMUF, fully sharded or model-parallel training,
quantization, ``--sentence-avg`` and ``--report-accuracy`` (the first would count the
shape buckets' dummy rows, the second reads counts on the host every batch). A
researcher who turned the fast path on is told rather than silently given fairseq's step.
"""
import contextlib
import logging
import time
from itertools import chain
from typing import Optional

import torch
from fairseq import metrics
from fairseq.distributed import utils as fairseq_distributed
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.trainer import Trainer

from resnmt.training.compile import CUDA_GRAPH_MODES
from resnmt.training.fast.attention import use_sdpa_attention
from resnmt.training.fast.update import DeviceUpdate

logger = logging.getLogger(__name__)

CRITERIA = ("cross_entropy", "label_smoothed_cross_entropy")
OPTIMIZERS = ("adam", "adam_fused")
DDP_BACKENDS = ("pytorch_ddp", "legacy_ddp", "c10d", "no_c10d")


def _name(node) -> Optional[str]:
    return getattr(node, "_name", None) if node is not None else None


def unsupported(cfg) -> Optional[str]:
    """The one line saying what of ``cfg`` (fairseq's whole training configuration) the
    fast path does not run, and what to do instead; None where it runs it."""
    common, optimization, dist = cfg.common, cfg.optimization, cfg.distributed_training
    fix_precision = "train with --bf16 (resnmt-train) or in float32"
    if common.fp16 or common.memory_efficient_fp16:
        return ("--fast-path with --fp16: fp16's dynamic loss scaling reads the gradient norm on the host every "
                f"update; {fix_precision}")
    if common.amp:
        return f"--fast-path with --amp: its loss scaler reads the gradient norm every update; {fix_precision}"
    if common.memory_efficient_bf16:
        return "--fast-path with --memory-efficient-bf16: it steps float32 master weights; train with --bf16"
    if common.tpu:
        return "--fast-path with --tpu: it is built for CUDA (and runs on the CPU); train without --tpu"
    if getattr(common, "quantization_config_path", None):
        return "--fast-path with --quantization-config-path: not supported; train without one of them"
    if common.model_parallel_size > 1 or dist.pipeline_model_parallel:
        return "--fast-path with model-parallel or pipeline training: not supported; train without one of them"
    if str(dist.ddp_backend) not in DDP_BACKENDS:
        return (f"--fast-path with --ddp-backend {dist.ddp_backend}: not supported (supported: "
                f"{', '.join(DDP_BACKENDS)})")
    if optimization.use_bmuf:
        return "--fast-path with --use-bmuf: not supported; train without one of them"
    if cfg.ema.store_ema:
        return "--fast-path with --store-ema: not supported; average checkpoints with resnmt-average instead"
    criterion = _name(cfg.criterion)
    if criterion not in CRITERIA:
        return f"--fast-path with --criterion {criterion}: supported criteria: {', '.join(CRITERIA)}"
    if getattr(cfg.criterion, "sentence_avg", False):
        return ("--fast-path with --sentence-avg: the shape buckets' dummy rows would count as sentences; "
                "train without one of them")
    if getattr(cfg.criterion, "report_accuracy", False):
        return "--fast-path with --report-accuracy: it reads counts on the host every batch; train without it"
    task = cfg.task
    if (getattr(task, "compile_layers", False) and str(getattr(task, "compile_mode", "default")) in CUDA_GRAPH_MODES
            and not getattr(task, "no_step_capture", False)):
        return (f"--fast-path with --compile-mode {task.compile_mode}: the fast path records whole steps as CUDA "
                "graphs itself; compile with --compile-mode default or max-autotune-no-cudagraphs, or add "
                "--no-step-capture to let torch.compile record them")
    optimizer = _name(cfg.optimizer)
    if optimizer not in OPTIMIZERS:
        return f"--fast-path with --optimizer {optimizer}: supported optimizers: {', '.join(OPTIMIZERS)}"
    if getattr(cfg.optimizer, "fp16_adam_stats", False):
        return "--fast-path with --fp16-adam-stats: not supported; train without it"
    return None


def check_fast_path(cfg) -> None:
    reason = unsupported(cfg)
    if reason:
        raise ValueError(reason)


def presize_future_masks(model) -> int:
    """Build every decoder's causal-mask cache (fairseq's ``_future_mask``) once at the
    longest target the decoder takes, on its device and in its dtype: fairseq rebuilds it
    (new memory) whenever a batch is longer than the cache, and validation's longest target
    may be longer than any training batch, which would leave a recorded step reading freed
    memory. Returns how many decoders."""
    decoders = [m for m in model.modules() if isinstance(m, TransformerDecoderBase)]
    for decoder in decoders:
        weight = next(decoder.parameters())
        decoder.buffered_future_mask(torch.empty(int(decoder.max_positions()), 1, device=weight.device,
                                                 dtype=weight.dtype))
    return len(decoders)


def use_static_padding(model) -> int:
    """Ask every module of ``model`` whose class declares ``static_padding`` (resnmt's encoder
    and decoder, :class:`~resnmt.models.encoder_decoder.ResidualStack`) to pass its padding mask
    whether or not a batch holds padding (deciding that reads the mask on the host); returns
    how many modules offer it."""
    modules = [m for m in model.modules() if isinstance(getattr(type(m), "static_padding", None), bool)]
    for m in modules:
        m.static_padding = True
    return len(modules)


class FastPathTrainer(Trainer):
    """fairseq's Trainer whose ``train_step`` reads no device value (module docstring).

    ``graphs``: a :class:`~resnmt.training.fast.capture.StepGraphs` to run the steps
    through (tests inject one with a fake graph); by default one capturing CUDA graphs
    on a single CUDA device unless the task's ``--no-step-capture``, else none (eager)."""

    def __init__(self, cfg, task, model, criterion, quantizer=None, graphs=None):
        check_fast_path(cfg)
        super().__init__(cfg, task, model, criterion, quantizer)
        self.static_padding_modules = use_static_padding(self._model)
        self.sdpa_attention_modules = use_sdpa_attention(
            self._model, right_padded_targets=not getattr(task.cfg, "left_pad_target", False))
        presize_future_masks(self._model)
        from resnmt.training.fast.fused_loss import use_fused_loss

        use_fused_loss(self._criterion, self.device)
        self._graphs = graphs
        self._update: Optional[DeviceUpdate] = None
        self._checked_through = 0  # the updates up to here had finite gradient norms
        self._host_group = None

    # ------------------------------------------------------------------ set-up

    def capture_wanted(self) -> bool:
        """Capture where it applies: one CUDA device, not ``--no-step-capture``, and a model
        whose forward reads nothing on the host (its modules offer ``static_padding``)."""
        if not self.cuda or getattr(self.task.cfg, "no_step_capture", False):
            return False
        if self.data_parallel_world_size > 1:
            logger.warning("[fast path] %d ranks: the steps run eagerly (captured CUDA graphs are for one GPU)",
                           self.data_parallel_world_size)
            return False
        if not self.static_padding_modules:
            logger.warning("[fast path] this model asks on the host whether a batch holds padding (none of its "
                           "modules offers static_padding); the steps run eagerly, not as CUDA graphs")
            return False
        return True

    def device_update(self) -> DeviceUpdate:
        """The update (built at the first one, and again after a checkpoint is loaded)."""
        if self._update is None:
            params = [p for p in chain(self.model.parameters(), self.criterion.parameters()) if p.requires_grad]
            self._update = DeviceUpdate(self.optimizer, params, self.cfg.optimization.clip_norm, self.device)
            if self._graphs is None and self.capture_wanted():
                from resnmt.training.fast.capture import StepGraphs

                self._graphs = StepGraphs.for_cuda()
            if self._graphs is not None:  # every batch shape and the update run eagerly before a capture
                self._graphs.keys_before_capture = len(self.batch_shapes()) + 1
            logger.info("[fast path] the update on the %s (%s), %s", self.device.type,
                        "bf16 model, float32 master weights" if self._update.master else "float32",
                        "each step captured once per batch shape as a CUDA graph" if self._graphs is not None
                        else "steps run eagerly")
            logger.info("[fast path] Adam: %s", "one Triton kernel launch over every parameter"
                        if self._update.adam_kernel == "triton" else "multi-tensor operations")
            logger.info("[fast path] loss: %s", "one Triton kernel from the logits (no float32 log-probabilities)"
                        if self.loss_kernel == "triton" else "fairseq's criterion")
            if self._graphs is not None:
                self.prime_graphs()
        return self._update

    @property
    def loss_kernel(self) -> str:
        """``triton`` where the criterion's loss runs the fused kernel (``fused_loss.py``),
        else ``fairseq``."""
        from resnmt.training.fast.fused_loss import FusedCompute

        return "triton" if FusedCompute.on(self._criterion) else "fairseq"

    def prime_graphs(self) -> None:
        """Warm up and record every bucket's step and the update before the first counted
        update, on synthetic batches of each bucket's shape, and put back every weight,
        moment, gradient and buffer they changed: no recording happens inside a timed
        window, and a shape that cannot be recorded is known (and run eagerly) from the start."""
        from resnmt.training.fast.buckets import BucketedPairDataset

        dataset = self.task.datasets.get(self.cfg.dataset.train_subset)
        if not isinstance(dataset, BucketedPairDataset) or dataset.rows is None:
            return
        update, graphs = self._update, self._graphs
        samples = [self._prepare_sample(dataset.synthetic_batch(k))[0] for k in range(len(dataset.shapes()))]
        state = {id(t): t for t in chain(self.model.state_dict(keep_vars=True).values(),
                                          self.criterion.state_dict(keep_vars=True).values(), update.state_tensors())}
        saved = [(t, t.detach().clone()) for t in state.values()]
        start, update_num = time.perf_counter(), self.get_num_updates()
        for _ in range(graphs.warmup + 1):  # the warm-ups, then the recordings (each replayed once)
            for sample in samples:
                self._forward_backward(sample, update_num, ignore_grad=False)
            update.prepare(grad_scale=1.0, lr=0.0)
            graphs.run("update", lambda _: update(), ())
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)
        graphs.synchronize()
        self._set_seed()  # the update's random numbers as if nothing had run before it
        logger.info("[fast path] %d shapes and the update recorded before training in %.1f s (%d graphs, %d shapes "
                    "eager)", len(samples), time.perf_counter() - start, len(graphs.captures), len(graphs.failures))

    def batch_shapes(self) -> list:
        """The training batches' shapes (the shape buckets'; none known otherwise)."""
        from resnmt.training.fast.buckets import BucketedPairDataset

        dataset = self.task.datasets.get(self.cfg.dataset.train_subset)
        return dataset.shapes() if isinstance(dataset, BucketedPairDataset) and dataset.rows is not None else []

    def load_checkpoint(self, *args, **kwargs):
        """fairseq's; the optimizer's state tensors it loads are new, so the update (and
        any graph captured over the old ones) is built again."""
        extra_state = super().load_checkpoint(*args, **kwargs)
        self._reset_update()
        return extra_state

    def _reset_update(self):
        self._update = None
        if self._graphs is not None:
            self._graphs.clear()

    # ------------------------------------------------------------------ the update

    def _forward_backward(self, sample, update_num: int, ignore_grad: bool) -> dict:
        """One micro-batch's forward and backward; its logging output's device tensors."""
        def step(batch):
            _, _, logging_output = self.task.train_step(
                sample=batch, model=self.model, criterion=self.criterion, optimizer=self.optimizer,
                update_num=update_num, ignore_grad=ignore_grad)
            return {k: v for k, v in logging_output.items() if torch.is_tensor(v)}

        if self._graphs is None:
            return step(sample)
        if ignore_grad:
            raise RuntimeError("--fast-path: a captured step cannot take a dummy batch")
        if hasattr(self.model, "set_num_updates"):  # task.train_step's, which a replay does not run
            self.model.set_num_updates(update_num)
        return self._graphs.run("forward_backward", step, sample)

    def _maybe_no_sync(self, i: int, n: int):
        """fairseq's: gradients all-reduced at the last micro-batch only."""
        if self.data_parallel_world_size > 1 and hasattr(self.model, "no_sync") and i < n - 1:
            return self.model.no_sync()
        return contextlib.ExitStack()

    def train_step(self, samples, raise_oom=False):
        """Forward, backward and update of ``samples`` (the micro-batches of one update)
        with no read of a device value. Returns the update's summed logging outputs
        (``loss``, ``nll_loss``: device tensors, unread) with ``sample_size``,
        ``ntokens``, ``nsentences`` and the gradient norm ``gnorm`` (a device tensor)."""
        self._set_seed()
        self.model.train()
        self.criterion.train()
        metrics.log_start_time("train_wall", priority=800, round=0)
        update = self.device_update()
        update.hold_grads()  # a .grad set to None or replaced since: the recorded steps write the held ones
        update_num = self.get_num_updates()

        sums, counts = {}, {"sample_size": 0, "ntokens": 0, "nsentences": 0}
        for i, sample in enumerate(samples):
            sample, is_dummy = self._prepare_sample(sample)
            with self._maybe_no_sync(i, len(samples)):
                out = self._forward_backward(sample, update_num, ignore_grad=is_dummy)
            for k, v in out.items():  # new tensors: a replay's outputs are overwritten by the next one
                sums[k] = v.detach().clone() if k not in sums else sums[k] + v
            if not is_dummy:
                counts["sample_size"] += int(sample["ntokens"])
                counts["ntokens"] += int(sample["ntokens"])
                counts["nsentences"] += int(sample.get("nsentences", sample["target"].size(0)))
        if self.data_parallel_world_size > 1:
            sums, counts = self._all_reduce(sums, counts)
            self.optimizer.all_reduce_grads(self.model)

        update.prepare(grad_scale=self.data_parallel_world_size / (counts["sample_size"] or 1.0), lr=self.get_lr())
        gnorm = update() if self._graphs is None else self._graphs.run("update", lambda _: update(), ()).clone()
        update.advance()

        logging_output = {**sums, **counts}
        self.task.reduce_metrics([logging_output], self.get_criterion())
        metrics.log_speed("ups", 1.0, priority=100, round=2)
        metrics.log_scalar("gnorm", gnorm, priority=400, round=3)
        clip = self.cfg.optimization.clip_norm
        if clip > 0:
            metrics.log_scalar("clip", (gnorm > clip).float() * 100, priority=500, round=1)
        if self._graphs is not None:
            metrics.log_scalar("graphs", len(self._graphs.captures), weight=0, priority=1100, round=0)
        self.set_num_updates(update_num + 1)
        if self.cuda and self.cuda_env is not None:
            gb_used = torch.cuda.max_memory_allocated() / 1024 ** 3
            torch.cuda.reset_peak_memory_stats()
            metrics.log_scalar("gb_free", self.cuda_env.total_memory_in_GB - gb_used, priority=1500, round=1, weight=0)
        if self.get_num_updates() % self.cfg.common.log_interval == 0:
            self.check_finite()
        metrics.log_stop_time("train_wall")
        return {**logging_output, "gnorm": gnorm}

    def _all_reduce(self, sums: dict, counts: dict):
        """``sums`` (device tensors) summed over the ranks on the device, ``counts`` (host
        integers) over a CPU group: neither waits for the device."""
        keys = sorted(sums)
        if keys:
            buf = torch.stack([sums[k].float() for k in keys])
            fairseq_distributed.all_reduce(buf, group=self.data_parallel_process_group)
            sums = dict(zip(keys, buf.unbind(0)))
        names = list(counts)
        host = torch.tensor([counts[k] for k in names], dtype=torch.float64)
        torch.distributed.all_reduce(host, group=self._cpu_group())
        return sums, {k: int(v) for k, v in zip(names, host.tolist())}

    def _cpu_group(self):
        """A gloo group of the data-parallel ranks for host values (the training group
        where it is gloo already)."""
        group = self.data_parallel_process_group
        if torch.distributed.get_backend(group) == "gloo":
            return group
        if self._host_group is None:
            ranks = (torch.distributed.get_process_group_ranks(group) if group is not None
                     else list(range(torch.distributed.get_world_size())))
            self._host_group = torch.distributed.new_group(ranks=ranks, backend="gloo")
        return self._host_group

    # ------------------------------------------------------------------ the deferred check

    def check_finite(self) -> None:
        """Read the non-finite flag (one wait for the device); a set flag stops training
        with one line naming the updates since the last read."""
        num_updates = self.get_num_updates()
        if self._update is None or num_updates <= self._checked_through:
            return
        if bool(self._update.nonfinite):
            raise FloatingPointError(
                f"gradients are NaN/Inf at an update among {self._checked_through + 1}-{num_updates} (--fast-path "
                "reads the gradient norm every --log-interval updates and before validating or saving, so the "
                "saved checkpoints are from before it); lower --lr or set --clip-norm, or rerun from the last "
                "checkpoint without --fast-path to stop at the update itself")
        self._checked_through = num_updates

    def begin_valid_epoch(self, epoch):
        self.check_finite()
        return super().begin_valid_epoch(epoch)

    def save_checkpoint(self, filename, extra_state):
        self.check_finite()
        return super().save_checkpoint(filename, extra_state)
