"""--fused-connections (resnmt/training/compile.py and its users): the compiled SAS combination and
NReLU/NSwish give the eager path's values and gradients, in a built model too
(incremental decoding included), compile once for all batch shapes, and the flag
stops the build with one line where torch.compile cannot work."""
import pytest
import torch
from torch._dynamo.utils import counters

from model_utils import assert_incremental_equals_full, build, parse_train_args, randomize_norms, sample_batch

from resnmt.training import compile as fused
from resnmt.activations import native
from resnmt.activations.normalized import ActivationSpec, NormalizedActivation, fused_instance_activation
from resnmt.connections import ConnectionSpec, build_connection

DIM = 16
TOL = dict(rtol=1e-5, atol=1e-5)


def pair(make):
    """The same module twice (same weights): eager and fused."""
    torch.manual_seed(0)
    eager = make(False)
    torch.manual_seed(0)
    compiled = make(True)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


def grads(module, *inputs):
    return [t.grad for t in inputs] + [p.grad for p in module.parameters()]


def run(module, inputs, *extra):
    """Output and every gradient of ``sum(out * weights)`` for fresh leaf copies of inputs."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = module(*leaves, *extra)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    return out.detach(), grads(module, *leaves)


@pytest.mark.parametrize("gamma", ["product", "gate"])
def test_sas_fused_matches_eager_forward_and_backward(gamma):
    eager, compiled = pair(lambda f: build_connection(DIM, ConnectionSpec(kind="sas", sas_gamma=gamma, fused=f)))
    with torch.no_grad():  # non-trivial LayerNorm gain and bias
        for m in (eager, compiled):
            m.norm.weight.copy_(torch.linspace(0.5, 1.5, DIM))
            m.norm.bias.copy_(torch.linspace(-0.2, 0.2, DIM))
    assert compiled.fused and not eager.fused  # forward takes the compiled path, or the eager one
    for shape in [(5, 3), (9, 2)]:
        x, fx = torch.randn(*shape, DIM), torch.randn(*shape, DIM)
        out_e, grads_e = run(eager, (x, fx))
        out_c, grads_c = run(compiled, (x, fx))
        torch.testing.assert_close(out_c, out_e, **TOL)
        for g_c, g_e in zip(grads_c, grads_e):
            torch.testing.assert_close(g_c, g_e, **TOL)
        eager.zero_grad(), compiled.zero_grad()


def sample(T=7, B=3, C=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, B, C, generator=g) * (0.5 + torch.rand(T, B, 1, generator=g)) + 0.3
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, T - 2:] = True
    return h, mask


@pytest.mark.parametrize("kind, mode", [
    ("nswish", "instance"), ("nrelu", "instance"),  # the native kernel (CPU), each activation
    ("nrelu", "batch"), pytest.param("nswish", "batch", marks=pytest.mark.slow),  # the compiled functions
])
def test_normalized_activation_fused_matches_eager(kind, mode):
    eager, compiled = pair(lambda f: NormalizedActivation(ActivationSpec(kind=kind, stats=mode, fused=f)))
    with torch.no_grad():
        eager.omega.fill_(0.4), compiled.omega.fill_(0.4)
    for T, B in [(7, 3), (5, 4)]:  # two training batches: the batch estimates move
        h, mask = sample(T, B, seed=T)
        out_e, grads_e = run(eager.train(), (h,), mask)
        out_c, grads_c = run(compiled.train(), (h,), mask)
        torch.testing.assert_close(out_c, out_e, **TOL)
        for g_c, g_e in zip(grads_c, grads_e):
            torch.testing.assert_close(g_c, g_e, **TOL)
        eager.zero_grad(), compiled.zero_grad()
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(dict(compiled.named_buffers())[name], buf, **TOL)
    h, mask = sample(4, 2, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(compiled.eval()(h, mask), eager.eval()(h, mask), **TOL)


def test_compiled_instance_activation_is_the_eager_equation():
    """The function compiled for GPUs (per-token statistics; the CPU runs the native kernel)."""
    h, _ = sample(6, 3)
    omega = torch.tensor(0.4)
    for kind in ("nswish", "nrelu"):
        act = NormalizedActivation(ActivationSpec(kind=kind))
        with torch.no_grad():
            act.omega.fill_(0.4)
            expected = act(h)
        got = fused_instance_activation.eager(h, omega, kind == "nswish", act.clamp_min, act.clamp_max, act.eps)
        torch.testing.assert_close(got, expected, **TOL)


def test_native_kernel_on_the_cpu_compiles_no_graph():
    torch._dynamo.reset()
    counters.clear()
    act = NormalizedActivation(ActivationSpec(kind="nswish", fused=True))
    h = torch.randn(5, 2, 32, requires_grad=True)
    act(h).sum().backward()
    with torch.no_grad():
        act.eval()(torch.randn(1, 8, 32))
    assert counters["stats"]["unique_graphs"] == 0 and h.grad is not None


def test_one_graph_serves_every_batch_shape():
    """dynamic=True: after the first call, new (seq_len, batch) sizes compile nothing."""
    torch._dynamo.reset()
    conn = build_connection(DIM, ConnectionSpec(kind="sas", fused=True))
    act = NormalizedActivation(ActivationSpec(kind="nswish", stats="batch", fused=True))
    with torch.no_grad():
        conn(torch.randn(6, 3, DIM), torch.randn(6, 3, DIM))
        act(torch.randn(6, 3, 32))
        graphs = counters["stats"]["unique_graphs"]
        assert graphs >= 2
        for T, B in [(7, 2), (13, 5), (31, 8), (2, 17)]:
            conn(torch.randn(T, B, DIM), torch.randn(T, B, DIM))
            act(torch.randn(T, B, 32))
        assert counters["stats"]["unique_graphs"] == graphs


def test_fused_model_matches_eager_model_in_training_and_incremental_decoding(tiny_bin):
    extra = ["--residual", "sas", "--sas-gate-dim", "8", "--normalized-activation", "nswish"]
    eager, task, _ = build(tiny_bin, "resnmt_transformer", extra)
    compiled, _, args = build(tiny_bin, "resnmt_transformer", extra + ["--fused-connections"])
    assert args.fused_connections and "fused" in repr(compiled.encoder.layers[0].ffn_activation)
    randomize_norms(eager)
    compiled.load_state_dict(eager.state_dict())
    net_input = sample_batch(task, n=4, split="train")["net_input"]
    for model in (eager, compiled):
        model.train()
        torch.manual_seed(3)  # same dropout masks
        model(**net_input)[0].float().logsumexp(-1).sum().backward()
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-5, msg=name)
    compiled.eval(), eager.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(**net_input)[0], eager(**net_input)[0], **TOL)
    assert_incremental_equals_full(compiled, task)


def test_unavailable_compiler_stops_the_build_with_one_line(tiny_bin, monkeypatch, capsys):
    monkeypatch.setattr(fused.shutil, "which", lambda name: None)
    with pytest.raises(fused.CompileUnavailableError, match="--fused-connections needs torch.compile.*no C\\+\\+ compiler"):
        NormalizedActivation(ActivationSpec(kind="nrelu", fused=True))
    with pytest.raises(fused.CompileUnavailableError, match="no C\\+\\+ compiler"):
        build_connection(DIM, ConnectionSpec(kind="sas", fused=True))
    with pytest.raises(SystemExit):
        parse_train_args(tiny_bin, "resnmt_transformer", ["--residual", "sas", "--fused-connections"])
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--fused-connections needs torch.compile" in err and "without --fused-connections" in err


def test_a_native_kernel_that_does_not_build_stops_the_model_build(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("RESNMT_CACHE_DIR", str(cache))
    fake = tmp_path / "fake-c++"  # answers --version, fails to compile
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo fake 1.0; exit 0; fi\necho "no such flag" >&2; exit 1\n')
    fake.chmod(0o755)
    native.library.cache_clear()
    try:
        for cxx, problem in ((str(fake), f"{fake} could not build {native.SOURCE}: no such flag;"),
                             ("false", "false --version failed")):
            monkeypatch.setenv("CXX", cxx)
            with pytest.raises(fused.CompileUnavailableError) as error:
                NormalizedActivation(ActivationSpec(kind="nswish", fused=True))
            message = str(error.value)
            assert message.startswith(f"--fused-connections: {problem}") and "train without --fused-connections" in message
            assert not cache.exists() or list(cache.iterdir()) == []  # nothing half-written
        NormalizedActivation(ActivationSpec(kind="nswish", stats="batch", fused=True))  # needs no native kernel
        monkeypatch.delenv("CXX")
        blocked = tmp_path / "not-a-directory"
        blocked.write_text("")
        monkeypatch.setenv("RESNMT_CACHE_DIR", str(blocked))
        with pytest.raises(fused.CompileUnavailableError, match=f"cannot write the kernel to {blocked}.*RESNMT_CACHE_DIR"):
            NormalizedActivation(ActivationSpec(kind="nrelu", fused=True))
    finally:
        native.library.cache_clear()
