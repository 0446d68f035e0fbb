"""Model-level behaviour of resnmt_transformer: equivalence with fairseq's transformer,
named archs, flag resolution, bad input (what every kind must do, incremental decoding,
gradients, mixed precision, is the contract's: tests/test_contract.py)."""
import pytest
import torch

from model_utils import build, parse_train_args, randomize_norms, sample_batch
from resnmt.models.model_spec import resolve_model

def forward(model, batch):
    model.eval()
    with torch.no_grad():
        return model(**batch["net_input"])[0]


@pytest.mark.parametrize(
    "resnmt_args, fairseq_args",
    [
        (["--residual", "post_ln"], []),
        (["--residual", "pre_ln"], ["--encoder-normalize-before", "--decoder-normalize-before"]),
    ],
    ids=["post_ln", "pre_ln"],
)
def test_same_outputs_as_fairseq_transformer_with_same_weights(tiny_bin, resnmt_args, fairseq_args):
    ours, task, _ = build(tiny_bin, "resnmt_transformer", resnmt_args, seed=1)
    theirs, _, _ = build(tiny_bin, "transformer", fairseq_args, seed=2)
    randomize_norms(theirs)
    # fairseq's checkpoint keys load into ours (self_attn_layer_norm -> self_attn_connection.norm, ...)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    batch = sample_batch(task, n=6)
    expected = forward(theirs, batch)
    torch.testing.assert_close(forward(ours, batch), expected, rtol=0, atol=1e-6)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_attention_weights_are_computed_only_where_read(tiny_bin):
    """Training computes no cross-attention weights (the criteria read none); evaluation
    returns the last layer's, fairseq's own values (its generator's alignments read them);
    a caller asking with ``alignment_layer`` gets that layer's in training too."""
    ours, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "post_ln"], seed=1)
    theirs, _, _ = build(tiny_bin, "transformer", [], seed=2)
    randomize_norms(theirs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    asked = []
    for layer in ours.decoder.layers:
        layer.encoder_attn.register_forward_pre_hook(
            lambda module, args, kwargs: asked.append(kwargs["need_weights"]), with_kwargs=True)
    batch = sample_batch(task, n=4)
    ours.train()
    assert ours(**batch["net_input"])[1]["attn"] == [None]
    assert asked == [False, False]
    asked.clear()
    with torch.no_grad():
        for model in (ours, theirs):
            model.eval()
        got, expected = ours(**batch["net_input"])[1]["attn"][0], theirs(**batch["net_input"])[1]["attn"][0]
    assert asked[-1]  # the last layer's (fairseq's layers compute all of them in eval until make_generation_fast_)
    assert got.shape == (4, batch["net_input"]["prev_output_tokens"].size(1), batch["net_input"]["src_tokens"].size(1))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    ours.train()
    torch.manual_seed(0)
    asked.clear()
    attn = ours(**batch["net_input"], alignment_layer=0)[1]["attn"][0]
    assert asked == [True, False] and attn is not None and torch.allclose(attn.sum(-1), torch.ones(()))


def test_post_ln_checkpoint_keys_read_well(tiny_bin):
    model, _, _ = build(tiny_bin, "transformer_postln_base", [])
    keys = set(model.state_dict())
    assert "encoder.layers.0.self_attn_connection.norm.weight" in keys
    assert "decoder.layers.1.encoder_attn_connection.norm.bias" in keys
    assert "decoder.layers.1.ffn_connection.norm.weight" in keys
    assert not any("layer_norm" in k for k in keys)


@pytest.mark.parametrize("kind", ["rskip_ln", "xskip_ln"])
def test_lambda_one_model_equals_post_ln(tiny_bin, kind):
    post, task, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "post_ln"])
    other, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind, "--skip-lambda", "1"])
    randomize_norms(post)
    state = {k.replace(".norm.", ".norms.0.") if kind == "rskip_ln" else k: v for k, v in post.state_dict().items()}
    other.load_state_dict(state, strict=True)
    batch = sample_batch(task)
    torch.testing.assert_close(forward(other, batch), forward(post, batch), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "arch, kind, skip_lambda",
    [
        ("transformer_postln_base", "post_ln", None),
        ("transformer_preln_base", "pre_ln", None),
        ("transformer_xskip_base", "xskip_ln", 2.0),
        ("transformer_rskip_base", "rskip_ln", 2),
        ("transformer_sas_base", "sas", None),
        ("transformer_highway_base", "highway", None),
        ("transformer_deepnorm_base", "deepnorm", None),
        ("transformer_rezero_base", "rezero", None),
        ("transformer_admin_base", "admin", None),
    ],
)
def test_named_arch_defaults(tiny_bin, arch, kind, skip_lambda):
    resolved = resolve_model(parse_train_args(tiny_bin, arch.replace("_base", "_big"), []))
    assert resolved.encoder.kind == resolved.decoder.kind == kind
    model, _, args = build(tiny_bin, arch, [])
    conn = model.encoder.layers[0].self_attn_connection
    assert type(conn).__name__.lower().startswith(kind.replace("_", "")[:4])
    if skip_lambda is not None:
        assert args.skip_lambda == skip_lambda
    assert (model.encoder.layer_norm is not None) == (kind == "pre_ln")
    assert (model.decoder.layer_norm is not None) == (kind == "pre_ln")


def test_base_and_big_sizes():
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    base, big = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY["transformer_sas_base"](base)
    ARCH_CONFIG_REGISTRY["transformer_sas_big"](big)
    assert (base.encoder_embed_dim, base.encoder_ffn_embed_dim, base.encoder_attention_heads, base.dropout) == (512, 2048, 8, 0.1)
    assert (big.encoder_embed_dim, big.encoder_ffn_embed_dim, big.encoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert base.encoder_layers == big.decoder_layers == 6


def test_command_line_overrides_arch(tiny_bin):
    args = parse_train_args(
        tiny_bin, "transformer_sas_base",
        ["--encoder-residual", "pre_ln", "--sas-gate-dim", "8", "--sas-alpha-bias-init", "3", "--dropout", "0.2"],
    )
    resolved = resolve_model(args)
    assert (resolved.encoder.kind, resolved.decoder.kind) == ("pre_ln", "sas")
    assert resolved.encoder.has_final_norm and not resolved.decoder.has_final_norm
    assert args.sas_gate_dim == 8 and args.sas_alpha_bias_init == 3.0 and args.dropout == 0.2
    assert args.encoder_embed_dim == 16  # TINY overrides the base size
    args = parse_train_args(tiny_bin, "transformer_rskip_base", ["--skip-lambda", "3"])
    assert args.skip_lambda == 3.0


def test_fairseq_normalize_before_flags_select_pre_ln(tiny_bin):
    resolved = resolve_model(parse_train_args(tiny_bin, "resnmt_transformer", ["--encoder-normalize-before"]))
    assert (resolved.encoder.kind, resolved.decoder.kind) == ("pre_ln", "post_ln")


@pytest.mark.parametrize(
    "arch, extra, message",
    [
        ("transformer_rskip_base", ["--skip-lambda", "2.5"], "--skip-lambda 2.5 is invalid for --residual rskip_ln: it must be an integer >= 1"),
        ("transformer_xskip_base", ["--skip-lambda", "0"], "argument --skip-lambda: invalid value '0': must be a real number > 0"),
        ("transformer_xskip_base", ["--skip-lambda", "-1"], "argument --skip-lambda: invalid value '-1': must be a real number > 0"),
        ("resnmt_transformer", ["--residual", "dense"], "argument --residual: invalid choice: 'dense'"),
        ("transformer_sas_base", ["--sas-gate-dim", "0"], "argument --sas-gate-dim: invalid value '0': must be an integer > 0"),
        ("transformer_sas_base", ["--cross-self-attention"], "--cross-self-attention is not supported by resnmt_transformer models"),
        ("transformer_admin_base", ["--admin-output-change-scale", "O(n^2)"],
         "argument --admin-output-change-scale: invalid choice: 'O(n^2)' (closest: O(n) O(logn) O(1); choose from 'O(logn)', "
         "'O(n)', 'O(1)')"),
        ("transformer_rskip_base", ["--skip-lambda-learned"],
         "--skip-lambda-learned is invalid for --residual rskip_ln: it applies only to xskip, xskip_ln"),
        ("transformer_deepnorm_base", ["--skip-lambda-learned"],
         "--skip-lambda-learned is invalid for --residual deepnorm: it applies only to xskip, xskip_ln"),
    ],
)
def test_bad_flags_stop_at_parsing_with_one_clear_line(tiny_bin, capsys, arch, extra, message):
    with pytest.raises(SystemExit) as err:
        parse_train_args(tiny_bin, arch, extra)
    assert err.value.code == 2
    stderr = capsys.readouterr().err.strip().splitlines()
    assert message in stderr[-1]


def test_rezero_encoder_is_the_identity_at_init(tiny_bin):
    """a = 0 in every sublayer: the encoder returns what fairseq feeds its first layer
    (scaled embeddings + positions), with dropout off."""
    model, task, _ = build(tiny_bin, "transformer_rezero_base", [])
    model.eval()
    assert model.encoder.layer_norm is None  # no LayerNorm anywhere, no final one either
    fed = {}
    handle = model.encoder.layers[0].register_forward_pre_hook(lambda m, args: fed.setdefault("x", args[0]))
    net_input = sample_batch(task)["net_input"]
    with torch.no_grad():
        out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    handle.remove()
    torch.testing.assert_close(out["encoder_out"][0], fed["x"], rtol=0, atol=0)
    assert float(fed["x"].abs().max()) > 0.1


@pytest.mark.parametrize("layers", [(3, 2), (2, 5)])
def test_deepnorm_constants_follow_the_layer_counts_and_init_is_beta_scaled(tiny_bin, layers):
    """alpha/beta from --encoder-layers/--decoder-layers; Xavier-normal with gain beta for
    fc1, fc2, v_proj, out_proj and gain 1 for q_proj, k_proj, in self- and cross-attention."""
    n, m = layers
    dims = ["--encoder-layers", str(n), "--decoder-layers", str(m), "--encoder-embed-dim", "64",
            "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128"]
    model, _, _ = build(tiny_bin, "transformer_deepnorm_base", dims)
    expected = {
        "encoder": (0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
    }
    for side in ("encoder", "decoder"):
        alpha, beta = expected[side]
        weights = {"q": [], "k": [], "v": [], "out": [], "fc": []}
        for layer in getattr(model, side).layers:
            for conn in (layer.self_attn_connection, layer.ffn_connection):
                assert conn.alpha == pytest.approx(alpha) and conn.beta == pytest.approx(beta)
            attentions = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
            for attn in attentions:
                for name in ("q", "k", "v", "out"):
                    weights[name].append(getattr(attn, f"{name}_proj").weight)
            weights["fc"] += [layer.fc1.weight, layer.fc2.weight]
        for name, ws in weights.items():
            gain = 1.0 if name in ("q", "k") else beta
            # pool the standardised weights: std / (gain * sqrt(2 / (fan_in + fan_out))) ~ 1
            z = torch.cat([(w.detach() / (gain * (2.0 / sum(w.shape)) ** 0.5)).flatten() for w in ws])
            assert float(z.std()) == pytest.approx(1.0, rel=0.04), (side, name)
            assert abs(float(z.mean())) < 0.03, (side, name)


def test_choices_are_resolved_from_the_flags_and_never_written_back(tiny_bin):
    """The arch sets its defaults; resolve_model decides the rest without touching the flags."""
    args = parse_train_args(tiny_bin, "transformer_dlcl_base", ["--decoder-residual", "pre_ln"])
    given = dict(vars(args))
    resolved = resolve_model(args)
    assert vars(args) == given
    assert (resolved.encoder.kind, resolved.decoder.kind) == ("dlcl", "pre_ln")
    assert resolved.encoder.has_final_norm and resolved.decoder.has_final_norm
    assert getattr(args, "encoder_residual", None) is None and not args.encoder_normalize_before
    assert (resolved.encoder.layers, resolved.decoder.layers) == (2, 2)  # TINY's


def test_final_norm_and_depth_are_decided_with_fairseqs_flags(tiny_bin):
    args = parse_train_args(tiny_bin, "resnmt_transformer", ["--residual", "pre_ln", "--no-decoder-final-norm",
                                                              "--encoder-layers-to-keep", "0"])
    resolved = resolve_model(args)
    assert resolved.encoder.has_final_norm and not resolved.decoder.has_final_norm
    assert resolved.encoder.layers == 1  # fairseq builds one layer for --encoder-layers-to-keep 0
    model, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", "pre_ln", "--no-decoder-final-norm"])
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is None


# what printing a model shows of each kind's settings, values worked by hand for the tiny 2+2
# model (d=16, 2 heads): DeepNet's alpha, beta (encoder 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16);
# decoder (3M)^(1/4), (12M)^(-1/4); N = M = 2), LayerNorm scaling's 1/sqrt(l) for layers 1 and 2
PRINTED = [  # (kind, flags, what the printed model holds, its white space made single spaces)
    ("deepnorm", (), ["DeepNormConnection( alpha=1.006, beta=0.7006 (",
                      "DeepNormConnection( alpha=1.565, beta=0.4518 ("]),
    ("ln_scaling", (), ["LNScalingConnection( scale=1 (", "LNScalingConnection( scale=0.707107 ("]),
    ("mix_ln", ("--encoder-layers", "4"), ["MixLNConnection( post-LN (", "MixLNConnection( pre-LN ("]),
    ("hybrid_norm", (), ["HybridNormConnection(x + F(x))", "HybridNormConnection( Norm(x) + F(Norm(x)) (",
                         "HeadNormedLinear( in_features=16, out_features=16, bias=True, num_heads=2 ("]),
    ("xskip", (), ["XSkipConnection(lambda=2)"]),
    ("sas", (), ["num_gates=2, two_layer(hidden=16)"]),
    ("resi_dual", (), ["ResiDualStream( scale=1, alpha=1 ("]),
    ("denseformer", (), ["DepthWeightedAverage(layers=2)"]),
    ("hyper", (), ["HyperStream(streams=4)", "StaticHyperMixer(dim=16, streams=4, index=3)"]),
    ("mhc", (), ["ManifoldHyperMixer(dim=16, streams=4, index=0, sinkhorn_iterations=20)"]),
    ("post_ln", ("--normalization", "dyt"), ["DynamicTanh(16, alpha=0.5)"]),
    ("post_ln", ("--normalized-activation", "nswish", "--decoder-unnormalized-top-layers", "1"),
     ["UnnormalizedActivation(swish)"]),
]


@pytest.mark.parametrize("kind, extra, shown", PRINTED, ids=[f"{k}{'-' + e[1] if e else ''}" for k, e, _ in PRINTED])
def test_printing_a_model_shows_each_kinds_settings(tiny_bin, kind, extra, shown):
    model, _, _ = build(tiny_bin, "resnmt_transformer", ["--residual", kind, *extra])
    text = " ".join(str(model).split())
    for part in shown:
        assert part in text, part
    spec = repr(model.decoder.connection_spec)
    assert spec.startswith(f"ConnectionSpec(kind={kind!r}, side='decoder', layers=")
    if kind == "xskip":
        assert spec == ("ConnectionSpec(kind='xskip', side='decoder', layers=2+2, skip_lambda=2.0, "
                        "skip_lambda_learned=False)")


def test_the_arch_table_counts_the_post_ln_archs_as_fairseqs_transformer(capsys):
    """`python -m resnmt.cli.arch_table`: a row per named arch; the post-LN archs have exactly
    the parameters of fairseq's own transformer and transformer_vaswani_wmt_en_de_big."""
    from resnmt.cli import arch_table
    from resnmt.models.architectures import ARCHS

    arch_table.main(["--vocab", "1000"])
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2:5] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| `")}
    assert set(rows) == set(ARCHS) | {"transformer_sas_base --sas-gate-dim 64"}
    vocab = arch_table.dictionary(1000)
    for ours, fairseqs in (("transformer_postln_base", "transformer"),
                           ("transformer_postln_big", "transformer_vaswani_wmt_en_de_big")):
        params = arch_table.count(arch_table.build(fairseqs, vocab))
        assert rows[ours][0].strip() == "post_ln" and rows[ours][1].strip() == f"{params / 1e6:.1f}M", ours
    assert rows["transformer_xskip_base"][0].strip() == "xskip_ln (lambda 2)"
