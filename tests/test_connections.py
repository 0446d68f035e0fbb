"""Each connection kind against its equation, computed by hand on small tensors."""
import math

import pytest
import torch
import torch.nn.functional as F

from resnmt.connections import (
    CONNECTION_CLASSES,
    CONNECTION_FLAGS,
    CONNECTION_KINDS,
    ConnectionConfigError,
    ConnectionSpec,
    SASConnection,
    admin_omega,
    build_connection,
    build_stream,
    deepnorm_constants,
)
from resnmt.connections.gated import ScalarGates

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
        (dict(kind="rskip_ln", skip_lambda_learned=True),
         "--skip-lambda-learned is invalid for --residual rskip_ln: it applies only to xskip, xskip_ln"),
        (dict(kind="post_ln", skip_lambda_learned=True),
         "--skip-lambda-learned is invalid for --residual post_ln: it applies only to xskip, xskip_ln"),
        (dict(kind="deepnorm", skip_lambda_learned=True), "--skip-lambda-learned is invalid for --residual deepnorm"),
        (dict(kind="admin", admin_output_change_scale="O(n^2)"),
         "--admin-output-change-scale 'O(n^2)': choose one of O(logn), O(n), O(1)"),
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
    if conn.multi_stream:  # hyper, mhc: the connection reads and returns n streams (T, B, n, C)
        x = torch.randn(5, 3, conn.streams.num_streams, DIM) * 30
    fx = torch.randn(5, 3, DIM) * 30
    ref = conn(x, fx)
    assert torch.isfinite(ref).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conn(x, fx)
    assert torch.isfinite(y).all()
    assert math.isclose(float((y.float() - ref).abs().max().detach()), 0.0, abs_tol=0.1 * float(ref.abs().max().detach()) + 0.5)


# ------------------------------------------------------------------ DeepNorm, ReZero, Admin, learned lambda

@pytest.mark.parametrize(
    "n, m, encoder, decoder",
    [
        # by hand: 6^5 = 7776, 7776^(1/16) = e^(8.95879/16) = 1.75054; 18^(1/4) = 2.05977; 72^(1/4) = 2.91295
        (6, 6, (0.81 * 1.75054, 0.87 / 1.75054), (2.05977, 1 / 2.91295)),
        # 18^5 = 1889568, ^(1/16) = e^(14.45192/16) = 2.46759; 54^(1/4) = 2.71081; 216^(1/4) = 3.83366
        (18, 18, (0.81 * 2.46759, 0.87 / 2.46759), (2.71081, 1 / 3.83366)),
        # 100^5 = 1e10, ^(1/16) = 10^0.625 = 4.21697; 300^(1/4) = 4.16179; 1200^(1/4) = 5.88566
        (100, 100, (0.81 * 4.21697, 0.87 / 4.21697), (4.16179, 1 / 5.88566)),
    ],
)
def test_deepnorm_constants_against_hand_computation(n, m, encoder, decoder):
    for side, (alpha, beta) in (("encoder", encoder), ("decoder", decoder)):
        got = deepnorm_constants(side, n, m)
        assert got == pytest.approx((alpha, beta), rel=2e-5), side
        conn = build_connection(DIM, ConnectionSpec(kind="deepnorm", side=side, encoder_layers=n, decoder_layers=m))
        assert (conn.alpha, conn.beta) == got
        assert conn.skip_scale == got[0]  # the skip weight of LN(alpha*x + F)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_deepnorm_equation(side):
    x, fx = inputs()
    c = connection("deepnorm", side=side, encoder_layers=3, decoder_layers=2)
    alpha = 0.81 * (3 ** 4 * 2) ** (1 / 16) if side == "encoder" else (3 * 2) ** 0.25
    expected = layer_norm(alpha * x + fx, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)


def test_deepnorm_initializes_value_output_and_ffn_with_gain_beta():
    """Xavier-normal: std = gain * sqrt(2 / (fan_in + fan_out)); gain beta for value,
    output and both FFN weights, 1 for query and key (DeepNet, Figure 2)."""
    torch.manual_seed(0)
    c = build_connection(DIM, ConnectionSpec(kind="deepnorm", side="decoder", encoder_layers=6, decoder_layers=6))
    shapes = {"query": (96, 64), "key": (96, 64), "value": (96, 64), "output": (64, 96), "ffn_in": (256, 64)}
    projections = {role: torch.nn.Linear(*reversed(shape)) for role, shape in shapes.items()}
    c.initialize_sublayer(projections)
    for role, linear in projections.items():
        fan_out, fan_in = linear.weight.shape
        gain = 1.0 if role in ("query", "key") else c.beta
        expected = gain * math.sqrt(2.0 / (fan_in + fan_out))
        # 6,144+ samples: the sample std is within 5% of the true one with overwhelming probability
        assert float(linear.weight.detach().std()) == pytest.approx(expected, rel=0.05), role
        assert abs(float(linear.weight.detach().mean())) < 0.1 * expected


def test_other_kinds_leave_the_sublayer_init_alone():
    linear = torch.nn.Linear(DIM, DIM)
    before = linear.weight.detach().clone()
    for kind in CONNECTION_KINDS:
        if kind != "deepnorm":
            build_connection(DIM, ConnectionSpec(kind=kind)).initialize_sublayer({"value": linear})
    assert torch.equal(linear.weight, before)


def test_rezero_equation_and_init():
    x, fx = inputs()
    c = connection("rezero")
    assert c.residual_weight.shape == (1,) and float(c.residual_weight.detach()) == 0.0
    torch.testing.assert_close(c(x, fx), x, rtol=0, atol=0)  # the identity at init
    with torch.no_grad():
        c.residual_weight.fill_(0.7)
    torch.testing.assert_close(c(x, fx), x + 0.7 * fx, rtol=0, atol=1e-15)
    assert not any("norm" in name for name, _ in c.named_parameters())


@pytest.mark.parametrize(
    "scale, n, omega",
    [
        # O(logn), n = 2N = 12: sqrt(13 / ln 13 - 1) = sqrt(13 / 2.564949 - 1) = sqrt(4.068319)
        ("O(logn)", 12, 2.017008),
        # n = 3M = 18: sqrt(19 / ln 19 - 1) = sqrt(19 / 2.944439 - 1) = sqrt(5.452786)
        ("O(logn)", 18, 2.335120),
        ("O(n)", 12, 1.0),
        ("O(1)", 18, math.sqrt(18)),
    ],
)
def test_admin_omega_initialisation_against_hand_computation(scale, n, omega):
    assert admin_omega(n, scale) == pytest.approx(omega, abs=2e-5)
    side, layers = ("encoder", dict(encoder_layers=n // 2)) if n == 12 else ("decoder", dict(decoder_layers=n // 3))
    c = build_connection(DIM, ConnectionSpec(kind="admin", side=side, admin_output_change_scale=scale, **layers))
    assert c.skip_scale.shape == (DIM,) and c.skip_scale.requires_grad
    torch.testing.assert_close(c.skip_scale.detach(), torch.full((DIM,), admin_omega(n, scale)), rtol=0, atol=0)


def test_admin_equation_with_a_trained_omega():
    x, fx = inputs()
    c = connection("admin", side="decoder", decoder_layers=4)
    with torch.no_grad():
        c.skip_scale.copy_(torch.linspace(0.5, 3.0, DIM, dtype=torch.float64))
    expected = layer_norm(c.skip_scale * x + fx, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["xskip", "xskip_ln"])
def test_learned_lambda_is_a_vector_initialised_to_skip_lambda(kind):
    x, fx = inputs()
    c = connection(kind, skip_lambda=1.5, skip_lambda_learned=True)
    torch.testing.assert_close(c.skip_scale.detach(), torch.full((DIM,), 1.5, dtype=torch.float64), rtol=0, atol=0)
    with torch.no_grad():
        c.skip_scale.copy_(torch.linspace(0.2, 2.0, DIM, dtype=torch.float64))
    z = c.skip_scale * x + fx
    expected = layer_norm(z, c.norm.weight, c.norm.bias) if kind == "xskip_ln" else z
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)
    c(x, fx).sum().backward()
    assert c.skip_scale.grad is not None and torch.all(c.skip_scale.grad != 0)


def test_spec_is_immutable_and_copies_validate():
    import copy
    import pickle

    spec = ConnectionSpec(kind="admin", side="decoder", decoder_layers=3)
    with pytest.raises(AttributeError):
        spec.kind = "post_ln"
    assert copy.deepcopy(spec) == spec == pickle.loads(pickle.dumps(spec))
    assert hash(spec) == hash(copy.copy(spec))
    with pytest.raises(TypeError, match="unknown options"):
        ConnectionSpec(kind="sas", sas_gates=2)
    # a spec pickled before ConnectionSpec was a dataclass unpickles through this call
    from resnmt.connections.spec import _rebuild_spec

    old = _rebuild_spec("admin", spec.settings(), dict(spec.options))
    assert old == spec and old.admin_output_change_scale == spec.admin_output_change_scale == "O(logn)"


def test_registry_is_the_one_list():
    """Kinds, flags, final-norm rule and statistics all come from the classes."""
    assert CONNECTION_KINDS == tuple(CONNECTION_CLASSES)[:len(CONNECTION_KINDS)]  # the user's kinds after them
    owned = {flag.dest for cls in CONNECTION_CLASSES.values() for flag in cls.flags}
    assert owned == set(CONNECTION_FLAGS)
    # the declared capabilities are what the kinds build: a stack's stream, n streams, learned rows
    assert {kind for kind, cls in CONNECTION_CLASSES.items() if cls.crosses_layers} == {
        kind for kind in CONNECTION_CLASSES if build_stream(DIM, ConnectionSpec(kind=kind)) is not None} == {
        "resi_dual", "dlcl", "dlcl_post", "denseformer", "hyper", "mhc"}
    assert {kind for kind, cls in CONNECTION_CLASSES.items() if cls.multi_stream} == {"hyper", "mhc"} == {
        kind for kind in CONNECTION_CLASSES if build_connection(DIM, ConnectionSpec(kind=kind)).learned()}
    for kind, cls in CONNECTION_CLASSES.items():
        assert cls.kind == kind and cls.equation and cls.source
        conn = build_connection(DIM, ConnectionSpec(kind=kind))
        x, fx = (t.float() for t in inputs())
        with torch.no_grad():
            measured = conn.measure(x, fx)
        assert set(measured) == {stat.name for stat in conn.measured_statistics()}, kind
        assert all(v.shape == x.shape[:-1] for v in measured.values()), kind


def test_a_spec_for_one_layer_knows_its_index_and_is_the_same_otherwise():
    """A kind may depend on its layer's position: each layer's connections are built from
    ``spec.at_layer(i)``, which changes nothing else and validates nothing again."""
    spec = ConnectionSpec(kind="xskip_ln", side="decoder", decoder_layers=4, skip_lambda=1.5)
    layer = spec.at_layer(3)
    assert spec.layer_index is None and layer.layer_index == 3
    assert layer.settings() == {**spec.settings(), "layer_index": 3} and layer.options == spec.options
    assert layer.layers == spec.layers == 4
