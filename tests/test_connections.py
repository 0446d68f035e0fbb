"""Each connection kind against its equation, computed by hand on small tensors."""
import math

import pytest
import torch
import torch.nn.functional as F

from resnmt.modules.connections import (
    CONNECTION_KINDS,
    ConnectionConfigError,
    ConnectionSpec,
    SASConnection,
    build_connection,
)
from resnmt.modules.gates import ScalarGates

DIM = 6


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 2, DIM, generator=g, dtype=torch.float64)
    fx = torch.randn(3, 2, DIM, generator=g, dtype=torch.float64)
    return x, fx


def layer_norm(v, weight, bias, eps=1e-5):
    """LN by hand: (v - mean) / sqrt(var + eps) * w + b, biased variance over features."""
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps) * weight + bias


def connection(kind, **spec):
    torch.manual_seed(0)
    conn = build_connection(DIM, ConnectionSpec(kind=kind, **spec)).double()
    with torch.no_grad():  # non-trivial LN gains and biases
        for name, p in conn.named_parameters():
            if "norm" in name:
                p.add_(0.5 * torch.randn_like(p))
    return conn


def test_post_ln():
    x, fx = inputs()
    c = connection("post_ln")
    expected = layer_norm(x + fx, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)
    assert torch.equal(c.prenorm(x), x)


def test_pre_ln():
    x, fx = inputs()
    c = connection("pre_ln")
    torch.testing.assert_close(c.prenorm(x), layer_norm(x, c.norm.weight, c.norm.bias), rtol=0, atol=1e-12)
    torch.testing.assert_close(c(x, fx), x + fx, rtol=0, atol=0)


@pytest.mark.parametrize("lam", [0.5, 1.0, 2.0, 3.0])
def test_xskip(lam):
    x, fx = inputs()
    c = connection("xskip", skip_lambda=lam)
    torch.testing.assert_close(c(x, fx), lam * x + fx, rtol=0, atol=1e-15)
    assert not list(c.parameters())


@pytest.mark.parametrize("lam", [0.5, 2.0, 3.0])
def test_xskip_ln(lam):
    x, fx = inputs()
    c = connection("xskip_ln", skip_lambda=lam)
    expected = layer_norm(lam * x + fx, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("lam", [1, 2, 3])
def test_rskip_ln(lam):
    x, fx = inputs()
    c = connection("rskip_ln", skip_lambda=lam)
    assert len(c.norms) == lam
    y = layer_norm(x + fx, c.norms[0].weight, c.norms[0].bias)
    for k in range(1, lam):
        y = layer_norm(x + y, c.norms[k].weight, c.norms[k].bias)
    torch.testing.assert_close(c(x, fx), y, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["rskip_ln", "xskip_ln"])
def test_lambda_one_is_post_ln(kind):
    x, fx = inputs()
    post, other = connection("post_ln"), connection(kind, skip_lambda=1)
    norm = other.norms[0] if kind == "rskip_ln" else other.norm
    post.norm.load_state_dict(norm.state_dict())
    torch.testing.assert_close(other(x, fx), post(x, fx), rtol=0, atol=0)


def sas_gate_by_hand(gates: ScalarGates, i: int, z):
    """S_i(z) = tanh(z W_f + b_f) W_ff + b_ff for gate i (its block of the stacked weight)."""
    h = gates.hidden_dim
    w_f = gates.hidden.weight[i * h:(i + 1) * h].T  # in x h
    b_f = gates.hidden.bias[i * h:(i + 1) * h]
    w_ff = gates.out_weight[i].unsqueeze(-1)  # h x 1
    return torch.sigmoid(torch.tanh(z @ w_f + b_f) @ w_ff + gates.out_bias[i])


@pytest.mark.parametrize("gamma_form", ["product", "gate"])
def test_sas_two_layer_gate_equation(gamma_form):
    x, fx = inputs()
    c = connection("sas", sas_gamma=gamma_form, sas_alpha_bias_init=0.7, sas_beta_bias_init=-0.4)
    z = torch.cat([x, fx], -1)
    alpha = sas_gate_by_hand(c.gates, 0, z)
    beta = sas_gate_by_hand(c.gates, 1, z)
    gamma = sas_gate_by_hand(c.gates, 2, z) if gamma_form == "gate" else (1 - alpha) * (1 - beta)
    expected = alpha * x + beta * fx + gamma * layer_norm(x + fx, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)
    assert alpha.shape == (3, 2, 1)  # one scalar per position


def test_sas_single_layer_gate_equation():
    x, fx = inputs()
    c = connection("sas", sas_gate="single_layer")
    z = torch.cat([x, fx], -1)
    alpha = torch.sigmoid(z @ c.gates.out_weight[0] + c.gates.out_bias[0]).unsqueeze(-1)
    beta = torch.sigmoid(z @ c.gates.out_weight[1] + c.gates.out_bias[1]).unsqueeze(-1)
    expected = alpha * x + beta * fx + (1 - alpha) * (1 - beta) * layer_norm(x + fx, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)
    assert c.gates.out_weight.shape == (2, 2 * DIM)  # W is 2h x 1 per gate


def test_sas_bias_init():
    c = connection("sas", sas_gamma="gate", sas_alpha_bias_init=3, sas_beta_bias_init=-3, sas_gamma_bias_init=1)
    assert c.gates.out_bias.tolist() == [3.0, -3.0, 1.0]


def forced(value, like):
    return torch.full(like.shape[:-1] + (1,), float(value), dtype=like.dtype)


def test_sas_special_cases():
    """SAS Table 2: the seven special cases of eq. 4 with the gates forced."""
    x, fx = inputs()
    c: SASConnection = connection("sas")
    ln = layer_norm(x + fx, c.norm.weight, c.norm.bias)

    def out(alpha, beta):
        a, b = forced(alpha, x), forced(beta, x)
        return c.combine(x, fx, a, b, (1 - a) * (1 - b))

    torch.testing.assert_close(out(0, 0), ln, rtol=0, atol=1e-12)  # 1: post-LN Transformer
    torch.testing.assert_close(out(0, 1), fx, rtol=0, atol=1e-12)  # 2: F alone
    torch.testing.assert_close(out(1, 0), x, rtol=0, atol=1e-12)  # 3: x alone
    torch.testing.assert_close(out(1, 1), x + fx, rtol=0, atol=1e-12)  # 4: ResNet
    torch.testing.assert_close(out(1, 0.3), x + 0.3 * fx, rtol=0, atol=1e-12)  # 5: Inception-v4
    torch.testing.assert_close(out(0.3, 1), 0.3 * x + fx, rtol=0, atol=1e-12)  # 6: shortcut-only gating
    beta = 0.7  # 7: alpha = 1 - beta, Highway Net + Transformer
    torch.testing.assert_close(
        out(1 - beta, beta), (1 - beta) * x + beta * fx + beta * (1 - beta) * ln, rtol=0, atol=1e-12
    )


def test_sas_gate_parameter_count_matches_paper():
    """Each two-layer gate at h = 512: 2h*h + 2h + 1 = 525,313 parameters."""
    c = build_connection(512, ConnectionSpec(kind="sas"))
    gate_params = sum(p.numel() for p in c.gates.parameters())
    assert gate_params == 2 * 525_313
    c3 = build_connection(512, ConnectionSpec(kind="sas", sas_gamma="gate"))
    assert sum(p.numel() for p in c3.gates.parameters()) == 3 * 525_313
    small = build_connection(512, ConnectionSpec(kind="sas", sas_gate_dim=64))
    assert sum(p.numel() for p in small.gates.parameters()) == 2 * (1024 * 64 + 64 + 64 + 1)
    single = build_connection(512, ConnectionSpec(kind="sas", sas_gate="single_layer"))
    assert sum(p.numel() for p in single.gates.parameters()) == 2 * (1024 + 1)


def test_highway():
    x, fx = inputs()
    c = connection("highway", highway_bias_init=-1.5)
    assert torch.all(c.transform_gate.bias == -1.5)
    t = torch.sigmoid(x @ c.transform_gate.weight.T + c.transform_gate.bias)
    torch.testing.assert_close(c(x, fx), t * fx + (1 - t) * x, rtol=0, atol=1e-12)
    assert c.transform_gate.weight.shape == (DIM, DIM)  # per-dimension gate


@pytest.mark.parametrize(
    "spec, message",
    [
        (dict(kind="rskip_ln", skip_lambda=2.5), "--skip-lambda 2.5 is invalid for --residual rskip_ln: it must be an integer >= 1"),
        (dict(kind="rskip_ln", skip_lambda=0), "--skip-lambda 0 is invalid for --residual rskip_ln"),
        (dict(kind="xskip_ln", skip_lambda=-1), "--skip-lambda -1 is invalid for --residual xskip_ln: it must be a real number > 0"),
        (dict(kind="xskip", skip_lambda=0), "--skip-lambda 0 is invalid for --residual xskip"),
        (dict(kind="sas", sas_gate_dim=0), "--sas-gate-dim 0 is invalid: it must be an integer > 0"),
        (dict(kind="dense"), "--residual 'dense' is not a connection kind; choose one of post_ln, pre_ln"),
    ],
)
def test_bad_specs_name_flag_value_and_allowed(spec, message):
    with pytest.raises(ConnectionConfigError) as err:
        ConnectionSpec(**spec)
    assert message in str(err.value)


@pytest.mark.parametrize("kind", CONNECTION_KINDS)
def test_every_kind_finite_under_bf16_autocast(kind):
    torch.manual_seed(0)
    conn = build_connection(DIM, ConnectionSpec(kind=kind))
    x = torch.randn(5, 3, DIM) * 30
    fx = torch.randn(5, 3, DIM) * 30
    ref = conn(x, fx)
    assert torch.isfinite(ref).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conn(x, fx)
    assert torch.isfinite(y).all()
    assert math.isclose(float((y.float() - ref).abs().max().detach()), 0.0, abs_tol=0.1 * float(ref.abs().max().detach()) + 0.5)
