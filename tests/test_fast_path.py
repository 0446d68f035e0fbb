"""``--fast-path`` (resnmt/training/fast/) on the CPU, with real Multi30k data.

* shape buckets: every batch has one of the buckets' shapes, every training sentence is
  in exactly one batch per epoch, the batches do not depend on the starting epoch, the
  logged padding is the padding the batches hold, and dummy rows change neither the
  loss, nll_loss, ntokens nor the gradients;
* the sync-free update: per-update losses and the parameters after 20 updates equal
  fairseq's own ``Trainer.train_step`` on the same batches (float32 with clipping, --bf16
  with --update-freq 2; every kind of connection: the contract's fast-path check,
  tests/test_contract.py), it reads no device value on the host
  but for the model lines that decide on padding, a NaN/Inf gradient norm stops training
  at the log interval naming the updates, and a run saved and resumed continues exactly;
* the captured steps, with graphs of recorded operations replayed on the recorded tensors
  (tests/cpu_graph.py: a CUDA graph's semantics on the CPU): every shape recorded once at
  start-up, replayed afterwards with its inputs copied into the static buffers, the same
  training as eager; a shape that cannot be recorded runs eagerly with one line; gradients
  set to None, validation on longer targets and checkpoints leave the graphs' tensors alone;
* ``resnmt-train --fast-path`` and ``fairseq-train --user-dir resnmt --fast-path`` end to end,
  and the one-line refusal of what the fast path does not run.
"""
import contextlib
import linecache
import math
import sys
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

from conftest import REPO_ROOT, run_cli
from cpu_graph import HOST_TENSOR_LINES, op_capture
from model_utils import TINY
from resnmt import fairseq_patches
from resnmt.training import fast
from resnmt.connections import BUILTIN_KINDS
from resnmt.training.bf16 import untie_bf16_from_tpu
from resnmt.training.fast.attention import use_sdpa_attention
from resnmt.training.fast.buckets import BucketedPairDataset, bucket_batch_size, bucket_sizes
from resnmt.training.fast.capture import StepGraphs, describe_key
from resnmt.training.fast.step import FastPathTrainer, unsupported
from resnmt.training.fast.update import DeviceUpdate

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_job.sh "
                          "part 5 runs it)")

MAX_TOKENS = 600


@pytest.fixture(autouse=True)
def fairseq_trains_own_trainer_afterwards():
    """A --fast-path task makes fairseq-train's Trainer the fast one, process-wide."""
    yield
    fairseq_patches.remove("fast-path-trainer")


def train_argv(data, *extra, cpu=True):
    return [str(data), "--task", "resnmt_translation", "--fast-path", "--arch", "transformer_sas_base", *TINY,
            "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--max-tokens", str(MAX_TOKENS), "--seed", "3", *(["--cpu"] if cpu else []),
            *extra]


def config(data, *extra, drop=(), cpu=True):
    """fairseq-train's configuration of ``train_argv`` without the flags ``drop`` (and their values)."""
    argv = train_argv(data, *extra, cpu=cpu)
    for flag in drop:
        i = argv.index(flag)
        del argv[i:i + 2]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    untie_bf16_from_tpu(args, argv)  # resnmt-train's --bf16
    return convert_namespace_to_omegaconf(args)


def build(data, trainer_cls, *extra, cpu=True, **kwargs):
    """``(trainer, task)`` as fairseq-train builds them (the same weights for the same flags);
    on the CPU, or on the CUDA device where ``cpu`` is False."""
    cfg = config(data, *extra, cpu=cpu)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return trainer_cls(cfg, task, model, task.build_criterion(cfg.criterion), **kwargs), task


def epoch_batches(task, epoch=1, start_epoch=1):
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=MAX_TOKENS, seed=3, epoch=start_epoch,
                                  required_batch_size_multiple=8, max_positions=(1024, 1024))
    while itr.next_epoch_idx < epoch:
        list(itr.next_epoch_itr(shuffle=True))
    return list(itr.next_epoch_itr(shuffle=True))


def exact_loss(out):
    """An update's loss per target token in nats (the fast path's summed device values)."""
    return float(out["loss"]) / out["sample_size"]


# ------------------------------------------------------------------ shape buckets

def test_bucket_sizes_make_the_fewest_token_slots():
    sizes = [1] * 4 + [5] * 4 + [6] + [10]
    # slots: {1, 10}: 4 + 6 x 10 = 64; {5, 10}: 8 x 5 + 2 x 10 = 60; {6, 10}: 9 x 6 + 10 = 64
    assert bucket_sizes(sizes, 2).tolist() == [5, 10]
    # batches of 3 rows, the last of a bucket filled: {1, 10}: 6 x 1 + 6 x 10 = 66; {5, 10}: 9 x 5 + 3 x 10 = 75
    assert bucket_sizes(sizes, 2, rows_of=lambda size: 3).tolist() == [1, 10]
    assert bucket_sizes(sizes, 8).tolist() == [1, 5, 6, 10]  # no more buckets than sizes
    assert bucket_sizes(sizes, 2, multiple=4).tolist() == [8, 12]  # rounded up: 4 4 4 4 8 8 8 8 8 12
    with pytest.raises(ValueError, match="--shape-buckets 0"):
        bucket_sizes(sizes, 0)
    # the dynamic programme finds what trying every choice finds
    from itertools import combinations

    gen = np.random.default_rng(0)
    for _ in range(20):
        sizes = gen.integers(1, 30, size=int(gen.integers(5, 60)))
        values = np.unique(sizes)
        k = int(gen.integers(1, 5))
        rows = lambda size: max(1, 40 // size)  # noqa: E731

        def slots(edges):
            bucket = np.searchsorted(edges, sizes)
            return sum(-(-int((bucket == i).sum()) // rows(e)) * rows(e) * e for i, e in enumerate(edges))

        best = min(slots(list(c) + [values[-1]]) for m in range(min(k, len(values)))
                   for c in combinations(values[:-1], m))
        assert slots(bucket_sizes(sizes, k, rows_of=rows).tolist()) == best


def test_rows_per_batch_fill_max_tokens_in_multiples():
    assert bucket_batch_size(30, 600, None, 8) == 16  # 20 fit
    assert bucket_batch_size(100, 600, None, 8) == 6  # fewer than 8 fit: all of them
    assert bucket_batch_size(10, 600, 24, 8) == 24  # --batch-size caps
    with pytest.raises(ValueError, match="--max-tokens 600: a shape bucket pads sentences to 700 tokens"):
        bucket_batch_size(700, 600, None, 8)


def test_buckets_give_fixed_shapes_and_every_sentence_once_per_epoch(tiny_bin):
    _, task = build(tiny_bin, FastPathTrainer)
    first, second = epoch_batches(task, 1), epoch_batches(task, 2)
    dataset = task.dataset("train")
    assert isinstance(dataset, BucketedPairDataset)
    shapes = dataset.shapes()
    assert 2 <= len(shapes) <= 8  # --shape-buckets 8 (the default); rounding merges equal quantiles
    for rows, src, tgt in shapes:
        assert rows * max(src, tgt) <= MAX_TOKENS and (rows % 8 == 0 or rows * 2 * max(src, tgt) > MAX_TOKENS)
    sentences = len(dataset)
    for batches in (first, second):
        ids = []
        for b in batches:
            shape = (b["target"].size(0), b["net_input"]["src_tokens"].size(1), b["target"].size(1))
            assert shape in shapes
            assert b["net_input"]["prev_output_tokens"].shape == b["target"].shape
            real = b["id"] >= 0
            assert b["nsentences"] == int(real.sum()) and bool(real[:b["nsentences"]].all())
            ids += b["id"][real].tolist()
        assert sorted(ids) == list(range(sentences))  # each sentence exactly once
    # the same batches every epoch, in another order (fairseq's per-epoch shuffling)
    as_sets = lambda batches: [tuple(sorted(b["id"].tolist())) for b in batches]  # noqa: E731
    assert sorted(as_sets(first)) == sorted(as_sets(second)) and as_sets(first) != as_sets(second)
    # and the padding reported is the padding the batches hold
    pad = task.source_dictionary.pad()
    slots = sum(b["net_input"]["src_tokens"].numel() + b["target"].numel() for b in first)
    pads = sum(int(b["net_input"]["src_tokens"].eq(pad).sum()) + int(b["target"].eq(pad).sum()) for b in first)
    dummy_eos = sum(int((b["id"] < 0).sum()) for b in first)  # a dummy row's source eos is a token slot too
    padding = dataset.padding
    assert padding["sentences"] == sentences and padding["batches"] == len(first)
    assert padding["padding_fraction"] == pytest.approx((pads + dummy_eos) / slots)
    assert 0 < padding["fairseq_padding_fraction"] < padding["padding_fraction"] < 1


def test_buckets_do_not_depend_on_the_starting_epoch(tiny_bin):
    """resnmt_translation builds the training batches as at epoch 1 (exact resumption)."""
    _, fresh = build(tiny_bin, FastPathTrainer)
    _, resumed = build(tiny_bin, FastPathTrainer)
    from_start = epoch_batches(fresh, epoch=2)
    from_epoch_2 = epoch_batches(resumed, epoch=2, start_epoch=2)
    assert [b["id"].tolist() for b in from_start] == [b["id"].tolist() for b in from_epoch_2]


def test_dummy_rows_leave_loss_and_gradients_unchanged(tiny_bin):
    trainer, task = build(tiny_bin, FastPathTrainer, "--dropout", "0")
    epoch_batches(task)  # builds the buckets
    dataset = task.dataset("train")
    model, criterion = trainer.model, trainer.criterion
    samples = [dataset[i] for i in range(5)]
    plain = dataset.dataset.collater(samples)  # fairseq's batch: 5 rows, padded to the longest
    bucketed = dataset.collater(samples)
    assert bucketed["target"].size(0) > 5 and bucketed["ntokens"] == plain["ntokens"]

    def loss_and_grads(batch):
        model.zero_grad(set_to_none=True)
        loss, sample_size, log = criterion(model, batch)
        loss.backward()
        return loss.item(), log["nll_loss"].item(), sample_size, [p.grad.clone() for p in model.parameters()]

    loss, nll, size, grads = loss_and_grads(plain)
    loss_b, nll_b, size_b, grads_b = loss_and_grads(bucketed)
    assert size_b == size
    assert loss_b == pytest.approx(loss, rel=1e-5) and nll_b == pytest.approx(nll, rel=1e-5)
    for g, g_b in zip(grads, grads_b):
        torch.testing.assert_close(g_b, g, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ the sync-free update

def run_both(data, updates, update_freq, *extra, same_attention=True, batches=None):
    """fairseq's Trainer and the fast path over the same batches: their per-update losses.
    ``same_attention``: fairseq's model attends through the fast path's SDPA calls too (the
    update compared alone; tests/test_fast_attention.py compares the attention)."""
    ref, task = build(data, Trainer, *extra)
    if same_attention:
        use_sdpa_attention(ref.model)
    fast_trainer, _ = build(data, FastPathTrainer, *extra)
    batches = batches or epoch_batches(task)
    ref_losses, fast_losses = [], []
    for i in range(updates):
        samples = [batches[(update_freq * i + j) % len(batches)] for j in range(update_freq)]
        ref.train_step(samples)
        ref_losses.append(ref._probe_loss)
        fast_losses.append(exact_loss(fast_trainer.train_step(samples)))
    return ref, fast_trainer, ref_losses, fast_losses


@pytest.fixture
def probe_fairseq_losses(monkeypatch):
    """fairseq's Trainer keeps each update's exact loss per token (nats) in ``_probe_loss``."""
    reduce = Trainer._reduce_and_log_stats

    def probe(self, logging_outputs, sample_size, grad_norm=None):
        self._probe_loss = sum(float(log["loss"]) for log in logging_outputs) / float(sample_size)
        return reduce(self, logging_outputs, sample_size, grad_norm)

    monkeypatch.setattr(Trainer, "_reduce_and_log_stats", probe)


@pytest.mark.parametrize("precision, update_freq, updates", [
    ("bf16", 2, 3), pytest.param("fp32", 1, 20, marks=pytest.mark.slow),
    pytest.param("bf16", 2, 20, marks=pytest.mark.slow)])
def test_update_equals_fairseqs_trainer(tiny_bin, probe_fairseq_losses, precision, update_freq, updates):
    """Dropout on, --clip-norm active: the same losses and weights as fairseq's step (on the
    same attention: the update's claim; float32, 3 updates of every kind and of the cases of
    KIND_CASES: the contract's fast_path check, tests/test_contract.py::test_contract)."""
    extra = ["--clip-norm", "0.5"] + (["--bf16"] if precision == "bf16" else [])
    ref, fast_trainer, ref_losses, fast_losses = run_both(tiny_bin, updates, update_freq, *extra)
    assert fast_losses == pytest.approx(ref_losses, rel=1e-6)
    assert updates < 20 or fast_losses[-1] < fast_losses[0]  # it learns (over 3 updates it need not yet)
    for (name, p), q in zip(ref.model.named_parameters(), fast_trainer.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=name)
    # fairseq's optimizer state, as fairseq's step leaves it (a run resumes with or without --fast-path)
    ref_state, fast_state = ref.optimizer.state_dict()["state"], fast_trainer.optimizer.state_dict()["state"]
    assert {s["step"] for s in ref_state.values()} == {s["step"] for s in fast_state.values()} == {updates}
    assert fast_trainer.get_num_updates() == ref.get_num_updates() == updates


def test_adam_with_weight_decay_is_fairseqs():
    """fairseq's adam with --weight-decay: the update's steps against ``Adam.step`` on the
    same gradients (the decay rounds once in fairseq's fused multiply-add, twice here)."""
    from fairseq.optim.adam import Adam

    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    hyper = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    reference = Adam(theirs, **hyper)
    update = DeviceUpdate(SimpleNamespace(optimizer=Adam(ours, **hyper)), ours, clip_norm=0, device="cpu")
    for step in range(5):
        lr = hyper["lr"] * (step + 1) / 5
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        reference.param_groups[0]["lr"] = lr
        reference.step()
        for p, g in zip(ours, grads):
            p.grad.copy_(g)
        update.prepare(grad_scale=1.0, lr=lr)
        gnorm = update()
        update.advance()
        assert float(gnorm) == pytest.approx(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))
        for p, q in zip(theirs, ours):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
            assert not q.grad.any()  # zeroed for the next update
    assert reference.state[theirs[0]]["step"] == update.opt.state[ours[0]]["step"] == 5


# every connection kind, both normalized activations and the two other normalizations (the slow
# tests below; every kind's and these cases' 3-update step against fairseq's at 1+1 layers is the
# contract's fast_path check, tests/test_contract.py::test_contract)
KIND_CASES = {**{kind: ("--residual", kind) for kind in sorted(BUILTIN_KINDS)},
              "nrelu": ("--residual", "sas", "--normalized-activation", "nrelu"),
              "nswish_batch": ("--residual", "sas", "--normalized-activation", "nswish",
                               "--normalized-activation-stats", "batch"),
              "rms_norm": ("--residual", "pre_ln", "--normalization", "rms_norm"),
              "dyt": ("--residual", "post_ln", "--normalization", "dyt")}


@pytest.fixture(scope="module")
def shared_batches(tiny_bin):
    """The training batches of the first epoch (the same for every kind: batching does not
    depend on the model)."""
    return epoch_batches(build(tiny_bin, FastPathTrainer)[1])


# the cases compiled in the default suite: a kind without any normalization (its gradients reach
# dropout's backward transposed) in float32, and the hyper-connections' widened residual streams in
# bf16; the other 48 are slow tests (about 7 s of CPU each, mhc 30 s)
COMPILED_IN_DEFAULT_SUITE = {("rezero", "fp32"), ("hyper", "bf16")}


@pytest.mark.parametrize("case, precision", [
    (c, p) if (c, p) in COMPILED_IN_DEFAULT_SUITE else pytest.param(c, p, marks=pytest.mark.slow)
    for c in sorted(KIND_CASES) for p in ("fp32", "bf16")])
def test_every_kind_compiles_whole_once_per_bucket(tiny_bin, case, precision):
    """The fast path's training forward and label-smoothed loss (static padding, SDPA
    attention, the causal mask cache built once) and its backward compiled by torch.compile
    with fullgraph=True: no graph break, one graph per bucket shape, none again when the
    shapes come back or for the epoch's real batches. Traced through Dynamo and AOT autograd
    with inductor's decompositions and partitioner (the graphs inductor generates code from,
    without the code generation, which takes minutes per kind on a small CPU). Not plain
    ``aot_eager``: on the CPU it fails the kinds without a normalization, whose dropout
    backward gets a transposed gradient: the CPU kernel keeps its strides where the traced
    graph (as CUDA's kernel and inductor's decomposition) makes it contiguous."""
    import torch._dynamo

    bf16 = ["--bf16"] if precision == "bf16" else []
    trainer, task = build(tiny_bin, FastPathTrainer, *KIND_CASES[case], *bf16, "--shape-buckets", "2")
    real = epoch_batches(task)  # builds the buckets
    dataset = task.dataset("train")
    synthetic = [dataset.synthetic_batch(k) for k in range(len(dataset.shapes()))]
    assert len(synthetic) == 2
    model, criterion = trainer.model, trainer.criterion
    assert next(model.parameters()).dtype == (torch.bfloat16 if bf16 else torch.float32)
    model.train()

    def loss_of(net_input, target):
        return criterion.compute_loss(model, model(**net_input), {"target": target})[0]

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(loss_of, backend="aot_eager_decomp_partition", fullgraph=True, dynamic=False)
    for b in synthetic + synthetic + real:
        loss = compiled(b["net_input"], b["target"])
        loss.backward()
        assert torch.isfinite(loss)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len(synthetic)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


# stock fairseq (its own attention) against the fast path over 20 updates, end to end: the
# relative difference of the per-update losses and of the weights that each precision holds to
STOCK_TOLERANCE = {"fp32": {"loss": 1e-5, "weights": 1e-4}, "bf16": {"loss": 1e-3, "weights": 1e-2}}
# xskip (x + F, no normalization anywhere) amplifies rounding differences as it trains: its
# first updates agree to the tolerance above (4 in float32, from 2e-7; 1 in bf16, 3e-4), the
# later ones drift to about 1e-2 (measured: 1.3e-2 float32, 1.7e-2 bf16), held to AMPLIFIED
AMPLIFIES, AMPLIFIED = {"xskip": {"fp32": 4, "bf16": 1}}, {"loss": 5e-2, "weights": 5e-2}


@pytest.mark.slow  # 25 cases x 2 precisions x 20 updates: minutes
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(KIND_CASES))
def test_every_kind_trains_as_stock_fairseq_over_20_updates(tiny_bin, probe_fairseq_losses, shared_batches, case,
                                                           precision):
    """The whole fast path (SDPA attention, the update) against stock fairseq's step and
    attention: losses and weights within STOCK_TOLERANCE (measured: docs/training.md)."""
    extra = [*KIND_CASES[case], "--clip-norm", "0.5"] + (["--bf16"] if precision == "bf16" else [])
    ref, fast_trainer, ref_losses, fast_losses = run_both(tiny_bin, 20, 1, *extra, same_attention=False,
                                                          batches=shared_batches)
    tol = STOCK_TOLERANCE[precision]
    diffs = [abs(f - r) / abs(r) for f, r in zip(fast_losses, ref_losses)]
    if case in AMPLIFIES:
        assert max(diffs[:AMPLIFIES[case][precision]]) <= tol["loss"], diffs
        tol = AMPLIFIED
    worst = max(diffs)
    ref_weights = torch.cat([p.detach().float().flatten() for p in ref.model.parameters()])
    fast_weights = torch.cat([q.detach().float().flatten() for q in fast_trainer.model.parameters()])
    drift = float((fast_weights - ref_weights).norm() / ref_weights.norm())  # all the weights as one vector
    print(f"{case} {precision}: losses within {worst:.2e}, weights within {drift:.2e} (relative); per update:",
          " ".join(f"{d:.0e}" for d in diffs))
    assert worst <= tol["loss"] and drift <= tol["weights"], (worst, drift)
    assert fast_losses[-1] < fast_losses[0]


# the host reads left in a fast-path update, each with why it is there (a shape as a CPU
# tensor, torch.onnx.operators.shape_as_tensor: no device to wait for)
ALLOWED_HOST_READS = HOST_TENSOR_LINES


def test_update_reads_no_device_value(tiny_bin):
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from fairseq_trainer import host_reads

    trainer, task = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100")
    batches = epoch_batches(task)
    trainer.train_step([batches[0]])  # builds the update
    reads = host_reads(trainer, batches, 1, 2)
    assert {r["line"] for r in reads} <= ALLOWED_HOST_READS, reads
    assert all(r["site"].startswith("fairseq/modules/sinusoidal") for r in reads), reads


def test_nonfinite_gradient_stops_training_at_the_log_interval(tiny_bin):
    trainer, task = build(tiny_bin, FastPathTrainer, "--log-interval", "2")
    batches = epoch_batches(task)
    trainer.train_step([batches[0]])
    trainer.train_step([batches[1]])  # read: finite
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("nan"))
    trainer.train_step([batches[2]])  # update 3: not read yet
    with pytest.raises(FloatingPointError, match=r"gradients are NaN/Inf at an update among 3-4 \(--fast-path"):
        trainer.train_step([batches[3]])


def test_nonfinite_gradient_is_read_before_a_checkpoint_is_saved(tiny_bin, tmp_path):
    trainer, task = build(tiny_bin, FastPathTrainer, "--log-interval", "100")
    batches = epoch_batches(task)
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("inf"))
    trainer.train_step([batches[0]])
    with pytest.raises(FloatingPointError, match="among 1-1"):
        trainer.save_checkpoint(str(tmp_path / "checkpoint.pt"), {})
    assert not (tmp_path / "checkpoint.pt").exists()


def test_saved_and_resumed_run_continues_exactly(tiny_bin, tmp_path):
    whole, task = build(tiny_bin, FastPathTrainer, "--bf16", "--save-dir", str(tmp_path))
    batches = epoch_batches(task)
    for i in range(6):
        whole.train_step([batches[i]])
    first, _ = build(tiny_bin, FastPathTrainer, "--bf16", "--save-dir", str(tmp_path))
    for i in range(3):
        first.train_step([batches[i]])
    first.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
    first.save_checkpoint(str(tmp_path / "checkpoint_last.pt"), {})
    resumed_trainer, _ = build(tiny_bin, FastPathTrainer, "--bf16", "--save-dir", str(tmp_path))
    resumed_trainer.load_checkpoint(str(tmp_path / "checkpoint_last.pt"))
    assert resumed_trainer.get_num_updates() == 3
    for i in range(3, 6):
        resumed_trainer.train_step([batches[i]])
    for p, q in zip(whole.model.parameters(), resumed_trainer.model.parameters()):
        assert torch.equal(p, q)


# ------------------------------------------------------------------ the captured steps, with a fake graph

class FakeGraph:
    """A recorded step that a replay runs again: records run at capture (as a real graph's
    first replay would), so the first replay after it computes nothing."""

    def __init__(self, record):
        self.record, self.replays, self.fresh = record, 0, True
        self.outputs = record()

    def replay(self):
        self.replays += 1
        if self.fresh:
            self.fresh = False
            return
        for target, value in zip(torch.utils._pytree.tree_leaves(self.outputs),
                                 torch.utils._pytree.tree_leaves(self.record())):
            target.copy_(value)


def fake_capture(record):
    graph = FakeGraph(record)
    return graph, graph.outputs


def test_step_graphs_capture_each_shape_once_and_copy_the_inputs():
    seen = []

    def step(inputs):
        seen.append(inputs["x"])
        return inputs["x"] * inputs["scale"]

    graphs = StepGraphs(fake_capture, warmup=1)
    a1, a2, a3, b1, b2 = (torch.full((2, 3), v) for v in (1.0, 2.0, 3.0, 4.0, 5.0))
    b1, b2 = b1[:, :2].contiguous(), b2[:, :2].contiguous()
    scale = torch.tensor(10.0)
    assert torch.equal(graphs.run("step", step, {"x": a1, "scale": scale}), a1 * 10)  # warm-up: eager
    assert seen[-1] is a1 and not graphs.captures
    assert torch.equal(graphs.run("step", step, {"x": a2, "scale": scale}), a2 * 10)  # recorded
    static = seen[-1]
    assert static is not a2 and len(graphs.captures) == 1
    assert torch.equal(graphs.run("step", step, {"x": a3, "scale": scale}), a3 * 10)  # replayed
    assert seen[-1] is static and torch.equal(static, a3)  # the input copied into the static buffer
    graphs.run("step", step, {"x": b1, "scale": scale})  # another shape: its own warm-up, then its graph
    assert torch.equal(graphs.run("step", step, {"x": b2, "scale": scale}), b2 * 10)
    assert [c["key"][1][0] for c in graphs.captures] == [(2, 3), (2, 2)]
    assert graphs.replays == 3
    graphs.run("step", step, {"x": a1, "scale": scale})
    assert len(graphs.captures) == 2 and graphs.replays == 4  # nothing recorded again
    # with two keys to run eagerly first, the first key is not recorded before the second has run
    held = StepGraphs(fake_capture, warmup=1, keys_before_capture=2)
    for x in (a1, a2, a3):
        held.run("step", step, {"x": x, "scale": scale})
    assert not held.captures
    held.run("step", step, {"x": b1, "scale": scale})
    held.run("step", step, {"x": a1, "scale": scale})
    assert [c["key"][1][0] for c in held.captures] == [(2, 3)] and held.captures[0]["call"] == 5


def test_captured_training_equals_eager_training(tiny_bin):
    """The trainer through StepGraphs (graphs of recorded operations replayed on the
    recorded tensors: tests/cpu_graph.py) trains exactly as eagerly, recording one graph
    per batch shape and one for the update, all before the first update, over an epoch and
    the start of the next."""
    graphs = StepGraphs(op_capture, warmup=1)
    captured, task = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100", graphs=graphs)
    eager, _ = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100")
    batches = epoch_batches(task, 1) + epoch_batches(task, 2)[:2]  # every shape in epoch 1, replayed again
    losses = [(exact_loss(captured.train_step([b])), exact_loss(eager.train_step([b]))) for b in batches]
    assert [c for c, _ in losses] == pytest.approx([e for _, e in losses], rel=1e-6)
    for p, q in zip(eager.model.parameters(), captured.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)
    shapes = {tuple(b["target"].shape) + (b["net_input"]["src_tokens"].size(1),) for b in batches}
    keys = Counter(c["key"][0] for c in graphs.captures)
    assert keys == {"forward_backward": len(shapes), "update": 1}
    assert len({c["key"] for c in graphs.captures}) == len(graphs.captures)  # each once
    # every shape and the update warmed up, then recorded, before the first real update
    assert graphs.keys_before_capture == len(shapes) + 1 == len(task.dataset("train").shapes()) + 1
    assert min(c["call"] for c in graphs.captures) > max(graphs.first_seen.values())
    assert max(c["call"] for c in graphs.captures) <= 2 * (len(shapes) + 1) and not graphs.failures
    assert graphs.replays == graphs.calls - sum(graphs.eager_runs.values())


def failing_for(shape_index: int):
    """A capture that raises for the ``shape_index``-th forward-backward shape recorded (as
    an operation that cannot be captured would on a GPU), else records."""
    seen = []

    def capture(record):
        seen.append(record)
        if len(seen) == shape_index + 1:
            raise RuntimeError("operation not permitted when stream is capturing (forced)")
        return op_capture(record)
    return capture


def test_a_shape_that_cannot_be_captured_runs_eagerly_with_one_line(tiny_bin, caplog):
    graphs = StepGraphs(failing_for(1), warmup=1)
    captured, task = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100", graphs=graphs)
    eager, _ = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100")
    batches = epoch_batches(task)[:8]
    with caplog.at_level("WARNING", logger="resnmt.training.fast.capture"):
        losses = [(exact_loss(captured.train_step([b])), exact_loss(eager.train_step([b]))) for b in batches]
    assert [c for c, _ in losses] == pytest.approx([e for _, e in losses], rel=1e-6)
    (key, why), = graphs.failures.items()
    assert why == "RuntimeError: operation not permitted when stream is capturing (forced)"
    lines = [r.getMessage() for r in caplog.records if "eagerly from now on" in r.getMessage()]
    rows, src, tgt = task.dataset("train").shapes()[1]
    assert {((rows, src), torch.int64, "cpu"), ((rows, tgt), torch.int64, "cpu")} <= set(key[1:])
    assert lines == [f"[fast path] {describe_key(key)}: its capture failed ({why}); this shape runs eagerly from "
                     "now on"]
    assert describe_key(key).startswith("forward_backward ") and f"{rows}x{src}" in describe_key(key)
    assert key not in graphs.entries and len(graphs.captures) == len(task.dataset("train").shapes())  # the rest


def test_a_warm_up_that_fails_runs_eagerly_from_then_on():
    failures = []

    @contextlib.contextmanager
    def side_stream():  # the first warm-up fails (as a side stream's step might), the rest do not
        if not failures:
            failures.append(1)
            raise RuntimeError("no side stream today")
        yield

    graphs = StepGraphs(op_capture, warmup_context=side_stream, warmup=1)
    x = torch.ones(3)
    for i in range(3):
        assert torch.equal(graphs.run("step", lambda inputs: inputs * 2, x * i), x * 2 * i)
    assert graphs.failures == {("step", ((3,), torch.float32, "cpu")): "RuntimeError: no side stream today"}
    assert not graphs.captures and graphs.replays == 0


def test_grads_set_to_none_validation_and_checkpoints_with_captured_steps(tiny_bin, tmp_path):
    """fairseq's zero_grad (``.grad = None``), a validation pass over longer targets than
    any training batch, a checkpoint saved and loaded: the captured trainer goes on training
    as the eager one, the decoder's causal-mask cache never rebuilt, the gradients it
    records into never replaced."""
    graphs = StepGraphs(op_capture, warmup=1)
    flags = ("--clip-norm", "0.5", "--log-interval", "100", "--bf16")
    captured, task = build(tiny_bin, FastPathTrainer, *flags, graphs=graphs)
    eager, _ = build(tiny_bin, FastPathTrainer, *flags)
    batches = epoch_batches(task)
    task.load_dataset("valid")
    valid = task.dataset("valid")
    longest = max(b["target"].size(1) for b in batches) + 8  # a target longer than any training batch's
    valid_batches = [valid.collater([valid[i] for i in range(10)], pad_to_length={"source": 1, "target": longest})]
    decoder = captured.model.decoder
    mask = decoder._future_mask
    assert mask.size(0) == decoder.max_positions() and mask.dtype == torch.bfloat16
    for trainer in (captured, eager):
        for b in batches[:3]:
            trainer.train_step([b])
    held = [p.grad for p in captured.model.parameters()]
    for trainer in (captured, eager):
        trainer.optimizer.zero_grad()  # FP16Optimizer: the model's .grad = None
        assert all(p.grad is None for p in trainer.model.parameters())
        for b in valid_batches:
            trainer.valid_step(b)
        trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
        trainer.save_checkpoint(str(tmp_path / f"{id(trainer)}.pt"), {})
    losses = [(exact_loss(captured.train_step([b])), exact_loss(eager.train_step([b]))) for b in batches[3:5]]
    assert [c for c, _ in losses] == pytest.approx([e for _, e in losses], rel=1e-6)
    assert [p.grad for p in captured.model.parameters()] == held and decoder._future_mask is mask
    for trainer in (captured, eager):  # loading rebuilds the update, and records again before training
        trainer.load_checkpoint(str(tmp_path / f"{id(trainer)}.pt"))
    graphs_before = len(graphs.captures)
    losses = [(exact_loss(captured.train_step([b])), exact_loss(eager.train_step([b]))) for b in batches[5:6]]
    assert [c for c, _ in losses] == pytest.approx([e for _, e in losses], rel=1e-6)
    assert len(graphs.captures) == 2 * graphs_before
    for p, q in zip(eager.model.parameters(), captured.model.parameters()):
        assert torch.equal(p, q)


# ------------------------------------------------------------------ start-up checks and end to end

@pytest.mark.parametrize("flags, drop, message", [
    (["--fp16"], [], "--fast-path with --fp16: fp16's dynamic loss scaling reads the gradient norm"),
    (["--optimizer", "sgd"], ["--adam-betas"], "--fast-path with --optimizer sgd: supported optimizers: adam, "
                                               "adam_fused"),
    (["--criterion", "cross_entropy", "--sentence-avg"], ["--label-smoothing"], "--fast-path with --sentence-avg"),
    (["--store-ema"], [], "--fast-path with --store-ema"),
    (["--compile-layers", "--compile-mode", "reduce-overhead"], [],
     "--fast-path with --compile-mode reduce-overhead: the fast path records whole steps as CUDA graphs itself"),
])
def test_what_the_fast_path_does_not_run_is_refused_in_one_line(tiny_bin, flags, drop, message):
    cfg = config(tiny_bin, *flags, drop=drop)
    assert unsupported(cfg).startswith(message)
    assert unsupported(config(tiny_bin)) is None


def test_resnmt_train_and_fairseq_train_run_the_fast_path(tiny_bin, tmp_path):
    args = train_argv(tiny_bin)[1:]
    common = ["--max-update", "6", "--log-interval", "2", "--log-format", "simple", "--no-progress-bar",
              "--num-workers", "0", "--dropout", "0.1", "--no-epoch-checkpoints"]
    proc = run_cli(["resnmt-train", tiny_bin, *args, *common, "--bf16", "--save-dir", tmp_path / "resnmt"])
    log = proc.stdout + proc.stderr
    assert "[fast path] shape buckets:" in log and "[fast path] the update on the cpu (bf16 model" in log
    assert log.count("[fast path] shape buckets:") == 1
    losses = [float(line.split("loss=")[1].split(",")[0]) for line in log.splitlines() if "train_inner" in line
              and "loss=" in line] or [float(line.split("| loss ")[1].split(" ")[0]) for line in log.splitlines()
                                        if "| train_inner |" in line]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert (tmp_path / "resnmt" / "checkpoint_last.pt").exists()

    stock = run_cli(["fairseq-train", tiny_bin, "--user-dir", REPO_ROOT / "resnmt", *args, *common,
                     "--save-dir", tmp_path / "fairseq"])
    assert "[fast path] the update on the cpu (float32)" in stock.stdout + stock.stderr
    assert "[fast path] Adam: multi-tensor operations" in stock.stdout + stock.stderr
    assert "[fast path] loss: fairseq's criterion" in stock.stdout + stock.stderr

    refused = run_cli(["resnmt-train", tiny_bin, *args, "--fp16", "--save-dir", tmp_path / "no"], check=False)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1] == (
        "resnmt-train: error: --fast-path with --fp16: fp16's dynamic loss scaling reads the gradient norm on the "
        "host every update; train with --bf16 (resnmt-train) or in float32 (see --help)")
    assert not (tmp_path / "no").exists()


def test_the_trainer_asks_the_model_for_static_padding(tiny_bin):
    """Modules offering ``static_padding`` are told to pass their padding masks always
    (deciding whether a batch holds padding reads the mask on the host)."""
    cfg = config(tiny_bin)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    model.encoder.static_padding = model.decoder.static_padding = False
    trainer = FastPathTrainer(cfg, task, model, task.build_criterion(cfg.criterion))
    assert trainer.static_padding_modules == 2 and model.encoder.static_padding and model.decoder.static_padding


def test_install_replaces_fairseq_trains_trainer_and_uninstall_restores_it():
    import fairseq_cli.train as train_cli

    original = train_cli.Trainer
    try:
        assert fairseq_patches.apply("fast-path-trainer") and train_cli.Trainer is FastPathTrainer
        assert fast.installed() and fairseq_patches.original("fast-path-trainer", "fairseq_cli.train.Trainer") is original
    finally:
        fairseq_patches.remove("fast-path-trainer")
    assert train_cli.Trainer is original and not fast.installed() and not fairseq_patches.applied("fast-path-trainer")


@pytest.mark.slow  # two gloo ranks, ~40 s: with make test-slow
def test_two_cpu_ranks_on_the_fast_path_train_as_one_process_with_two_batches(tiny_bin, tmp_path):
    """Data-parallel --fast-path (2 ranks over gloo, --ddp-backend legacy_ddp): the ranks
    stay identical and equal a single process accumulating the same two batches per update
    (--update-freq 2), which the summed losses, counts and all-reduced gradients must give."""
    from test_distributed import ARCHS, _named_parameters, probe_train_args, run_two_ranks, write_probe

    probe, updates = write_probe(tmp_path), 5
    extra = ("--fast-path", "--clip-norm", "0.5")
    run_two_ranks(probe, tiny_bin, tmp_path / "ddp_ckpt", tmp_path / "ddp", ARCHS["sas"], updates, *extra)
    run_cli(probe_train_args(probe, tiny_bin, tmp_path / "single_ckpt", ARCHS["sas"], "--max-update", str(updates),
                             "--update-freq", "2", *extra), PROBE_OUT=str(tmp_path / "single"))
    ranks = [torch.load(tmp_path / "ddp" / f"state.rank{r}.pt", weights_only=True) for r in range(2)]
    single = torch.load(tmp_path / "single" / "state.rank0.pt", weights_only=True)
    assert ranks[0]["num_updates"] == ranks[1]["num_updates"] == single["num_updates"] == updates
    for key, _ in _named_parameters(single["model"]):
        assert torch.equal(ranks[0]["model"][key], ranks[1]["model"][key]), key
        torch.testing.assert_close(ranks[0]["model"][key], single["model"][key], rtol=1e-4, atol=1e-5, msg=key)


# ------------------------------------------------------------------ on CUDA (the GPU job runs these)

@CUDA
def test_on_cuda_the_captured_update_is_the_eager_one():
    """The update recorded as a real CUDA graph and replayed computes, bit for bit, what it
    computes eagerly, its numbers (scale, step size, decay) filled in place between replays;
    a non-finite gradient sets the flag inside the graph."""
    from fairseq.optim.adam import Adam

    shapes = [(64, 32), (32,), (8, 4, 2)]
    device = torch.device("cuda")

    def make():
        gen = torch.Generator(device="cuda").manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen)) for s in shapes]
        adam = Adam(params, lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
        return params, DeviceUpdate(SimpleNamespace(optimizer=adam), params, clip_norm=1.0, device=device)

    (eager_params, eager), (graph_params, captured) = make(), make()
    graphs = StepGraphs.for_cuda()
    gen = torch.Generator(device="cuda").manual_seed(1)
    for step in range(6):
        grads = [torch.randn(s, device=device, generator=gen) * (step + 1) for s in shapes]
        for params, update in ((eager_params, eager), (graph_params, captured)):
            for p, g in zip(params, grads):
                p.grad.copy_(g)
            update.prepare(grad_scale=1 / (100 + step), lr=1e-3 * (step + 1))
        eager_norm = eager()
        captured_norm = graphs.run("update", lambda _: captured(), ()).clone()
        eager.advance()
        captured.advance()
        assert torch.equal(captured_norm, eager_norm), step
        for p, q in zip(eager_params, graph_params):
            assert torch.equal(p, q), step
    assert len(graphs.captures) == 1 and graphs.replays == 5
    assert not bool(captured.nonfinite)
    graph_params[0].grad.fill_(float("inf"))
    graphs.run("update", lambda _: captured(), ())
    assert bool(captured.nonfinite)


@CUDA
def test_on_cuda_a_step_that_cannot_be_captured_runs_eagerly():
    """A step that reads a device value on the host cannot be recorded: it runs eagerly from
    then on with one line, and the device goes on recording and replaying other steps."""
    graphs = StepGraphs.for_cuda()
    x = torch.ones(4, device="cuda")

    def reads_the_host(inputs):
        return inputs * float(inputs.sum())

    for i in range(1, 4):
        assert torch.equal(graphs.run("host", reads_the_host, x * i), x * i * float(4 * i))
    assert list(graphs.failures) == [("host", ((4,), torch.float32, "cuda"))]
    print("the failure:", graphs.failures)
    for i in range(1, 4):
        assert torch.equal(graphs.run("fine", lambda inputs: inputs * 2, x * i).clone(), x * 2 * i)
    assert len(graphs.captures) == 1 and graphs.replays == 2


@CUDA
def test_on_cuda_the_update_trains_as_fairseqs_step(tiny_bin, probe_fairseq_losses):
    ref, task = build(tiny_bin, Trainer, "--clip-norm", "0.5", cpu=False)
    fast_trainer, _ = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--no-step-capture", cpu=False)
    batches = epoch_batches(task)
    for i in range(10):
        ref.train_step([batches[i % len(batches)]])
        loss = exact_loss(fast_trainer.train_step([batches[i % len(batches)]]))
        assert loss == pytest.approx(ref._probe_loss, rel=1e-4), i


@CUDA
def test_on_cuda_an_update_never_waits_for_the_device(tiny_bin):
    """torch's sync debug mode over three updates after the warm-up: no synchronising call
    (resnmt's stacks pass their padding masks instead of asking the batch: static_padding)."""
    trainer, task = build(tiny_bin, FastPathTrainer, "--no-step-capture", "--log-interval", "1000", cpu=False)
    batches = epoch_batches(task)
    for b in batches[:2]:
        trainer.train_step([b])
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for b in batches[2:5]:
                trainer.train_step([b])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    lines = {linecache.getline(w.filename, w.lineno).strip() for w in syncs}
    where = {f"{Path(w.filename).name}:{w.lineno}" for w in syncs}
    assert trainer.static_padding_modules == 2 and not lines, where


@CUDA
def test_on_cuda_captured_training_equals_eager_training(tiny_bin):
    """The whole fast path on CUDA: each batch shape's forward and backward and the update
    recorded once as CUDA graphs and replayed train as the eager steps do, dropout
    included (graph-safe random numbers, re-seeded every update). Needs a model whose
    forward reads nothing on the host (its modules offer ``static_padding``); where one
    does not, the recording fails on the first read, so the GPU job runs this test last,
    in a process of its own."""
    graphs = StepGraphs.for_cuda()
    captured, task = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100", cpu=False,
                           graphs=graphs)
    eager, _ = build(tiny_bin, FastPathTrainer, "--clip-norm", "0.5", "--log-interval", "100",
                     "--no-step-capture", cpu=False)
    batches = epoch_batches(task, 1) + epoch_batches(task, 2)
    losses = [(exact_loss(captured.train_step([b])), exact_loss(eager.train_step([b]))) for b in batches]
    assert [c for c, _ in losses] == pytest.approx([e for _, e in losses], rel=1e-4)
    for p, q in zip(eager.model.parameters(), captured.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-4)
    shapes = {tuple(b["target"].shape) + (b["net_input"]["src_tokens"].size(1),) for b in batches}
    assert Counter(c["key"][0] for c in graphs.captures) == {"forward_backward": len(shapes), "update": 1}
    print("captures:", [(c["key"][0], round(c["seconds"], 3)) for c in graphs.captures])
