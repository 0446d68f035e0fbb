"""The kinds that cross layers (B2T, ResiDual, DLCL), Peri-LN and --normalization, each
against its equation computed by hand: on small tensors, on one layer, and on a whole
stack whose layers are run one by one."""
import pytest
import torch
import torch.nn.functional as F

from model_utils import build, encoder_output_and_input, parse_train_args, randomize_norms, sample_batch
from resnmt.connections import ConnectionConfigError, ConnectionSpec, build_connection, build_stream
from resnmt.connections.norms import DynamicTanh
from resnmt.connections.streams import DLCLStream, dlcl_initial_weights

DIM = 6


def tensors(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 2, DIM, generator=g, dtype=torch.float64) for _ in range(n)]


def layer_norm(v, weight, bias, eps=1e-5):
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps) * weight + bias


def rms_norm(v, weight, eps=1e-5):
    return v / torch.sqrt((v ** 2).mean(-1, keepdim=True) + eps) * weight


def perturbed(module, seed=0):
    """``module`` in float64 with every parameter moved off its initial value."""
    g = torch.Generator().manual_seed(seed)
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


# ----------------------------------------------------------------------- normalizations


def test_rms_norm_and_dyt_against_hand_computation():
    (x,) = tensors(1)
    rms = perturbed(ConnectionSpec("post_ln", normalization="rms_norm").norm(DIM))
    torch.testing.assert_close(rms(x), rms_norm(x, rms.weight), rtol=0, atol=1e-12)
    dyt = ConnectionSpec("post_ln", normalization="dyt", dyt_alpha_init=0.8).norm(DIM)
    assert isinstance(dyt, DynamicTanh) and float(dyt.alpha) == pytest.approx(0.8)
    assert torch.equal(dyt.weight, torch.ones(DIM)) and torch.equal(dyt.bias, torch.zeros(DIM))
    dyt = perturbed(dyt)
    torch.testing.assert_close(dyt(x), dyt.weight * torch.tanh(dyt.alpha * x) + dyt.bias, rtol=0, atol=1e-12)


@pytest.mark.parametrize("normalization", ["rms_norm", "dyt"])
def test_normalization_replaces_every_norm_of_the_model(tiny_bin, normalization):
    """Every norm a connection, a stream or a stack owns is the chosen one; no LayerNorm is left."""
    expected = torch.nn.RMSNorm if normalization == "rms_norm" else DynamicTanh
    for kind in ("pre_ln", "sas", "resi_dual", "dlcl", "peri_ln", "rskip_ln"):
        model, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind, "--normalization", normalization])
        norms = [m for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm, DynamicTanh))]
        assert norms and all(isinstance(m, expected) for m in norms), kind
        for side in (model.encoder, model.decoder):
            assert side.layer_norm is None or isinstance(side.layer_norm, expected)


def test_layer_norm_stays_fairseqs_and_checkpoint_keys_are_unchanged(tiny_bin):
    default, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "pre_ln"])
    explicit, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "pre_ln", "--normalization", "layer_norm"])
    assert list(default.state_dict()) == list(explicit.state_dict())
    assert "encoder.layer_norm.bias" in default.state_dict()


@pytest.mark.parametrize("kind", ["xskip", "highway", "rezero"])
def test_kinds_without_a_norm_refuse_another_normalization(kind):
    with pytest.raises(ConnectionConfigError, match=f"--normalization rms_norm is invalid for --residual {kind}"):
        ConnectionSpec(kind, normalization="rms_norm")
    with pytest.raises(ConnectionConfigError, match="choose one of layer_norm, rms_norm, dyt"):
        ConnectionSpec("post_ln", normalization="batch_norm")
    with pytest.raises(ConnectionConfigError, match="--dyt-alpha-init 0 is invalid"):
        ConnectionSpec("post_ln", normalization="dyt", dyt_alpha_init=0.0)


# ----------------------------------------------------------------------- Peri-LN and B2T


def test_peri_ln_equation():
    x, fx, _ = tensors()
    c = perturbed(build_connection(DIM, ConnectionSpec("peri_ln")))
    torch.testing.assert_close(c.prenorm(x), layer_norm(x, c.input_norm.weight, c.input_norm.bias), rtol=0, atol=1e-12)
    expected = x + layer_norm(fx, c.output_norm.weight, c.output_norm.bias)
    torch.testing.assert_close(c(x, fx), expected, rtol=0, atol=1e-12)
    assert ConnectionSpec("peri_ln").has_final_norm


def test_b2t_connection_adds_the_layer_input_inside_the_last_ln():
    x, fx, bottom = tensors()
    c = perturbed(build_connection(DIM, ConnectionSpec("b2t")))
    torch.testing.assert_close(c(x, fx), layer_norm(x + fx, c.norm.weight, c.norm.bias), rtol=0, atol=1e-12)
    expected = layer_norm(x + fx + bottom, c.norm.weight, c.norm.bias)
    torch.testing.assert_close(c(x, fx, bottom), expected, rtol=0, atol=1e-12)


def ffn_by_hand(layer, h):
    return layer.fc2(F.relu(layer.fc1(h)))


def attention_by_hand(attention, query, key, mask=None):
    return attention(query=query, key=key, value=key, key_padding_mask=mask, need_weights=False,
                     static_kv=query is not key)[0]


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_b2t_layer_equation(tiny_bin, side):
    """Encoder: h = LN1(x + Attn(x)), y = LN2(h + FFN(h) + x); decoder through both
    attentions: h1 = LN1(x + SelfAttn(x)), h2 = LN2(h1 + CrossAttn(h1)), y = LN3(h2 + FFN(h2) + x)."""
    model, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "b2t"])
    randomize_norms(model)
    model.eval()
    layer = getattr(model, side).layers[1]
    x = torch.randn(5, 2, 16)
    memory = torch.randn(4, 2, 16)
    with torch.no_grad():
        if side == "encoder":
            got = layer(x, None)[0]  # a layer returns (x, extra, residual sum)
            c1, c2 = layer.self_attn_connection, layer.ffn_connection
            h = c1.norm(x + attention_by_hand(layer.self_attn, x, x))
            expected = c2.norm(h + ffn_by_hand(layer, h) + x)
        else:
            got = layer(x, memory, None)[0]
            c1, c2, c3 = layer.self_attn_connection, layer.encoder_attn_connection, layer.ffn_connection
            h1 = c1.norm(x + attention_by_hand(layer.self_attn, x, x))
            h2 = c2.norm(h1 + attention_by_hand(layer.encoder_attn, h1, memory))
            expected = c3.norm(h2 + ffn_by_hand(layer, h2) + x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_b2t_rescaled_init_scales_every_projection(tiny_bin):
    plain, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "b2t"], seed=3)
    scaled, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "b2t", "--b2t-rescale-init"], seed=3)
    layer_p, layer_s = plain.decoder.layers[0], scaled.decoder.layers[0]
    for name in ("fc1", "fc2", "self_attn.q_proj", "self_attn.out_proj", "encoder_attn.v_proj"):
        wp = layer_p.get_submodule(name).weight
        ws = layer_s.get_submodule(name).weight
        torch.testing.assert_close(ws, wp * 2 ** -0.5, rtol=0, atol=1e-7)  # L = 2 layers


# ----------------------------------------------------------------------- the streams


def test_resi_dual_stream_equation():
    x0, f1, f2 = tensors()
    spec = ConnectionSpec("resi_dual", resi_dual_scale=0.5, resi_dual_alpha=0.7)
    stream = perturbed(build_stream(DIM, spec))
    state = stream.begin(x0)
    state = stream.after_layer(state, 0, torch.zeros_like(x0), f1)
    state = stream.after_layer(state, 1, torch.zeros_like(x0), f2)
    xn = x0 * 3
    d = 0.5 * x0 + 0.5 * f1 + 0.5 * f2
    expected = 0.7 * xn + layer_norm(d, stream.norm.weight, stream.norm.bias)
    torch.testing.assert_close(stream.end(state, xn), expected, rtol=0, atol=1e-12)
    assert stream.layer_input(state, 1, xn) is xn


@pytest.mark.parametrize("layers, window, expected", [
    (2, None, [[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]]),
    (3, 2, [[1, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [0, 1 / 2, 1 / 2, 0], [0, 0, 1 / 2, 1 / 2]]),
])
def test_dlcl_initial_weights_are_the_average_within_the_window(layers, window, expected):
    torch.testing.assert_close(dlcl_initial_weights(layers, window), torch.tensor(expected), rtol=0, atol=1e-7)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_dlcl_stream_equation(pre_norm):
    """pre-norm: x_l = sum_k W[l,k] LN_k(y_k) (y_0 raw); post-norm: x_l = LN_l(sum_k W[l,k] y_k)."""
    y0, y1, y2 = tensors()
    spec = ConnectionSpec("dlcl" if pre_norm else "dlcl_post", encoder_layers=2)
    stream = perturbed(build_stream(DIM, spec))
    assert isinstance(stream, DLCLStream) and stream.pre_norm == pre_norm
    W = stream.weights.detach()
    ln = [lambda v, n=n: layer_norm(v, n.weight, n.bias) for n in stream.norms]
    state = stream.begin(y0)
    torch.testing.assert_close(stream.layer_input(state, 0, y0), W[0, 0] * y0, rtol=0, atol=1e-12)
    state = stream.after_layer(state, 0, y1, None)
    state = stream.after_layer(state, 1, y2, None)
    if pre_norm:
        h1, h2 = ln[0](y1), ln[1](y2)
        input1 = W[1, 0] * y0 + W[1, 1] * h1
        output = W[2, 0] * y0 + W[2, 1] * h1 + W[2, 2] * h2
    else:
        input1 = ln[0](W[1, 0] * y0 + W[1, 1] * y1)
        output = ln[1](W[2, 0] * y0 + W[2, 1] * y1 + W[2, 2] * y2)
    torch.testing.assert_close(stream.layer_input(state[:2], 1, y1), input1, rtol=0, atol=1e-12)
    torch.testing.assert_close(stream.end(state, y2), output, rtol=0, atol=1e-12)


def test_resi_dual_stack_against_a_hand_run_of_post_ln_layers(tiny_bin):
    """Encoder: post-LN layers x_{k+1} = LN(x_k + F_k) run by hand, d = x_0 + sum of every
    sublayer's F, output x_N + LN(d)."""
    model, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "resi_dual"])
    randomize_norms(model)
    encoder = model.encoder
    got, x, mask = encoder_output_and_input(model, task)
    with torch.no_grad():
        d = x
        for layer in encoder.layers:
            f1 = attention_by_hand(layer.self_attn, x, x, mask)
            h = layer.self_attn_connection.norm(x + f1)
            f2 = ffn_by_hand(layer, h)
            x = layer.ffn_connection.norm(h + f2)
            d = d + f1 + f2
        expected = x + encoder.residual_stream.norm(d)
    assert encoder.layer_norm is None
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["dlcl", "dlcl_post"])
def test_dlcl_stack_against_a_hand_run(tiny_bin, kind):
    """Encoder of 3 layers with trained-looking weights: each layer run on the combination
    of the earlier outputs computed by hand, then the stack's final LN (pre-norm)."""
    model, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind, "--encoder-layers", "3"])
    randomize_norms(model)
    encoder = model.encoder
    with torch.no_grad():
        encoder.residual_stream.weights.add_(0.2 * torch.randn(4, 4))
    stream = encoder.residual_stream
    W = stream.weights.detach()
    got, x, mask = encoder_output_and_input(model, task)
    with torch.no_grad():
        history = [x]  # pre-norm: LN_k(y_k) for k >= 1; post-norm: y_k
        for i, layer in enumerate(encoder.layers):
            combined = sum(W[i, k] * history[k] for k in range(i + 1))
            if kind == "dlcl_post" and i > 0:
                combined = stream.norms[i - 1](combined)
            y = layer(combined, mask)[0]
            history.append(stream.norms[i](y) if kind == "dlcl" else y)
        out = sum(W[3, k] * history[k] for k in range(4))
        expected = encoder.layer_norm(out) if kind == "dlcl" else stream.norms[2](out)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["resi_dual", "dlcl", "hyper", "mhc", "denseformer"])
def test_stream_kinds_train_the_same_with_activation_checkpointing(tiny_bin, kind):
    """--checkpoint-activations recomputes each layer in the backward pass: the stream's
    state (ResiDual's second stream, DLCL's and DenseFormer's history, the hyper-connection
    streams) goes through the layers as arguments, so the gradients are the same."""
    grads = []
    for extra in ([], ["--checkpoint-activations"]):
        model, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind, "--dropout", "0", *extra])
        batch = sample_batch(task, n=4, split="train")
        logits = model(**batch["net_input"])[0]
        F.cross_entropy(logits.view(-1, logits.size(-1)), batch["target"].view(-1)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


def test_stream_kinds_refuse_layerdrop_at_parsing(tiny_bin, capsys):
    with pytest.raises(SystemExit) as err:
        parse_train_args(tiny_bin, "resnmt_transformer", ["--residual", "dlcl", "--encoder-layerdrop", "0.2"])
    assert err.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--encoder-layerdrop 0.2 is invalid for --residual dlcl" in last
    parse_train_args(tiny_bin, "resnmt_transformer", ["--residual", "b2t", "--encoder-layerdrop", "0.2"])


def test_checkpointed_layers_are_wrapped(tiny_bin):
    model, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "dlcl", "--checkpoint-activations"])
    assert hasattr(model.encoder.layers[0], "precheckpoint_forward")
