"""The building blocks of the 2025 kinds, each against its equation computed
by hand on small tensors: Hyper-Connections (static, dynamic) and mHC
(resnmt/connections/hyper.py), DenseFormer's depth-weighted average
(resnmt/connections/streams.py), HybridNorm's per-head Q/K/V norms
(resnmt/connections/depth_norm.py). The hand computations loop over positions and
streams (or use einsum) and share no code with the modules. The stack-level tests (the
kinds wired into the models) come with the registry."""
import math

import pytest
import torch
from fairseq.modules import MultiheadAttention
from torch import nn

from resnmt.connections.depth_norm import HeadNormedLinear, has_qkv_norm, qkv_norm_attention
from resnmt.connections.hyper import (
    DynamicHyperMixer,
    StaticHyperMixer,
    expand_streams,
    output_projection_init_factor,
    reduce_streams,
)
from resnmt.connections.mhc import MHC_INIT_LEAK, ManifoldHyperMixer, sinkhorn_knopp
from resnmt.connections.norms import DynamicTanh, build_norm
from resnmt.connections.streams import DepthWeightedAverage

T, B, C, N = 3, 2, 5, 3  # time, batch, channels, streams


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def perturbed(module, seed=0, scale=0.3):
    """``module`` in float64 with every parameter moved off its initial value."""
    g = gen(seed)
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def layer_norm(v, weight, bias, eps=1e-5):
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps) * weight + bias


def sigmoid(v):
    return 1.0 / (1.0 + torch.exp(-v))


def hand_sinkhorn(logits, iterations):
    """Sinkhorn-Knopp on one n x n matrix, element by element: columns, then rows."""
    n = logits.shape[0]
    m = [[math.exp(float(logits[i, j])) for j in range(n)] for i in range(n)]
    for _ in range(iterations):
        for j in range(n):
            s = sum(m[i][j] for i in range(n))
            for i in range(n):
                m[i][j] /= s
        for i in range(n):
            s = sum(m[i])
            m[i] = [v / s for v in m[i]]
    return torch.tensor(m, dtype=torch.float64)


def hand_streams(h, f, read, mix, write):
    """Per position: h_in = Σ_s read[s] H[s]; Ĥ[i] = Σ_j mix[i][j] H[j] + write[i] F (mix
    indexed (destination, source))."""
    n = h.shape[2]
    h_in = torch.zeros(h.shape[0], h.shape[1], h.shape[3], dtype=h.dtype)
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for b in range(h.shape[1]):
            r, m, w = read(t, b), mix(t, b), write(t, b)
            for s in range(n):
                h_in[t, b] += r[s] * h[t, b, s]
            for i in range(n):
                out[t, b, i] = w[i] * f[t, b]
                for j in range(n):
                    out[t, b, i] += m[i][j] * h[t, b, j]
    return h_in, out


def run_sublayer(conn, h, f):
    h_in, mixed, write = conn.width(h)
    return h_in, conn.depth(f, mixed, write)


# ------------------------------------------------------------------ Hyper-Connections


@pytest.mark.parametrize("index", [0, 1, 2, 3, 7])
def test_hc_initial_values_are_the_papers(index):
    """B = 1, A_m = e_{k mod n}, A_r = I; DHC adds W = 0, s_α = s_β = 0.01."""
    shc = StaticHyperMixer(C, N, index)
    a_m = torch.zeros(N)
    a_m[index % N] = 1.0
    assert torch.equal(shc.alpha[:, 0], a_m) and torch.equal(shc.alpha[:, 1:], torch.eye(N))
    assert torch.equal(shc.beta, torch.ones(N))
    assert sum(p.numel() for p in shc.parameters()) == N * (N + 2)
    dhc = DynamicHyperMixer(C, build_norm(C), N, index)
    assert torch.equal(dhc.alpha, shc.alpha) and torch.equal(dhc.beta, shc.beta)
    assert not dhc.alpha_weight.any() and not dhc.beta_weight.any()
    assert dhc.alpha_weight.shape == (C, N + 1) and dhc.beta_weight.shape == (C,)
    assert torch.equal(dhc.alpha_scale.data, torch.full((1,), 0.01))
    assert torch.equal(dhc.beta_scale.data, torch.full((1,), 0.01))
    # the paper's count: |norm| + d(n+2) + n(n+2) + 2
    assert sum(p.numel() for p in dhc.parameters()) == 2 * C + C * (N + 2) + N * (N + 2) + 2


def test_static_hc_against_hand_computation():
    """h₀ = A_mᵀH, H' = A_rᵀH, Ĥ = Bᵀ F + H' (the paper's Eq. 2-5)."""
    conn = perturbed(StaticHyperMixer(C, N, 1))
    h, f = randn(T, B, N, C, seed=1), randn(T, B, C, seed=2)
    a_m, a_r, beta = conn.alpha[:, 0].detach(), conn.alpha[:, 1:].detach(), conn.beta.detach()
    expected_in, expected = hand_streams(h, f, read=lambda t, b: a_m,
                                         mix=lambda t, b: [[a_r[j, i] for j in range(N)] for i in range(N)],  # A_rᵀ
                                         write=lambda t, b: beta)
    h_in, out = run_sublayer(conn, h, f)
    torch.testing.assert_close(h_in, expected_in, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm", "dyt"])
def test_dynamic_hc_against_hand_computation(normalization):
    """H̄ = norm(H) row-wise; A_m(H) = s_α tanh(H̄W_m) + A_m, A_r(H) = s_α tanh(H̄W_r) + A_r,
    B(H) = s_β tanh(H̄W_β)ᵀ + B (Eq. 10-13); row i of the dynamic part from stream i only."""
    conn = perturbed(DynamicHyperMixer(C, build_norm(C, normalization), N, 2))
    h, f = randn(T, B, N, C, seed=1), randn(T, B, C, seed=2)
    p = {name: v.detach() for name, v in conn.named_parameters()}
    if normalization == "layer_norm":
        norm = lambda v: layer_norm(v, p["norm.weight"], p["norm.bias"])  # noqa: E731
    elif normalization == "rms_norm":
        norm = lambda v: v / torch.sqrt((v ** 2).mean() + 1e-5) * p["norm.weight"]  # noqa: E731
    else:
        norm = lambda v: p["norm.weight"] * torch.tanh(p["norm.alpha"] * v) + p["norm.bias"]  # noqa: E731
    w_m, w_r, w_b = p["alpha_weight"][:, 0], p["alpha_weight"][:, 1:], p["beta_weight"]
    s_a, s_b = p["alpha_scale"], p["beta_scale"]

    def a_m(t, b):
        return [s_a * torch.tanh(norm(h[t, b, s]) @ w_m) + p["alpha"][s, 0] for s in range(N)]

    def a_r_transposed(t, b):  # [destination i][source j] = A_r(H)[j, i]
        return [[s_a * torch.tanh(norm(h[t, b, j]) @ w_r[:, i]) + p["alpha"][j, 1 + i] for j in range(N)]
                for i in range(N)]

    def beta(t, b):
        return [s_b * torch.tanh(norm(h[t, b, s]) @ w_b) + p["beta"][s] for s in range(N)]

    expected_in, expected = hand_streams(h, f, a_m, a_r_transposed, beta)
    h_in, out = run_sublayer(conn, h, f)
    torch.testing.assert_close(h_in, expected_in, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def expand_reduce_pre_ln(kind, num_sublayers=7, streams=N, dtype=torch.float32):
    """A stack of ``num_sublayers`` pre-LN sublayers (LN then Linear then tanh, random LN
    gains) run as plain pre-LN ``x + F(LN(x))`` and through ``kind``'s connections:
    (pre-LN's output, the final streams, the connections)."""
    torch.manual_seed(0)
    norms = [perturbed(nn.LayerNorm(C), seed=k).to(dtype) for k in range(num_sublayers)]
    linears = [nn.Linear(C, C).to(dtype) for _ in range(num_sublayers)]
    if kind == "shc":
        conns = [StaticHyperMixer(C, streams, k) for k in range(num_sublayers)]
    elif kind == "dhc":  # a non-trivial norm: the dynamic part is 0 whatever the norm gives
        conns = [perturbed(build_norm(C), seed=10 + k) for k in range(num_sublayers)]
        conns = [DynamicHyperMixer(C, norm, streams, k) for k, norm in enumerate(conns)]
    else:
        conns = [ManifoldHyperMixer(C, streams, k) for k in range(num_sublayers)]
    conns = [c.to(dtype) for c in conns]
    x = randn(T, B, C, seed=3, dtype=dtype)
    h = expand_streams(x, streams)
    for k in range(num_sublayers):
        x = x + torch.tanh(linears[k](norms[k](x)))
        h_in, mixed, write = conns[k].width(h)
        h = conns[k].depth(torch.tanh(linears[k](norms[k](h_in))), mixed, write)
    return x, h, conns


@pytest.mark.parametrize("kind", ["shc", "dhc"])
def test_hc_at_init_is_pre_ln_on_every_stream(kind):
    """The paper's claim (§2.3), exactly: every stream is the pre-LN residual after each of
    7 sublayers (A_m cycling through the 3 streams); the reduced output is n times it."""
    with torch.no_grad():
        pre_ln, h, _ = expand_reduce_pre_ln(kind)
    for s in range(N):
        assert torch.equal(h[:, :, s], pre_ln)
    torch.testing.assert_close(reduce_streams(h), N * pre_ln, rtol=1e-6, atol=0)


def test_expand_and_reduce():
    x = randn(T, B, C)
    h = expand_streams(x, 4)
    assert h.shape == (T, B, 4, C) and all(torch.equal(h[:, :, s], x) for s in range(4))
    torch.testing.assert_close(reduce_streams(h), 4 * x, rtol=0, atol=1e-12)


def test_output_projection_init_factor_divides_by_sqrt_n():
    assert output_projection_init_factor(4) == pytest.approx(0.5)
    assert output_projection_init_factor(1) == 1.0


# ------------------------------------------------------------------ mHC


def test_sinkhorn_knopp_against_hand_computation_and_doubly_stochastic():
    logits = randn(5, 4, 4, seed=4)
    out = sinkhorn_knopp(logits, 20)
    for m in range(5):
        torch.testing.assert_close(out[m], hand_sinkhorn(logits[m], 20), rtol=0, atol=1e-12)
    # after 20 iterations (ending with the rows): rows sum to 1 to rounding, columns nearly
    torch.testing.assert_close(out.sum(-1), torch.ones(5, 4, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.sum(-2), torch.ones(5, 4, dtype=torch.float64), rtol=0, atol=1e-6)
    assert (out > 0).all()
    # the shift by the maximum changes nothing but overflow: exp(1000 + x) is inf
    torch.testing.assert_close(sinkhorn_knopp(logits + 1000.0, 20), out, rtol=0, atol=1e-12)
    # float32 (the dtype of the model): within float32 rounding
    out32 = sinkhorn_knopp(logits.float(), 20)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.sum(-2), torch.ones(5, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(out32.sum(-1), torch.ones(5, 4), rtol=0, atol=1e-6)


def test_sinkhorn_of_an_identity_logit_matrix_is_far_from_the_identity():
    """What the package's b_res = I starts from: diagonal e/(e+n-1), 0.475 at n = 4."""
    out = sinkhorn_knopp(torch.eye(4, dtype=torch.float64), 20)
    torch.testing.assert_close(torch.diagonal(out), torch.full((4,), math.e / (math.e + 3), dtype=torch.float64))


@pytest.mark.parametrize("index", [0, 1, 5])
def test_mhc_initial_maps_are_within_eps_of_hcs(index):
    """Our choice for the b's the paper leaves open: H_post = 1 exactly; H_pre =
    ε + (1-nε)e_{k mod n} (sums to 1); H_res = ε11ᵀ + (1-nε)I (0.97 on the diagonal at
    n = 4); α = 0.01, φ = 0; the paper's parameter count."""
    n, eps = 4, MHC_INIT_LEAK
    conn = ManifoldHyperMixer(C, n, index)
    assert not conn.phi.any() and conn.phi.shape == (n * C, n * n + 2 * n)
    assert all(torch.equal(a.data, torch.full((1,), 0.01)) for a in (conn.alpha_pre, conn.alpha_post, conn.alpha_res))
    assert sum(p.numel() for p in conn.parameters()) == n * C * (n * n + 2 * n) + n * n + 2 * n + 3
    with torch.no_grad():
        pre, post, res = conn.mappings(randn(T, B, n, C, seed=5, dtype=torch.float32))
    assert torch.equal(post, torch.ones(T, B, n))
    expected_pre = torch.full((n,), eps)
    expected_pre[index % n] = 1 - (n - 1) * eps
    torch.testing.assert_close(pre, expected_pre.expand(T, B, n), rtol=0, atol=1e-6)
    torch.testing.assert_close(pre.sum(-1), torch.ones(T, B), rtol=0, atol=1e-6)
    expected_res = torch.full((n, n), eps) + (1 - n * eps) * torch.eye(n)
    torch.testing.assert_close(res, expected_res.expand(T, B, n, n), rtol=0, atol=1e-6)
    assert float(res[0, 0, 0, 0]) == pytest.approx(0.97, abs=1e-6)


def test_mhc_against_hand_computation():
    """x⃗' = RMSNorm(vec H) over nC; H_pre = σ(α_pre x⃗'φ_pre + b_pre), H_post = 2σ(...),
    H_res = SK(α_res mat(x⃗'φ_res) + b_res); Ĥ = H_res H + H_postᵀ F(H_pre H) (Eq. 7-9)."""
    conn = perturbed(ManifoldHyperMixer(C, N, 1, sinkhorn_iterations=7))
    h, f = randn(T, B, N, C, seed=1), randn(T, B, C, seed=2)
    p = {name: v.detach() for name, v in conn.named_parameters()}
    maps = {}
    for t in range(T):
        for b in range(B):
            v = torch.cat([h[t, b, s] for s in range(N)])  # vec(x): stream 0's C values first
            v = v / torch.sqrt((v ** 2).mean() + 1e-5)
            proj = [sum(v[r] * p["phi"][r, c] for r in range(N * C)) for c in range(N * N + 2 * N)]
            pre = [sigmoid(p["alpha_pre"] * proj[s] + p["bias_pre"][s]) for s in range(N)]
            post = [2 * sigmoid(p["alpha_post"] * proj[N + s] + p["bias_post"][s]) for s in range(N)]
            logits = torch.stack([torch.cat([p["alpha_res"] * proj[2 * N + i * N + j] + p["bias_res"][i, j]
                                             for j in range(N)]) for i in range(N)])
            maps[t, b] = (pre, hand_sinkhorn(logits, 7), post)
    expected_in, expected = hand_streams(h, f, lambda t, b: maps[t, b][0], lambda t, b: maps[t, b][1],
                                         lambda t, b: maps[t, b][2])
    h_in, out = run_sublayer(conn, h, f)
    torch.testing.assert_close(h_in, expected_in, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_mhc_at_init_is_pre_ln_on_every_stream_to_rounding():
    """H_pre sums to 1, H_res's rows sum to 1, H_post = 1: with equal streams every stream
    is the pre-LN residual, up to rounding: a few float32 ulps (values up to 3 here); in
    float64, 1e-11, since the b's are stored in float32 (Σσ(b_pre) = 1 - 4e-9 at n = 3),
    a scale the branches' LayerNorm nearly removes."""
    with torch.no_grad():
        pre_ln, h, _ = expand_reduce_pre_ln("mhc", dtype=torch.float32)
        pre_ln64, h64, _ = expand_reduce_pre_ln("mhc", dtype=torch.float64)
    for s in range(N):
        torch.testing.assert_close(h[:, :, s], pre_ln, rtol=0, atol=2e-6)
        torch.testing.assert_close(h64[:, :, s], pre_ln64, rtol=0, atol=1e-11)


def test_mhc_refuses_one_stream_and_hc_takes_it():
    with pytest.raises(ValueError, match="at least 2 streams"):
        ManifoldHyperMixer(C, 1)
    conn = StaticHyperMixer(C, 1, 3)
    assert torch.equal(conn.alpha, torch.ones(1, 2))


# ------------------------------------------------------------------ gradients, bf16, TorchScript


def zero_gradients_over_steps(kind, steps):
    """A 5-sublayer stack in float64 trained ``steps`` SGD steps; at each step, the names of
    the parameters whose gradient is 0 (max below 1e-15: float64 rounding of O(1) values)."""
    torch.manual_seed(0)
    k_sub, n = 5, N
    if kind == "shc":
        conns = nn.ModuleList([StaticHyperMixer(C, n, k) for k in range(k_sub)])
    elif kind == "dhc":
        conns = nn.ModuleList([DynamicHyperMixer(C, build_norm(C), n, k) for k in range(k_sub)])
    else:
        conns = nn.ModuleList([ManifoldHyperMixer(C, n, k) for k in range(k_sub)])
    conns = conns.double()
    branches = [nn.Sequential(nn.LayerNorm(C), nn.Linear(C, C), nn.Tanh()).double() for _ in range(k_sub)]
    x, target = randn(4, 2, C, seed=1), randn(4, 2, C, seed=2)
    optimizer = torch.optim.SGD(conns.parameters(), lr=0.5)
    zero_grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        h = expand_streams(x, n)
        for conn, branch in zip(conns, branches):
            h_in, mixed, write = conn.width(h)
            h = conn.depth(branch(h_in), mixed, write)
        (reduce_streams(h) * target).sum().backward()
        zero_grads.append({name for name, p in conns.named_parameters() if p.grad.abs().max() < 1e-15})
        optimizer.step()
    return zero_grads, conns


def test_every_hc_parameter_gets_a_gradient():
    """SHC: all at once. DHC: W (and the static scalars) at once, since s = 0.01; s_α,
    s_β and the norm of H̄ only after W has moved off 0 (tanh(H̄·0) = 0)."""
    (at_init, after_step), _ = zero_gradients_over_steps("shc", 2)
    assert at_init == set() and after_step == set()
    (at_init, after_step), _ = zero_gradients_over_steps("dhc", 2)
    assert at_init == {f"{k}.{name}" for k in range(5)
                       for name in ("alpha_scale", "beta_scale", "norm.weight", "norm.bias")}
    assert after_step == set()


def test_every_mhc_parameter_gets_a_gradient_but_the_first_sublayers_mixing():
    """At init: φ and the b's of H_pre, H_post; not the α's (φ = 0) nor b_res (the streams
    are equal, and a row-stochastic H_res leaves equal streams unchanged). After one step
    the write-back weights differ between the streams (the e_k read weights give them
    different gradients), the streams differ, and b_res and φ_res get gradients; the α's
    once φ has moved. The first sublayer's H_res never gets one: its input is the n equal
    copies of the embedding (a property of the method, not of this init)."""
    (at_init, _, after_two), conns = zero_gradients_over_steps("mhc", 3)
    assert at_init == {f"{k}.{name}" for k in range(5) for name in ("alpha_pre", "alpha_post", "alpha_res", "bias_res")}
    assert after_two == {"0.bias_res", "0.alpha_res"}
    assert conns[0].phi.grad[:, 2 * N:].abs().max() < 1e-15
    assert all(conns[k].phi.grad[:, 2 * N:].abs().max() > 1e-6 for k in range(1, 5))


@pytest.mark.parametrize("kind", ["shc", "dhc", "mhc"])
def test_bf16_autocast_is_finite_and_close(kind):
    with torch.no_grad():
        full = expand_reduce_pre_ln(kind)[1]
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, h, conns = expand_reduce_pre_ln(kind)
        loss = reduce_streams(h).float().square().mean()
    loss.backward()
    assert torch.isfinite(h).all() and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for c in conns for p in c.parameters() if p.grad is not None)
    torch.testing.assert_close(h.float(), full, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("kind", ["shc", "dhc", "mhc"])
def test_stream_connections_script(kind):
    conn = {"shc": lambda: StaticHyperMixer(C, N, 1),
            "dhc": lambda: DynamicHyperMixer(C, build_norm(C, "dyt"), N, 1),
            "mhc": lambda: ManifoldHyperMixer(C, N, 1)}[kind]()
    conn = perturbed(conn)
    scripted = torch.jit.script(conn)
    h, f = randn(T, B, N, C, seed=1), randn(T, B, C, seed=2)
    for eager, script in zip(conn.width(h), scripted.width(h)):
        torch.testing.assert_close(script, eager, rtol=0, atol=0)
    torch.testing.assert_close(scripted.depth(f, h, conn.width(h)[2]), conn.depth(f, h, conn.width(h)[2]))


# ------------------------------------------------------------------ DenseFormer


def test_denseformer_is_the_identity_at_init():
    layers = 4
    dwa = DepthWeightedAverage(layers)
    assert dwa.weights.shape == (layers, layers + 1)
    xs = [torch.randn(T, B, C) for _ in range(layers + 1)]
    for i in range(1, layers + 1):
        assert torch.equal(dwa(xs[:i + 1]), xs[i])


def test_denseformer_against_hand_computation_in_a_stack():
    """X_i = Block_i(Y_{i-1}), Y_i = Σ_{j≤i} α_ij X_j, Y_0 = X_0, with learned α moved off init;
    the unused entries (j > i) get no gradient: L(L+3)/2 scalars are learned."""
    layers = 3
    dwa = perturbed(DepthWeightedAverage(layers))
    blocks = [perturbed(nn.Linear(C, C), seed=10 + i) for i in range(layers)]
    alpha = dwa.weights.detach()
    x0 = randn(T, B, C, seed=1)
    # by hand
    outputs, y = [x0], x0
    for i in range(1, layers + 1):
        outputs.append(torch.tanh(blocks[i - 1](y)).detach())
        y = sum(alpha[i - 1, j] * outputs[j] for j in range(i + 1))
    expected = y
    # the module
    history, y = [x0], x0
    for i in range(1, layers + 1):
        history.append(torch.tanh(blocks[i - 1](y)))
        y = dwa(history)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    y.sum().backward()
    used = torch.tril(torch.ones(layers, layers + 1), diagonal=1).bool()
    assert (dwa.weights.grad[used] != 0).all() and not dwa.weights.grad[~used].any()
    assert int(used.sum()) == layers * (layers + 3) // 2


def test_denseformer_scripts_and_checks_the_history():
    dwa = torch.jit.script(perturbed(DepthWeightedAverage(2)))
    xs = [randn(T, B, C, seed=i) for i in range(3)]
    w = dwa.weights.detach()
    torch.testing.assert_close(dwa(xs), w[1, 0] * xs[0] + w[1, 1] * xs[1] + w[1, 2] * xs[2], rtol=0, atol=1e-12)
    with pytest.raises(Exception, match="1 <= i <= num_layers"):
        dwa(xs[:1])


# ------------------------------------------------------------------ HybridNorm's attention

HEADS, DIM = 2, 8
SOFTMAX_ATOL = 1e-6  # fairseq computes the softmax in float32 (utils.softmax), even for float64 input


def attention(normalization, **kwargs):
    torch.manual_seed(0)
    attn = qkv_norm_attention(DIM, HEADS, normalization=normalization, **kwargs)
    return perturbed(attn, seed=1, scale=0.2).eval()


def hand_norm(v, proj):
    """The per-head norm of ``proj`` (a HeadNormedLinear) by hand, on a (..., d_head) slice."""
    norm = proj.norm
    if isinstance(norm, nn.RMSNorm):
        return v / torch.sqrt((v ** 2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    if isinstance(norm, DynamicTanh):
        return norm.weight * torch.tanh(norm.alpha * v) + norm.bias
    return layer_norm(v, norm.weight, norm.bias)


def hand_attention(attn, query, key, key_padding_mask=None, causal=False):
    """softmax(Norm(Q)Norm(K)ᵀ/√d_head) Norm(V) per head, then out_proj; (T, B, C) inputs."""
    d = DIM // HEADS

    def project(proj, x):  # (L, B, C) -> (B, H, L, d), normalized per head
        y = torch.einsum("lbi,oi->lbo", x, proj.weight) + proj.bias
        return hand_norm(y.reshape(y.shape[0], y.shape[1], HEADS, d), proj).permute(1, 2, 0, 3)

    q, k, v = project(attn.q_proj, query), project(attn.k_proj, key), project(attn.v_proj, key)
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:]).triu(1).bool(), float("-inf"))
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    heads = torch.einsum("bhts,bhsd->tbhd", torch.softmax(scores, dim=-1), v)
    return torch.einsum("tbi,oi->tbo", heads.reshape(heads.shape[0], heads.shape[1], DIM),
                        attn.out_proj.weight) + attn.out_proj.bias


def future_mask(length):
    return torch.triu(torch.full((length, length), float("-inf"), dtype=torch.float64), 1)


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm", "dyt"])
def test_qkv_norm_self_attention_against_hand_computation(normalization):
    """In training mode (no dropout) too: fairseq's fused fast path, which would skip the
    norms, is not taken."""
    attn = attention(normalization, self_attention=True)
    assert has_qkv_norm(attn) and isinstance(attn.k_proj, HeadNormedLinear)
    assert attn.q_proj.norm.weight.shape == (DIM // HEADS,)
    x = randn(4, B, DIM, seed=2)
    for train in (False, True):
        attn.train(train)
        out, _ = attn(x, x, x, attn_mask=future_mask(4))
        torch.testing.assert_close(out, hand_attention(attn, x, x, causal=True), rtol=0, atol=SOFTMAX_ATOL)


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm", "dyt"])
def test_qkv_norm_attention_decodes_incrementally_like_the_full_forward(normalization):
    """Self-attention step by step (the cache holds the normalized keys and values) and
    cross-attention with static_kv (its keys normalized once, at the first step)."""
    length, src_len = 5, 4
    x, enc = randn(length, B, DIM, seed=2), randn(src_len, B, DIM, seed=3)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    self_attn = attention(normalization, self_attention=True)
    cross = attention(normalization, encoder_decoder_attention=True)
    full_self, _ = self_attn(x, x, x, attn_mask=future_mask(length))
    full_cross, _ = cross(x, enc, enc, key_padding_mask=pad, static_kv=True)
    torch.testing.assert_close(full_cross, hand_attention(cross, x, enc, key_padding_mask=pad), rtol=0,
                               atol=SOFTMAX_ATOL)
    state = {}
    steps_self, steps_cross = [], []
    for t in range(length):
        step = x[t:t + 1]
        steps_self.append(self_attn(step, step, step, incremental_state=state)[0])
        steps_cross.append(cross(step, enc, enc, key_padding_mask=pad, incremental_state=state, static_kv=True)[0])
    torch.testing.assert_close(torch.cat(steps_self), full_self, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat(steps_cross), full_cross, rtol=0, atol=1e-12)
    # the cached keys are the normalized projections, (B, heads, length, d_head)
    d = DIM // HEADS
    for attn, source in ((self_attn, x), (cross, enc)):
        cached = attn._get_input_buffer(state)["prev_key"]
        y = torch.einsum("lbi,oi->lbo", source, attn.k_proj.weight) + attn.k_proj.bias
        expected = hand_norm(y.reshape(y.shape[0], B, HEADS, d), attn.k_proj).permute(1, 2, 0, 3)
        torch.testing.assert_close(cached, expected, rtol=0, atol=1e-12)


def test_qkv_norm_attention_keeps_fairseqs_keys_and_init():
    """The projections' state-dict keys and shapes are fairseq's (a fairseq attention's
    weights load into it, only the norms missing); same seed, same initial weights."""
    torch.manual_seed(0)
    plain = MultiheadAttention(DIM, HEADS, self_attention=True)
    torch.manual_seed(0)
    normed = qkv_norm_attention(DIM, HEADS, self_attention=True)
    ours, theirs = normed.state_dict(), plain.state_dict()
    assert all(torch.equal(ours[key], value) for key, value in theirs.items())
    extra = set(ours) - set(theirs)
    assert extra == {f"{p}_proj.norm.{w}" for p in "qkv" for w in ("weight", "bias")}
    missing = qkv_norm_attention(DIM, HEADS, self_attention=True).load_state_dict(theirs, strict=False).missing_keys
    assert set(missing) == extra


def test_qkv_norm_attention_scripts_and_runs_under_bf16_autocast():
    attn = attention("layer_norm", self_attention=True).float()
    scripted = torch.jit.script(attn)
    x = torch.randn(4, B, DIM)
    mask = future_mask(4).float()
    torch.testing.assert_close(scripted(x, x, x, attn_mask=mask)[0], attn(x, x, x, attn_mask=mask)[0])
    attn.train()
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x, x, x, attn_mask=mask)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
