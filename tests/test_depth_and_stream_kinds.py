"""The 2025 kinds as --residual kinds: Mix-LN, LayerNorm Scaling, HybridNorm,
DenseFormer, Hyper-Connections (static, dynamic) and mHC, each against its equation
computed by hand: on tensors, on a layer, and on a whole stack whose layers are run one
by one; Hyper-Connections, mHC and DenseFormer against pre-LN at init. Incremental
decoding, gradients, bf16 and TorchScript for every kind: tests/test_model.py and
tests/test_script.py (KIND_ARGS); the modules themselves: tests/test_stream_and_qkv_norm_modules.py."""
import math

import pytest
import torch

from model_utils import (block_output_gradients, build, encoder_output_and_input, move_connections_off_init,
                         parse_train_args, randomize_norms, sample_batch)
from test_cross_layer import attention_by_hand, ffn_by_hand, layer_norm, perturbed, tensors
from resnmt.connections import ConnectionConfigError, ConnectionSpec, build_connection
from resnmt.connections.depth_norm import has_qkv_norm
from resnmt.connections.norms import DynamicTanh

DIM = 6


def connection(kind, layer=None, sublayer=None, **spec):
    spec = ConnectionSpec(kind, **spec)
    if layer is not None:
        spec = spec.at_layer(layer)
    if sublayer is not None:
        spec = spec.at_sublayer(sublayer)
    return perturbed(build_connection(DIM, spec))


def ln(norm, v):
    return layer_norm(v, norm.weight, norm.bias)


def forward(model, batch):
    model.eval()
    with torch.no_grad():
        return model(**batch["net_input"])[0]


# ----------------------------------------------------------------------- the sublayer index


def test_sublayer_index_counts_every_sublayer_of_the_stack():
    enc = ConnectionSpec("hyper", side="encoder")
    dec = ConnectionSpec("hyper", side="decoder")
    assert [enc.at_layer(l).at_sublayer(s).sublayer_index for l in (0, 1, 2) for s in ("self_attn", "ffn")] == [
        0, 1, 2, 3, 4, 5]
    assert [dec.at_layer(l).at_sublayer(s).sublayer_index for l in (0, 1)
            for s in ("self_attn", "encoder_attn", "ffn")] == [0, 1, 2, 3, 4, 5]
    assert enc.sublayer_index == 0 and enc.at_layer(2).sublayer_index == 0  # not given: 0
    with pytest.raises(ValueError, match="encoder layers have no sublayer 'encoder_attn'"):
        enc.at_sublayer("encoder_attn")


# ----------------------------------------------------------------------- Mix-LN


@pytest.mark.parametrize("layers, fraction, post", [(6, 0.25, {0}), (2, 0.25, set()), (4, 0.5, {0, 1}),
                                                    (12, 0.25, {0, 1, 2}), (3, 1.0, {0, 1, 2}), (3, 0.0, set())])
def test_mix_ln_post_layers_are_the_lowest_int_fraction_times_depth(layers, fraction, post):
    """int(0.25 * 6) = 1, int(0.25 * 2) = 0 (the study's 2+2: pre-LN throughout), int(0.5 * 4) = 2, ..."""
    x, fx, _ = tensors()
    spec = dict(encoder_layers=layers, mix_ln_fraction=fraction)
    for layer in range(layers):
        c = connection("mix_ln", layer, **spec)
        if layer in post:
            torch.testing.assert_close(c.prenorm(x), x, rtol=0, atol=0)
            torch.testing.assert_close(c(x, fx), ln(c.norm, x + fx), rtol=0, atol=1e-12)
        else:
            torch.testing.assert_close(c.prenorm(x), ln(c.norm, x), rtol=0, atol=1e-12)
            torch.testing.assert_close(c(x, fx), x + fx, rtol=0, atol=0)
    assert ConnectionSpec("mix_ln").has_final_norm


def test_mix_ln_fraction_outside_the_unit_interval_is_refused():
    with pytest.raises(ConnectionConfigError, match=r"--mix-ln-fraction 1.5 is invalid: it must lie in \[0, 1\]"):
        ConnectionSpec("mix_ln", mix_ln_fraction=1.5)


def test_mix_ln_stack_against_a_hand_run(tiny_bin):
    """4 encoder layers at 0.5: layers 0, 1 post-LN (h = LN1(x + Attn(x)), y = LN2(h + FFN(h))),
    layers 2, 3 pre-LN (h = x + Attn(LN1(x)), y = h + FFN(LN2(h))), then the final LN."""
    model, task, _ = build(tiny_bin, "resnmt_transformer",
                           ["--residual", "mix_ln", "--mix-ln-fraction", "0.5", "--encoder-layers", "4"])
    randomize_norms(model)
    encoder = model.encoder
    got, x, mask = encoder_output_and_input(model, task)
    with torch.no_grad():
        for i, layer in enumerate(encoder.layers):
            n1, n2 = layer.self_attn_connection.norm, layer.ffn_connection.norm
            if i < 2:
                h = n1(x + attention_by_hand(layer.self_attn, x, x, mask))
                x = n2(h + ffn_by_hand(layer, h))
            else:
                q = n1(x)
                h = x + attention_by_hand(layer.self_attn, q, q, mask)
                x = h + ffn_by_hand(layer, n2(h))
        expected = encoder.layer_norm(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_mix_ln_at_two_layers_is_pre_ln(tiny_bin):
    """int(0.25 * 2) = 0: at the study's 2+2 Mix-LN computes exactly pre-LN (same weights, same keys)."""
    pre, task, _ = build(tiny_bin, "transformer_preln_base", [], seed=4)
    mix, _, _ = build(tiny_bin, "transformer_mix_ln_base", [], seed=4)
    randomize_norms(pre)
    mix.load_state_dict(pre.state_dict(), strict=True)
    batch = sample_batch(task)
    torch.testing.assert_close(forward(mix, batch), forward(pre, batch), rtol=0, atol=0)
    six, _, _ = build(tiny_bin, "transformer_mix_ln_base", ["--encoder-layers", "6"])
    assert [layer.ffn_connection.post for layer in six.encoder.layers] == [True] + [False] * 5


# ----------------------------------------------------------------------- LayerNorm Scaling


def test_ln_scaling_equation():
    """Block ℓ = l + 1: every pre-norm output times 1/sqrt(ℓ); the residual add unscaled."""
    x, fx, _ = tensors()
    for layer in range(4):
        for side, sublayer in (("encoder", "self_attn"), ("decoder", "encoder_attn"), ("decoder", "ffn")):
            c = connection("ln_scaling", layer, sublayer, side=side)
            torch.testing.assert_close(c.prenorm(x), ln(c.norm, x) / math.sqrt(layer + 1), rtol=0, atol=1e-12)
            torch.testing.assert_close(c(x, fx), x + fx, rtol=0, atol=0)
    assert ConnectionSpec("ln_scaling").has_final_norm


def test_ln_scaling_decoder_stack_against_a_hand_run(tiny_bin):
    """3 decoder layers: h1 = x + SelfAttn(LN1(x)/√ℓ), h2 = h1 + CrossAttn(LN2(h1)/√ℓ, memory),
    y = h2 + FFN(LN3(h2)/√ℓ), ℓ = 1, 2, 3; the final LN."""
    model, _, _ = build(tiny_bin, "transformer_ln_scaling_base", ["--decoder-layers", "3"])
    randomize_norms(model)
    model.eval()
    decoder = model.decoder
    x0, memory = torch.randn(5, 2, 16), torch.randn(4, 2, 16)
    causal = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with torch.no_grad():
        state = decoder.residual_stream.begin(x0)
        x = x0
        for i, layer in enumerate(decoder.layers):
            x = layer(decoder.residual_stream.layer_input(state, i, x), memory, None, self_attn_mask=causal)[0]
        got = decoder.layer_norm(x)
        x = x0
        for i, layer in enumerate(decoder.layers):
            s = 1 / math.sqrt(i + 1)
            q = layer.self_attn_connection.norm(x) * s
            h1 = x + layer.self_attn(query=q, key=q, value=q, attn_mask=causal, need_weights=False)[0]
            h2 = h1 + attention_by_hand(layer.encoder_attn, layer.encoder_attn_connection.norm(h1) * s, memory)
            x = h2 + ffn_by_hand(layer, layer.ffn_connection.norm(h2) * s)
        expected = decoder.layer_norm(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------- HybridNorm


def test_hybrid_norm_equations():
    """Attention: y = x + F(x), no norm; FFN: y = Norm(x) + F(Norm(x)); HybridNorm*'s first
    layer: attention y = x + F(Norm(x)), FFN y = x + F(Norm(x)) (pre-LN); later layers as HybridNorm."""
    x, fx, _ = tensors()
    for star in (False, True):
        for layer in (0, 1):
            first = star and layer == 0
            for sublayer in ("self_attn", "encoder_attn"):
                c = connection("hybrid_norm", layer, sublayer, side="decoder", hybrid_norm_star=star)
                if first:
                    torch.testing.assert_close(c.prenorm(x), ln(c.norm, x), rtol=0, atol=1e-12)
                else:
                    assert c.norm is None and not list(c.parameters())
                    torch.testing.assert_close(c.prenorm(x), x, rtol=0, atol=0)
                torch.testing.assert_close(c(x, fx), x + fx, rtol=0, atol=0)
            c = connection("hybrid_norm", layer, "ffn", side="decoder", hybrid_norm_star=star)
            torch.testing.assert_close(c.prenorm(x), ln(c.norm, x), rtol=0, atol=1e-12)
            skip = x if first else ln(c.norm, x)
            torch.testing.assert_close(c(x, fx), skip + fx, rtol=0, atol=1e-12)


@pytest.mark.parametrize("star", [False, True])
def test_hybrid_norm_encoder_stack_against_a_hand_run(tiny_bin, star):
    """Every attention normalizes Q, K, V per head (fairseq's attention with HeadNormedLinear
    projections: tests/test_stream_and_qkv_norm_modules.py); y = x + Attn(x), then Norm(y) + FFN(Norm(y));
    with HybridNorm* layer 0 is x + Attn(Norm(x)), y + FFN(Norm(y)); the final LN."""
    extra = ["--hybrid-norm-star"] if star else []
    model, task, _ = build(tiny_bin, "transformer_hybrid_norm_base", ["--encoder-layers", "3", *extra])
    randomize_norms(model)
    for layer in (*model.encoder.layers, *model.decoder.layers):
        attentions = [layer.self_attn] + ([layer.encoder_attn] if hasattr(layer, "encoder_attn") else [])
        assert all(has_qkv_norm(a) for a in attentions)
    encoder = model.encoder
    got, x, mask = encoder_output_and_input(model, task)
    with torch.no_grad():
        for i, layer in enumerate(encoder.layers):
            g = layer.ffn_connection.norm
            if star and i == 0:
                q = layer.self_attn_connection.norm(x)
                y = x + attention_by_hand(layer.self_attn, q, q, mask)
                x = y + ffn_by_hand(layer, g(y))
            else:
                y = x + attention_by_hand(layer.self_attn, x, x, mask)
                x = g(y) + ffn_by_hand(layer, g(y))
        expected = encoder.layer_norm(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------- DenseFormer


def test_denseformer_stack_against_a_hand_run(tiny_bin):
    """3 encoder layers with trained-looking α: block i+1 reads Y_i = Σ_j α[i-1, j] X_j (block 1
    reads X_0), the output Y_3, then the final LN."""
    model, task, _ = build(tiny_bin, "transformer_denseformer_base", ["--encoder-layers", "3"])
    randomize_norms(model)
    encoder = model.encoder
    with torch.no_grad():
        encoder.residual_stream.average.weights.add_(0.3 * torch.randn(3, 4))
    W = encoder.residual_stream.average.weights.detach()
    got, x, mask = encoder_output_and_input(model, task)
    with torch.no_grad():
        outputs = [x]
        for i, layer in enumerate(encoder.layers):
            inp = x if i == 0 else sum(W[i - 1, j] * outputs[j] for j in range(i + 1))
            outputs.append(layer(inp, mask)[0])
        expected = encoder.layer_norm(sum(W[2, j] * outputs[j] for j in range(4)))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert encoder.residual_stream.learned()["denseformer_weights"] == W.tolist()


def test_denseformer_is_pre_ln_at_init(tiny_bin):
    """α_ii = 1, the rest 0: exactly the plain pre-LN stack (the weights are pre-LN's; the
    stream adds only α)."""
    pre, task, _ = build(tiny_bin, "transformer_preln_base", [], seed=5)
    dense, _, _ = build(tiny_bin, "transformer_denseformer_base", [], seed=5)
    randomize_norms(pre)
    result = dense.load_state_dict(pre.state_dict(), strict=False)
    assert set(result.missing_keys) == {"encoder.residual_stream.average.weights",
                                        "decoder.residual_stream.average.weights"}
    assert not result.unexpected_keys
    batch = sample_batch(task)
    torch.testing.assert_close(forward(dense, batch), forward(pre, batch), rtol=0, atol=0)


# ----------------------------------------------------------------------- Hyper-Connections and mHC


def hyper_by_hand(conn, H):
    """(the sublayer's input before its norm, the mixed streams, the write-back weights) of
    one stream connection, from its parameters: HC's Eq. 2-5 and 10-13, mHC's Eq. 7-9."""
    s = conn.streams
    n = s.num_streams
    if hasattr(s, "phi"):  # mHC
        flat = H.flatten(-2)
        normed = flat / torch.sqrt((flat ** 2).mean(-1, keepdim=True) + 1e-5)
        proj = normed @ s.phi
        pre = torch.sigmoid(s.alpha_pre * proj[..., :n] + s.bias_pre)
        post = 2 * torch.sigmoid(s.alpha_post * proj[..., n:2 * n] + s.bias_post)
        m = torch.exp(s.alpha_res * proj[..., 2 * n:].reshape(*proj.shape[:-1], n, n) + s.bias_res)
        for _ in range(s.sinkhorn_iterations):
            m = m / m.sum(-2, keepdim=True)
            m = m / m.sum(-1, keepdim=True)
        h_in = (pre.unsqueeze(-1) * H).sum(-2)
        mixed = torch.stack([sum(m[..., i, j, None] * H[..., j, :] for j in range(n)) for i in range(n)], dim=-2)
        return h_in, mixed, post
    alpha, beta = s.alpha, s.beta  # alpha = [A_m | A_r] (n, n+1)
    if hasattr(s, "alpha_weight"):  # DHC
        hbar = s.norm(H)
        alpha = alpha + s.alpha_scale * torch.tanh(hbar @ s.alpha_weight)
        beta = beta + s.beta_scale * torch.tanh(hbar @ s.beta_weight)
    h_in = sum(alpha[..., i, 0, None] * H[..., i, :] for i in range(n))
    mixed = torch.stack([sum(alpha[..., i, 1 + j, None] * H[..., i, :] for i in range(n)) for j in range(n)], dim=-2)
    return h_in, mixed, beta


def with_streams(H, conn, f):
    """``H`` after the sublayer whose output is f(norm(h_in)): H' + write ⊗ F."""
    h_in, mixed, write = hyper_by_hand(conn, H)
    return mixed + write.unsqueeze(-1) * f(conn.norm(h_in)).unsqueeze(-2)


def test_hyper_streams_start_reading_the_stream_of_their_sublayer_index(tiny_bin):
    """A_m = e_{k mod n}, k the sublayer's index in its stack (decoder layer l: 3l, 3l+1, 3l+2)."""
    model, _, _ = build(tiny_bin, "transformer_hyper_base", ["--hc-streams", "3"])
    for side, per_layer in (("encoder", 2), ("decoder", 3)):
        for l, layer in enumerate(getattr(model, side).layers):
            conns = [layer.self_attn_connection] + ([layer.encoder_attn_connection] if per_layer == 3 else []) + [
                layer.ffn_connection]
            for j, conn in enumerate(conns):
                k = per_layer * l + j
                assert conn.streams.index == k
                expected = torch.zeros(3)
                expected[k % 3] = 1
                assert torch.equal(conn.streams.alpha[:, 0].detach(), expected)


@pytest.mark.parametrize("extra", [[], ["--hc-dynamic"], ["--residual", "mhc"]], ids=["static", "dynamic", "mhc"])
def test_hyper_decoder_stack_against_a_hand_run(tiny_bin, extra):
    """3 decoder layers, every parameter off its init: H⁰ = x tiled n times; each sublayer
    (self-attention, cross-attention, FFN) H ← H' + write ⊗ F(LN(h_in)) with h_in, H', write
    from hyper_by_hand; the output Σ_i H_i, then the final LN."""
    model, _, _ = build(tiny_bin, "transformer_hyper_base", ["--decoder-layers", "3", "--hc-streams", "3", *extra])
    model = perturbed(model)
    model.eval()
    decoder = model.decoder
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(5, 2, 16, generator=g, dtype=torch.float64)
    memory = torch.randn(4, 2, 16, generator=g, dtype=torch.float64)
    causal = torch.triu(torch.full((5, 5), float("-inf"), dtype=torch.float64), 1)
    with torch.no_grad():
        stream = decoder.residual_stream
        state, x = stream.begin(x0), x0
        for i, layer in enumerate(decoder.layers):
            x = layer(stream.layer_input(state, i, x), memory, None, self_attn_mask=causal)[0]
        got = decoder.layer_norm(stream.end(state, x))
        H = x0.unsqueeze(-2).repeat(1, 1, 3, 1)
        for layer in decoder.layers:
            H = with_streams(H, layer.self_attn_connection,
                             lambda q: layer.self_attn(query=q, key=q, value=q, attn_mask=causal, need_weights=False)[0])
            H = with_streams(H, layer.encoder_attn_connection, lambda q: attention_by_hand(layer.encoder_attn, q, memory))
            H = with_streams(H, layer.ffn_connection, lambda h: ffn_by_hand(layer, h))
        expected = decoder.layer_norm(H.sum(-2))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_hyper_encoder_stack_against_a_hand_run(tiny_bin):
    """The encoder, with padding, through fairseq's own forward (embedding, mask, final LN)."""
    model, task, _ = build(tiny_bin, "transformer_hyper_base", ["--encoder-layers", "3", "--hc-dynamic"])
    randomize_norms(model)
    move_connections_off_init(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".streams." in name:
                p.add_(0.2 * torch.randn(p.shape))
    encoder = model.encoder
    got, x, mask = encoder_output_and_input(model, task)
    with torch.no_grad():
        H = x.unsqueeze(-2).repeat(1, 1, 4, 1)
        for layer in encoder.layers:
            H = with_streams(H, layer.self_attn_connection, lambda q: attention_by_hand(layer.self_attn, q, q, mask))
            H = with_streams(H, layer.ffn_connection, lambda h: ffn_by_hand(layer, h))
        expected = encoder.layer_norm(H.sum(-2))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


class ScaledInput(torch.nn.Module):
    """``norm(n * x)``: pre-LN's final norm fed what HC's sum of n equal streams feeds it."""

    def __init__(self, norm, n):
        super().__init__()
        self.norm, self.n = norm, n

    def forward(self, x):
        return self.norm(x * self.n)


@pytest.mark.parametrize("extra, atol", [([], 1e-6), (["--hc-dynamic"], 1e-6), (["--residual", "mhc"], 1e-5)],
                         ids=["static", "dynamic", "mhc"])
def test_hyper_and_mhc_equal_pre_ln_at_init(tiny_bin, extra, atol):
    """The paper's init: every stream is the pre-LN residual, so the model computes pre-LN's
    function of the same weights, except that the final norms see the n streams' sum, n
    times pre-LN's stack output (a LayerNorm removes that up to its eps): compared with
    pre-LN whose final norms read n·x, to float rounding (mHC: within a few ulps, its H_pre
    and H_res sum to 1 in float32 only)."""
    pre, task, _ = build(tiny_bin, "transformer_preln_base", [], seed=6)
    hyper, _, _ = build(tiny_bin, "transformer_hyper_base", extra, seed=7)
    randomize_norms(pre)
    result = hyper.load_state_dict(pre.state_dict(), strict=False)
    assert result.missing_keys and all(".streams." in k for k in result.missing_keys) and not result.unexpected_keys
    for side in (pre.encoder, pre.decoder):
        side.layer_norm = ScaledInput(side.layer_norm, 4)
    batch = sample_batch(task, n=6)
    expected = forward(pre, batch)
    torch.testing.assert_close(forward(hyper, batch), expected, rtol=0, atol=atol)
    for ours, theirs in ((hyper.encoder, pre.encoder), (hyper.decoder, pre.decoder)):  # no final norm: n·x itself
        ours.layer_norm, theirs.layer_norm = torch.nn.Identity(), ScaledInput(torch.nn.Identity(), 4)
    expected = forward(pre, batch)
    torch.testing.assert_close(forward(hyper, batch), expected, rtol=0, atol=atol * float(expected.abs().max()))


def test_hyper_scales_the_output_projections_init_by_one_over_sqrt_n(tiny_bin):
    """HC's "√n" read as a division: out_proj (self and cross) and fc2 start at pre-LN's
    weights times n^-1/2 (same seed: the streams draw no random numbers); the rest, and
    everything with --hc-no-init-scaling or with mhc, is pre-LN's init."""
    pre, _, _ = build(tiny_bin, "transformer_preln_base", [], seed=8)
    scaled, _, _ = build(tiny_bin, "transformer_hyper_base", ["--hc-streams", "9"], seed=8)
    plain, _, _ = build(tiny_bin, "transformer_hyper_base", ["--hc-streams", "9", "--hc-no-init-scaling"], seed=8)
    mhc, _, _ = build(tiny_bin, "transformer_mhc_base", [], seed=8)
    reference = pre.state_dict()
    scaled_names = ("self_attn.out_proj.weight", "encoder_attn.out_proj.weight", "fc2.weight")
    for name, value in reference.items():
        factor = 1 / 3 if name.endswith(scaled_names) and ".layers." in name else 1.0
        torch.testing.assert_close(scaled.state_dict()[name], value * factor, rtol=0, atol=1e-7, msg=name)
        assert torch.equal(plain.state_dict()[name], value) and torch.equal(mhc.state_dict()[name], value), name


# ----------------------------------------------------------------------- flags and checks


@pytest.mark.parametrize("kind", ["hyper", "mhc", "denseformer"])
def test_stream_kinds_refuse_layerdrop(tiny_bin, capsys, kind):
    with pytest.raises(SystemExit):
        parse_train_args(tiny_bin, "resnmt_transformer", ["--residual", kind, "--decoder-layerdrop", "0.1"])
    assert f"--decoder-layerdrop 0.1 is invalid for --residual {kind}" in capsys.readouterr().err


@pytest.mark.parametrize("arch, extra, message", [
    ("transformer_mhc_base", ["--hc-streams", "1"], "--hc-streams 1 is invalid for --residual mhc: it needs at least 2"),
    ("transformer_hyper_base", ["--hc-streams", "0"], "argument --hc-streams: invalid value '0': must be an integer > 0"),
    ("transformer_mhc_base", ["--hc-dynamic"], "--hc-dynamic is invalid for --residual mhc: it applies only to hyper"),
    ("transformer_preln_base", ["--hybrid-norm-star"], "--hybrid-norm-star is invalid for --residual pre_ln"),
    ("transformer_mix_ln_base", ["--mix-ln-fraction", "-0.5"], "--mix-ln-fraction -0.5 is invalid"),
])
def test_bad_flags_stop_at_parsing(tiny_bin, capsys, arch, extra, message):
    with pytest.raises(SystemExit):
        parse_train_args(tiny_bin, arch, extra)
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("arch", ["hyper", "mhc", "mix_ln", "ln_scaling", "hybrid_norm", "denseformer"])
def test_named_archs(tiny_bin, arch):
    from resnmt.models.model_spec import resolve_model

    for size in ("base", "big"):
        resolved = resolve_model(parse_train_args(tiny_bin, f"transformer_{arch}_{size}", []))
        assert resolved.encoder.kind == resolved.decoder.kind == arch
        assert resolved.encoder.has_final_norm and resolved.decoder.has_final_norm


@pytest.mark.parametrize("normalization", ["rms_norm", "dyt"])
def test_normalization_replaces_every_norm_of_the_2025_kinds(tiny_bin, normalization):
    """Every norm module they own (pre-norms, DHC's H̄ norm, HybridNorm's per-head Q/K/V
    norms, the final norms) is the chosen one; mHC's RMSNorm over nC is the paper's, a
    function without a module."""
    expected = torch.nn.RMSNorm if normalization == "rms_norm" else DynamicTanh
    for extra in (["--residual", "hyper", "--hc-dynamic"], ["--residual", "mhc"], ["--residual", "mix_ln"],
                  ["--residual", "ln_scaling"], ["--residual", "hybrid_norm"], ["--residual", "denseformer"]):
        model, _, _ = build(tiny_bin, "resnmt_transformer", [*extra, "--normalization", normalization])
        norms = [m for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm, DynamicTanh))]
        assert norms and all(isinstance(m, expected) for m in norms), extra
        assert isinstance(model.decoder.layer_norm, expected)
    model, _, _ = build(tiny_bin, "transformer_hybrid_norm_base", ["--normalization", normalization])
    assert isinstance(model.decoder.layers[0].encoder_attn.k_proj.norm, expected)


def test_gradient_norms_of_the_streams_cover_the_whole_state(tiny_bin):
    """resnmt-analyze's ||dL/dh_t|| per block output: for hyper a layer outputs the n
    streams (T, B, n, C), and the norm is over the position's whole state (n·C values)."""
    from resnmt.analysis.gradients import block_gradient_norms

    model, task, _ = build(tiny_bin, "transformer_hyper_base", ["--hc-dynamic"])
    model.eval()
    pad = task.target_dictionary.pad()
    sample = sample_batch(task, 6)
    tool, _, _ = block_gradient_norms(model, sample, 0.1, pad)
    outputs, keep = block_output_gradients(model, sample, pad)
    for (side, k), out in outputs.items():
        assert out.dim() == 4 and out.size(2) == 4
        norms = out.grad.double().pow(2).sum(dim=(-2, -1)).sqrt()
        expected = float((norms * keep[side]).sum() / keep[side].sum())
        total, count = tool[(side, k, "output")]
        assert float(total / count) == pytest.approx(expected, rel=1e-5) and expected > 0, (side, k)


def test_analyze_reports_the_static_mixing_of_every_sublayer(tiny_bin, tmp_path):
    """resnmt-analyze's stream weights: HC's A_m, B, A_r and mHC's mappings at φ = 0, one row
    per sublayer in the stack's order (the paper's init at init), drawn as heat maps."""
    from resnmt.analysis.plotting import plot_stream_weights
    from resnmt.cli.analyze import stream_weights

    model, _, _ = build(tiny_bin, "transformer_hyper_base", ["--decoder-residual", "mhc", "--hc-streams", "3"])
    with torch.no_grad():
        model.encoder.layers[1].ffn_connection.streams.beta.fill_(0.5)
    weights = stream_weights(model)
    assert set(weights) == {"hc_read", "hc_write", "hc_mix", "mhc_pre", "mhc_post", "mhc_res"}
    assert weights["hc_read"]["encoder"] == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]  # e_{k mod 3}, k = 0..3
    assert weights["hc_write"]["encoder"] == [[1, 1, 1]] * 3 + [[0.5] * 3]
    assert weights["hc_mix"]["encoder"] == [[1, 0, 0, 0, 1, 0, 0, 0, 1]] * 4
    assert len(weights["mhc_res"]["decoder"]) == 6  # 2 layers x 3 sublayers
    eps = 0.01
    for k, (pre, post, res) in enumerate(zip(*(weights[n]["decoder"] for n in ("mhc_pre", "mhc_post", "mhc_res")))):
        assert pre == pytest.approx([eps + (1 - 3 * eps) * (i == k % 3) for i in range(3)], abs=1e-6)
        assert post == pytest.approx([1.0] * 3, abs=1e-7)
        assert res == pytest.approx([eps + (1 - 3 * eps) * (i == j) for i in range(3) for j in range(3)], abs=1e-6)
    for name, sides in weights.items():
        assert plot_stream_weights(name, sides, "test", tmp_path / f"{name}.png").stat().st_size > 5000
