"""The checks every connection kind passes, built-in or the user's.

A :class:`Case` is a kind with flag values (:func:`cases`: its defaults, and one case per
other value of each of its switches and choices); a check takes a case and raises an
AssertionError saying what is wrong. :data:`CHECKS` lists them in order, each with whether
it also runs on the flag variants or on the defaults alone (the class and its flags, the
forward at several depths, the checkpoint, the fast path and the normalization: a flag's
code path is in the forward that the gradients, incremental decoding and TorchScript
checks run too).
"""
import fnmatch
import io
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

from resnmt.testing import tiny

DEPTHS = ((1, 2), (3, 1))  # (encoder, decoder) layers of the forward check


@dataclass(frozen=True)
class Case:
    """A tiny model's flags (``--residual KIND ...``, or ``--encoder-residual A
    --decoder-residual B ...``) under a name (its test id)."""

    name: str
    flags: Tuple[str, ...]

    @property
    def kinds(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(self.flags[i + 1] for i, f in enumerate(self.flags)
                                   if f in ("--residual", "--encoder-residual", "--decoder-residual")))

    def build(self, depth=(2, 2), extra: Sequence[str] = (), seed: int = 1):
        return tiny.build([*self.flags, *extra], depth, seed)


def kind_class(kind: str):
    from resnmt.connections import CONNECTION_CLASSES

    assert kind in CONNECTION_CLASSES, f"{kind!r} is not a registered connection kind"
    return CONNECTION_CLASSES[kind]


def cases(kind: str) -> List[Case]:
    """``kind`` with its defaults, then with each other value of each switch and choice it declares."""
    found = [Case(kind, ("--residual", kind))]
    for flag in kind_class(kind).flags:
        values = [True] if flag.kind == "switch" else [c for c in flag.choices if c != flag.default]
        for value in values if flag.kind in ("switch", "choice") else ():
            extra = (flag.flag,) if value is True else (flag.flag, str(value))
            found.append(Case(" ".join((kind, *extra)), ("--residual", kind, *extra)))
    return found


def forward(model, net_input) -> torch.Tensor:
    return model(**net_input)[0]


# ------------------------------------------------------------------ the checks


def check_spec(case: Case) -> None:
    """The kind's class: registered under its name, its declarations present, its flags'
    defaults valid, a spec for each side at several depths, its flags on fairseq's parser."""
    from resnmt.connections import CONNECTION_FLAGS, ConnectionSpec, Statistic, SublayerConnection
    from resnmt.options import Option

    added = {}  # flags not in the case, given at their defaults: parsed and read back as such
    for kind in case.kinds:
        cls = kind_class(kind)
        assert issubclass(cls, SublayerConnection) and cls.kind == kind, f"{cls} is not registered as {kind}"
        for attr in ("equation", "source"):
            assert isinstance(getattr(cls, attr, None), str) and getattr(cls, attr), f"{kind}: no {attr}"
        assert all(isinstance(s, Statistic) for s in cls.statistics), f"{kind}: statistics"
        for flag in cls.flags:
            assert isinstance(flag, Option) and CONNECTION_FLAGS[flag.dest] is flag, f"{kind}: flag {flag}"
            assert flag.problem(flag.default) is None, f"{kind}: {flag.flag}'s default is refused"
            if flag.kind != "switch" and flag.default is not None and flag.flag not in case.flags:
                added[flag] = [flag.flag, str(flag.default)]
        for side in ("encoder", "decoder"):
            for n, m in ((1, 1), (6, 6), (18, 2)):
                spec = ConnectionSpec(kind, side=side, encoder_layers=n, decoder_layers=m)
                assert spec.kind == kind and spec.layers == (n if side == "encoder" else m)
    args = tiny.parse([*case.flags, *(word for words in added.values() for word in words)])
    for flag in added:
        got = flag.read(args)
        assert got == flag.check(flag.default), f"{flag.flag} {flag.default} is read back as {got}"


def check_forward(case: Case) -> None:
    """At several depths, in training and evaluation, and under bf16 autocast (CPU): logits
    of the batch's shape, finite; each stack ends with a norm exactly where its kind says so
    (``final_norm``)."""
    for depth in DEPTHS:
        model, task, _ = case.build(depth)
        for stack in (model.encoder, model.decoder):
            final = kind_class(stack.connection_spec.kind).final_norm
            assert (stack.layer_norm is not None) == final, f"{stack.connection_spec.kind}: final norm {final}"
        sample = tiny.batch(task)
        for training, bf16 in ((True, False), (False, False), (False, True)):
            model.train(training)
            with torch.set_grad_enabled(training), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = forward(model, sample["net_input"])
            where = f"depth {depth}, training={training}, bf16={bf16}"
            assert out.shape == (*sample["target"].shape, len(task.target_dictionary)), (where, out.shape)
            assert torch.isfinite(out).all(), f"non-finite logits at {where}"


def no_gradient_by_design(case: Case) -> Tuple[str, ...]:
    """Parameter-name patterns (fnmatch) the case's kinds declare get no gradient by design."""
    return tuple(p for kind in case.kinds for p in kind_class(kind).no_gradient_by_design)


def check_gradients(case: Case) -> None:
    """One backward of the cross-entropy: every parameter gets a non-zero gradient, except
    those the kind declares (``no_gradient_by_design``), whose gradient is 0 (float rounding apart)."""
    model, task, _ = case.build(extra=["--share-all-embeddings"])
    tiny.perturb_connections(model)
    model.train()
    sample = tiny.batch(task, split="train")
    logits = forward(model, sample["net_input"])
    nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), sample["target"].view(-1)).backward()
    patterns = no_gradient_by_design(case)

    def by_design(name):
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    missing = [n for n, p in model.named_parameters()
               if not by_design(n) and (p.grad is None or not torch.any(p.grad != 0))]
    assert not missing, f"parameters without gradient: {missing}"
    largest = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    for n, p in model.named_parameters():
        if by_design(n) and p.grad is not None:
            assert float(p.grad.abs().max()) < 1e-6 * largest, f"{n} declared without gradient has one"


def check_incremental(case: Case) -> None:
    """Decoding step by step (fairseq's incremental state) gives the full forward's outputs
    at every real target position; the forward is finite under bf16 autocast too."""
    model, task, _ = case.build()
    tiny.perturb_connections(model)
    model.eval()
    net_input = tiny.batch(task, n=3)["net_input"]
    with torch.no_grad():
        full = forward(model, net_input)
        encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
        state, prev, steps = {}, net_input["prev_output_tokens"], []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0])
    real = prev.ne(task.target_dictionary.pad())
    scale = max(1.0, float(full[real].abs().max()))  # float32 rounding grows with the logits (xSkip: λ^depth)
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=0, atol=1e-5 * scale)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(forward(model, net_input)).all(), "non-finite logits under bf16 autocast"


def check_beam_search(case: Case) -> None:
    """resnmt's fast beam search (resnmt/decoding/fast_beam.py) returns fairseq's hypotheses
    and scores (beam 4), on 8 sentences in float32."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    from resnmt.decoding.fast_beam import FastSequenceGenerator

    model, task, _ = case.build()
    tiny.perturb_connections(model)
    model.eval()
    tgt = task.target_dictionary
    sample = tiny.batch(task, n=8)
    generators = [cls([model], tgt, search_strategy=search.BeamSearch(tgt), beam_size=4, max_len_a=1, max_len_b=3)
                  for cls in (SequenceGenerator, FastSequenceGenerator)]
    assert generators[1].path == "fast", f"the fast beam search refuses the model: {generators[1].fallback}"
    with torch.no_grad():
        want, got = (g.generate([model], sample) for g in generators)
    for sentence, (a, b) in enumerate(zip(want, got)):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b], \
            f"sentence {sentence}: other hypotheses than fairseq's"
        for x, y in zip(a, b):
            torch.testing.assert_close(y["score"], x["score"], rtol=1e-4, atol=1e-4)


def check_torchscript(case: Case) -> None:
    """A decoder layer (all three sublayers' connections) scripts with torch.jit.script, as
    fairseq's own layers do, and the scripted layer computes what the eager one does."""
    model, _, _ = case.build()
    tiny.perturb_connections(model)
    model.eval()
    g = torch.Generator().manual_seed(0)
    layer = model.decoder.layers[-1]
    streams = getattr(getattr(layer.ffn_connection, "streams", None), "num_streams", None)
    x = torch.randn(5, 2, *((streams,) if layer.ffn_connection.multi_stream else ()), 16, generator=g)
    memory = torch.randn(4, 2, 16, generator=g)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    scripted = torch.jit.script(layer)
    with torch.no_grad():
        expected = layer(x, memory, None, None, self_attn_mask=mask)
        got = scripted(x, memory, None, None, self_attn_mask=mask)
    for a, b in zip(got, expected):  # TorchScript may pick other kernels: float32 rounding apart
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def check_checkpoint(case: Case) -> None:
    """Saved as fairseq-train saves a checkpoint, the model loads through fairseq's
    checkpoint_utils (strictly) and computes the same; a user's kind's module is recorded."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    from resnmt.connections.plugins import sources_of

    model, task, args = case.build()
    tiny.perturb_connections(model)
    cfg = tiny.with_model(tiny.training_config(), args)
    state = {"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
             "extra_state": {},
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "AdamOptimizer",
                                    "lr_scheduler_state": {}, "num_updates": 0}], "last_optimizer_state": None}
    assert getattr(cfg.model, "connections", None) == sources_of(case.kinds), "the kinds' modules are not recorded"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = tiny.tiny_data() / f"contract-{abs(hash(case))}.pt"
    path.write_bytes(buffer.getvalue())
    try:
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)], strict=True)
    finally:
        path.unlink()
    net_input = tiny.batch(task)["net_input"]
    for m in (model, models[0]):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(forward(models[0], net_input), forward(model, net_input), rtol=0, atol=0)


def check_fast_path(case: Case) -> None:
    """``--fast-path``'s update equals fairseq's Trainer.train_step: the same losses and weights."""
    from resnmt.testing.fast_path import compare_with_fairseq

    compare_with_fairseq(case.flags)


def check_normalization(case: Case) -> None:
    """A kind that owns norms takes ``--normalization``: every norm becomes the chosen one
    (RMSNorm, DyT), the model stays finite; a kind without any refuses it in one line."""
    from resnmt.connections import ConnectionConfigError, ConnectionSpec
    from resnmt.connections.norms import DynamicTanh

    for kind in case.kinds:
        if not kind_class(kind).normalized:
            try:
                ConnectionSpec(kind, normalization="rms_norm")
            except ConnectionConfigError as e:
                assert "--normalization" in str(e) and "\n" not in str(e), str(e)
            else:
                raise AssertionError(f"{kind} owns no norm, yet takes --normalization rms_norm")
            return
    for name, norm_type in (("rms_norm", nn.RMSNorm), ("dyt", DynamicTanh)):
        model, task, _ = case.build(extra=["--normalization", name])
        norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm, DynamicTanh))
                 or type(m).__name__.endswith("LayerNorm")]
        assert norms and all(isinstance(m, norm_type) for m in norms), (name, {type(m).__name__ for m in norms})
        with torch.no_grad():
            assert torch.isfinite(forward(model.eval(), tiny.batch(task)["net_input"])).all(), name


def check_analysis(case: Case) -> None:
    """What the kind measures (``resnmt-analyze``, ``--log-connection-stats``): the statistics it
    declares, per position, finite, reported by the analysis' hooks at every site."""
    from resnmt.analysis.hooks import Accumulator, StatsCollector
    from resnmt.connections import SublayerConnection

    model, task, _ = case.build()
    model.eval()
    connections = [m for m in model.modules() if isinstance(m, SublayerConnection)]
    declared = {stat.name for kind in case.kinds for stat in kind_class(kind).statistics}
    for conn in connections:
        assert {s.name for s in conn.measured_statistics()} <= declared, type(conn).__name__
    sink = Accumulator()
    with StatsCollector(model, sink), torch.no_grad():
        forward(model, tiny.batch(task)["net_input"])
    means = sink.means()
    measured = {s.name for conn in connections for s in conn.measured_statistics()}
    assert set(means) >= measured, f"statistics not reported: {sorted(measured - set(means))}"
    for name in measured:
        assert all(math.isfinite(v) for v in means[name].values()), name


# name -> (check, whether it also runs on a kind's flag variants)
CHECKS: Dict[str, Tuple[Callable[[Case], None], bool]] = {
    "spec": (check_spec, False),
    "forward": (check_forward, False),
    "gradients": (check_gradients, True),
    "incremental": (check_incremental, True),
    "beam_search": (check_beam_search, False),
    "torchscript": (check_torchscript, True),
    "checkpoint": (check_checkpoint, False),
    "fast_path": (check_fast_path, False),
    "normalization": (check_normalization, False),
    "analysis": (check_analysis, True),
}
