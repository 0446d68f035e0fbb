"""NReLU / NSwish (resnmt/activations/normalized.py) against explicit float64
formulas: outputs, gradients, batch statistics with padding, momentum warm-up,
clamping, checkpoints, low precision, flags and their validation, and the activations
inside a built resnmt_transformer."""
import argparse
import io

import numpy as np
import pytest
import torch
from fairseq.models.transformer import TransformerConfig

from model_utils import assert_incremental_equals_full, build, parse_train_args, sample_batch

from resnmt.activations.normalized import ActivationSpec, NormalizedActivation, UnnormalizedActivation
from resnmt.models.model_spec import resolve_model
from resnmt.models.flags import add_activation_args

KINDS = ["nrelu", "nswish"]
MODES = ["instance", "batch"]
EPS = 1e-6  # the module's default guard on Var[h]
LO, HI = 0.01, 2.0  # the default clamp


# ---------------------------------------------------------------- float64 references


def f64(t):
    return t.detach().double().numpy()


def act64(kind, h):
    return np.maximum(h, 0.0) if kind == "nrelu" else h / (1.0 + np.exp(-h))


def stats64(kind, h, lo=LO, hi=HI):
    """(mu, rho, rho') of the elements of ``h`` (any shape, all taken together)."""
    a = act64(kind, h)
    rho = a.var() / (h.var() + EPS)
    return a.mean(), float(np.clip(rho, lo, hi)), float(np.clip((h > 0).mean(), lo, hi))


def apply64(kind, h, mu, rho, rho_p, omega):
    lam = np.sqrt(0.5 * (1.0 / rho + 1.0 / rho_p))
    return 2.0 / (1.0 + np.exp(-omega)) * lam * (act64(kind, h) - mu)


def instance_reference(kind, h, omega, lo=LO, hi=HI):
    """Per token: statistics over the last (feature) axis of a (T, B, C) array."""
    out = np.empty_like(h)
    for t in range(h.shape[0]):
        for b in range(h.shape[1]):
            out[t, b] = apply64(kind, h[t, b], *stats64(kind, h[t, b], lo, hi), omega)
    return out


def real_tokens(h, mask):
    """The (N, C) rows of a (T, B, C) array at non-padding positions of mask (B, T)."""
    return h[~mask.numpy().T]


def sample(T=7, B=3, C=64, seed=0):
    """h with per-token offsets and scales (so tokens differ), and a padding mask."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, B, C, generator=g) * (0.5 + torch.rand(T, B, 1, generator=g))
    h = h + 0.5 * torch.randn(T, B, 1, generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, T - 2:] = True
    mask[2, T - 4:] = True
    return h, mask


def set_omega(module, value):
    with torch.no_grad():
        module.omega.fill_(value)
    return module


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("kind", KINDS)
def test_instance_output_matches_float64_formula(kind):
    h, mask = sample()
    module = set_omega(NormalizedActivation(kind, "instance"), 0.3)
    out = module(h, mask)
    expected = instance_reference(kind, f64(h), 0.3)
    np.testing.assert_allclose(f64(out), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_output_uses_real_tokens_only(kind):
    h, mask = sample()
    module = set_omega(NormalizedActivation(kind, "batch"), -0.4).train()
    out = module(h, mask)
    mu, rho, rho_p = stats64(kind, real_tokens(f64(h), mask))
    # first update: the estimates are the batch statistics themselves
    np.testing.assert_allclose(
        [module.running_mu.item(), module.running_rho.item(), module.running_rho_prime.item()],
        [mu, rho, rho_p], rtol=1e-5,
    )
    np.testing.assert_allclose(f64(out), apply64(kind, f64(h), mu, rho, rho_p, -0.4), rtol=1e-5, atol=1e-5)
    # eval uses the stored estimates; with no mask every token counts
    module.eval()
    h2 = torch.randn(4, 2, 64)
    np.testing.assert_allclose(f64(module(h2, None)), apply64(kind, f64(h2), mu, rho, rho_p, -0.4), rtol=1e-5, atol=1e-5)
    module.train()
    module(h2, None)
    mu2, rho2, rho_p2 = stats64(kind, f64(h2))
    # n=2: m_2 = min(0.9, 1/2) = 0.5
    np.testing.assert_allclose(module.running_mu.item(), 0.5 * mu + 0.5 * mu2, rtol=1e-5)


def test_statistics_follow_the_activation_not_the_pre_activation():
    """Same h: NReLU and NSwish differ, and differ from their unnormalized f(h)."""
    h, _ = sample()
    relu = NormalizedActivation("nrelu")(h)
    swish = NormalizedActivation("nswish")(h)
    assert not torch.allclose(relu, swish, atol=1e-2)
    assert not torch.allclose(relu, torch.relu(h), atol=1e-2)
    # zero mean per token
    torch.testing.assert_close(relu.mean(-1), torch.zeros(relu.shape[:2]), rtol=0, atol=1e-5)


def test_untrained_batch_module_in_eval_is_the_plain_activation():
    h, _ = sample()
    module = NormalizedActivation("nswish", "batch").eval()
    torch.testing.assert_close(module(h), torch.nn.functional.silu(h))
    assert module.num_updates.item() == 0


# ---------------------------------------------------------------- gradients


def detached_formula(kind, h, omega, mode, mask):
    """float64 autograd through f(h), omega; statistics computed from h.detach()."""
    hd = h.detach()
    a_d = torch.relu(hd) if kind == "nrelu" else hd * torch.sigmoid(hd)
    if mode == "instance":
        mu = a_d.mean(-1, keepdim=True)
        rho = a_d.var(-1, unbiased=False, keepdim=True) / (hd.var(-1, unbiased=False, keepdim=True) + EPS)
        p = (hd > 0).double().mean(-1, keepdim=True)
    else:
        keep = ~mask.t()
        hr, ar = hd[keep], a_d[keep]
        mu = ar.mean()
        rho = ar.var(unbiased=False) / (hr.var(unbiased=False) + EPS)
        p = (hr > 0).double().mean()
    lam = torch.sqrt(0.5 * (1 / rho.clamp(LO, HI) + 1 / p.clamp(LO, HI)))
    a = torch.relu(h) if kind == "nrelu" else h * torch.sigmoid(h)
    return 2 * torch.sigmoid(omega) * lam * (a - mu)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_are_those_of_the_formula_with_statistics_constant(kind, mode):
    h, mask = sample(seed=1)
    upstream = torch.randn(h.shape, generator=torch.Generator().manual_seed(2))
    module = set_omega(NormalizedActivation(kind, mode), 0.7).train()
    h32 = h.clone().requires_grad_()
    (module(h32, mask) * upstream).sum().backward()

    h64 = h.double().requires_grad_()
    omega64 = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    (detached_formula(kind, h64, omega64, mode, mask) * upstream.double()).sum().backward()

    torch.testing.assert_close(h32.grad.double(), h64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(module.omega.grad.double(), omega64.grad, rtol=1e-4, atol=1e-4)
    # the statistics really are constants: a mean-subtracting backward would differ
    assert not torch.allclose(h64.grad, h64.grad - h64.grad.mean(-1, keepdim=True), atol=1e-3)


def test_nrelu_gradient_is_exact_for_tiny_positive_inputs():
    # h > 0 so small that scale * relu(h) vanishes next to scale * mu in float32: the
    # backward must still pass scale * grad there (a mask read back from the output would not)
    h, _ = sample(seed=3)
    h[..., :4] = torch.tensor([1e-30, 1e-20, -1e-30, 0.0])
    module = NormalizedActivation("nrelu").train()
    h32 = h.clone().requires_grad_()
    module(h32).sum().backward()
    h64 = h.double().requires_grad_()
    detached_formula("nrelu", h64, torch.tensor(0.0, dtype=torch.float64), "instance", None).sum().backward()
    torch.testing.assert_close(h32.grad.double(), h64.grad, rtol=1e-5, atol=1e-6)
    assert (h32.grad[..., :2] > 0).all() and (h32.grad[..., 2:4] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_backward_keeps_no_more_than_the_plain_activation(kind):
    """Saved for backward, beyond the output (which fc2 keeps anyway) and scalars:
    NSwish keeps h, as F.silu does; NReLU keeps only a bool mask (F.relu keeps its output)."""
    h, _ = sample(T=5, B=3, C=32)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = NormalizedActivation(kind).train()(h.clone().requires_grad_())
    full_size = [t for t in saved if t.shape == h.shape and t.data_ptr() != out.data_ptr()]
    if kind == "nswish":
        assert [t.dtype for t in full_size] == [torch.float32]
    else:
        assert [t.dtype for t in full_size] == [torch.bool]
    per_token_scale_and_omega = h.shape[0] * h.shape[1] + 1
    assert sum(t.numel() for t in saved if t.shape != h.shape) == per_token_scale_and_omega


# ---------------------------------------------------------------- batch mode


def test_padding_values_do_not_change_batch_statistics():
    h, mask = sample()
    other = h.clone()
    pad = mask.t()
    other[pad] = 100.0 * torch.randn(int(pad.sum()), h.size(-1))
    first, second = NormalizedActivation("nswish", "batch"), NormalizedActivation("nswish", "batch")
    out1, out2 = first(h, mask), second(other, mask)
    for name in ("running_mu", "running_rho", "running_rho_prime"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    torch.testing.assert_close(out1[~pad], out2[~pad], rtol=0, atol=0)
    # without the mask the padding values do count
    third = NormalizedActivation("nswish", "batch")
    third(other, None)
    assert not torch.allclose(third.running_rho, first.running_rho)


@pytest.mark.parametrize("mode", MODES)
def test_eval_output_is_independent_of_batch_composition(mode):
    module = NormalizedActivation("nrelu", mode).train()
    for seed in range(3):
        module(*sample(seed=seed))
    module.eval()
    estimates = [b.clone() for b in module.buffers()]
    h, mask = sample(T=6, B=4, seed=5)
    length = 3
    mask[2, length:] = True
    alone = module(h[:length, 2:3].clone(), mask[2:3, :length])
    in_batch = module(h, mask)[:length, 2:3]
    torch.testing.assert_close(alone, in_batch, rtol=0, atol=0)
    torch.testing.assert_close(module(h, mask), module(h, mask), rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(estimates, module.buffers()))


def test_momentum_warm_up():
    batches = [sample(seed=s) for s in range(3)]
    stats = [stats64("nswish", real_tokens(f64(h), mask)) for h, mask in batches]
    slow = NormalizedActivation("nswish", "batch", momentum=0.9)
    fresh = NormalizedActivation("nswish", "batch", momentum=0.0)
    slow(*batches[0])
    fresh(*batches[0])
    # n=1: m_1 = min(m, 0) = 0 whatever m is: exactly the batch statistics
    for name in ("running_mu", "running_rho", "running_rho_prime"):
        assert torch.equal(getattr(slow, name), getattr(fresh, name)), name
    slow(*batches[1])  # n=2: m_2 = min(0.9, 1/2)
    slow(*batches[2])  # n=3: m_3 = min(0.9, 2/3)
    expected = [(s0 * 0.5 + s1 * 0.5) * (2 / 3) + s2 / 3 for s0, s1, s2 in zip(*stats)]
    got = [slow.running_mu.item(), slow.running_rho.item(), slow.running_rho_prime.item()]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert slow.num_updates.item() == 3
    # a momentum below 1 - 1/n wins
    low = NormalizedActivation("nswish", "batch", momentum=0.3)
    low(*batches[0])
    low(*batches[1])
    np.testing.assert_allclose(low.running_rho.item(), 0.3 * stats[0][1] + 0.7 * stats[1][1], rtol=1e-5)


def test_many_updates_reach_the_configured_momentum():
    module = NormalizedActivation("nrelu", "batch", momentum=0.9)
    h, mask = sample()
    for _ in range(20):
        module(h, mask)
    before = module.running_mu.clone()
    module(2.0 * h, mask)  # the ReLU mean doubles
    mu = stats64("nrelu", real_tokens(f64(h), mask))[0]
    np.testing.assert_allclose(module.running_mu.item(), 0.9 * before.item() + 0.1 * 2 * mu, rtol=1e-5)


# ---------------------------------------------------------------- clamping


def test_clamping_bounds_rho_and_rho_prime_but_not_mu():
    T, B, C = 3, 2, 32
    negative = -1.0 - 2.0 * torch.rand(T, B, C, generator=torch.Generator().manual_seed(0))  # no positive pre-activation
    # batch: Swish mean is negative and kept; ReLU output is 0 so rho = 0 -> LO
    swish = NormalizedActivation("nswish", "batch")
    swish(negative)
    mu = act64("nswish", f64(negative)).mean()
    assert mu < -0.1
    np.testing.assert_allclose(swish.running_mu.item(), mu, rtol=1e-5)
    assert swish.running_rho_prime.item() == pytest.approx(LO)
    relu = NormalizedActivation("nrelu", "batch")
    out = relu(negative)
    assert relu.running_rho.item() == pytest.approx(LO)
    assert relu.running_rho_prime.item() == pytest.approx(LO)
    assert torch.equal(out, torch.zeros_like(out))
    # instance: a token with no positive value next to ordinary ones, clamp_max binding
    h, _ = sample(T=2, B=3, C=C)
    h[0, 1] = negative[0, 0]
    module = NormalizedActivation("nswish", "instance", clamp_min=0.05, clamp_max=0.3)
    expected = instance_reference("nswish", f64(h), 0.0, lo=0.05, hi=0.3)
    np.testing.assert_allclose(f64(module(h)), expected, rtol=1e-5, atol=1e-5)
    assert (h[1, 0] > 0).double().mean() > 0.3  # so hi binds for rho' of this token
    # the all-negative token: rho and rho' both at lo, so the gain is 1/sqrt(lo)
    a = act64("nswish", f64(h[0, 1]))
    gain = f64(module(h))[0, 1] / (a - a.mean())
    np.testing.assert_allclose(gain, 1 / np.sqrt(0.05), rtol=1e-4)


def test_constant_token_gives_finite_output():
    h = torch.full((2, 2, 16), 3.0)
    for mode in MODES:
        out = NormalizedActivation("nswish", mode)(h)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, torch.zeros_like(out), rtol=0, atol=1e-5)


# ---------------------------------------------------------------- checkpoints


def test_state_dict_round_trip_keeps_the_estimates():
    module = set_omega(NormalizedActivation("nswish", "batch"), 0.25)
    for seed in range(4):
        module(*sample(seed=seed))
    module.eval()
    state = module.state_dict()
    assert set(state) == {"omega", "running_mu", "running_rho", "running_rho_prime", "num_updates"}
    assert state["num_updates"].dtype == torch.long and state["num_updates"].item() == 4
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    fresh = NormalizedActivation("nswish", "batch")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    fresh.eval()
    h, mask = sample(seed=9)
    torch.testing.assert_close(fresh(h, mask), module(h, mask), rtol=0, atol=0)
    assert not torch.allclose(NormalizedActivation("nswish", "batch").eval()(h, mask), module(h, mask))


def test_instance_mode_has_no_running_state():
    assert set(NormalizedActivation("nrelu", "instance").state_dict()) == {"omega"}


# ---------------------------------------------------------------- low precision


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_is_finite_and_close(kind, mode):
    torch.manual_seed(0)
    fc1, fc2 = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)
    x = 3.0 * torch.randn(10, 4, 32)
    module = NormalizedActivation(kind, mode)
    reference = fc2(module(fc1(x)))
    module = NormalizedActivation(kind, mode)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = fc1(x)
        out = module(h)
        y = fc2(out)
    assert h.dtype == out.dtype == torch.bfloat16
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), reference, rtol=0.05, atol=0.05)
    y.float().square().sum().backward()
    assert torch.isfinite(fc1.weight.grad).all() and torch.isfinite(module.omega.grad)


@pytest.mark.parametrize("mode", MODES)
def test_fp16_input_with_large_values(mode):
    # |h| ~ 300: sum of squares is ~ 1e7, far beyond fp16 (max 65504)
    h = (300.0 * torch.randn(4, 3, 256)).half()
    out = NormalizedActivation("nswish", mode)(h)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    expected = NormalizedActivation("nswish", mode)(h.float())
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=0.5)
    hg = h.clone().requires_grad_()
    NormalizedActivation("nswish", mode)(hg).float().square().mean().backward()
    assert hg.grad.dtype == torch.float16 and torch.isfinite(hg.grad).all()


# ---------------------------------------------------------------- flags and factory


def parse(argv):
    """The flags as fairseq parses model flags: absent ones stay absent (SUPPRESS)."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    add_activation_args(parser)
    args = parser.parse_args(argv)
    args.encoder_layers = args.decoder_layers = 6
    return args


def activation_spec(cfg):
    """The FFN activations' part of the model's resolved choices."""
    return resolve_model(cfg).activation


def normalized_activation_from_cfg(cfg, side, layer_index, num_layers):
    """What the model builds for one FFN: the spec of ``cfg`` (validated once), then its module."""
    return activation_spec(cfg).build(side, layer_index, num_layers)


def validate_normalized_activation_args(args):
    activation_spec(args)


def test_flag_defaults():
    args = parse([])
    spec = activation_spec(args)  # unset flags read as their defaults
    assert spec.kind is None
    assert spec.stats == "instance"
    assert spec.momentum == 0.9
    assert (spec.clamp_min, spec.clamp_max) == (LO, HI)
    assert spec.encoder_unnormalized_top_layers == spec.decoder_unnormalized_top_layers == 0
    validate_normalized_activation_args(args)


def test_flags_override_arch_defaults():
    args = parse([
        "--normalized-activation", "nrelu", "--normalized-activation-stats", "batch",
        "--normalized-activation-momentum", "0.5", "--normalized-activation-clamp-min", "0.1",
        "--normalized-activation-clamp-max", "1.5", "--decoder-unnormalized-top-layers", "2",
    ])
    validate_normalized_activation_args(args)
    cfg = TransformerConfig.from_namespace(args)  # what the model is built from
    module = normalized_activation_from_cfg(cfg, "decoder", 0, 6)
    assert (module.kind, module.stats, module.momentum) == ("nrelu", "batch", 0.5)
    assert (module.clamp_min, module.clamp_max) == (0.1, 1.5)


def test_help_cites_the_paper():
    parser = argparse.ArgumentParser()
    add_activation_args(parser)
    assert "ANAct: Adaptive Normalization for Activation Functions" in " ".join(parser.format_help().split())


@pytest.mark.parametrize("kind, plain", [("nswish", torch.nn.functional.silu), ("nrelu", torch.relu)])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_from_cfg_keeps_the_top_k_layers_unnormalized(side, kind, plain):
    args = parse(["--normalized-activation", kind, f"--{side}-unnormalized-top-layers", "2"])
    cfg = TransformerConfig.from_namespace(args)
    got = [normalized_activation_from_cfg(cfg, side, i, 6) for i in range(6)]
    assert [type(m) for m in got] == [NormalizedActivation] * 4 + [UnnormalizedActivation] * 2
    h = torch.randn(3, 2, 8)
    # the paper's "NSwish+kSwish": the top FFNs keep Swish itself, whatever --activation-fn says
    torch.testing.assert_close(got[-1](h, None), plain(h), rtol=0, atol=0)
    other = "decoder" if side == "encoder" else "encoder"
    assert all(type(normalized_activation_from_cfg(cfg, other, i, 6)) is NormalizedActivation for i in range(6))
    # K = number of layers: every FFN unnormalized (the paper's "NSwish+6Swish" column)
    setattr(args, f"{side}_unnormalized_top_layers", 6)
    assert all(type(normalized_activation_from_cfg(args, side, i, 6)) is UnnormalizedActivation for i in range(6))


def test_from_cfg_unset_or_old_config_gives_none():
    assert normalized_activation_from_cfg(parse([]), "encoder", 0, 6) is None
    old = argparse.Namespace(activation_fn="relu")  # a config from before these flags
    assert normalized_activation_from_cfg(old, "decoder", 5, 6) is None
    # an old config that only names the activation gets every other default
    module = normalized_activation_from_cfg(argparse.Namespace(normalized_activation="nswish"), "decoder", 5, 6)
    assert (module.stats, module.momentum, module.clamp_min, module.clamp_max) == ("instance", 0.9, LO, HI)


def test_from_cfg_rejects_bad_arguments():
    args = parse(["--normalized-activation", "nswish", "--encoder-unnormalized-top-layers", "3"])
    with pytest.raises(ValueError, match=r"--encoder-unnormalized-top-layers must be an integer in \[0, 2\].*got 3"):
        normalized_activation_from_cfg(args, "encoder", 0, 2)
    with pytest.raises(ValueError, match="side"):
        normalized_activation_from_cfg(args, "middle", 0, 6)
    with pytest.raises(ValueError, match="layer_index"):
        normalized_activation_from_cfg(args, "encoder", 6, 6)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--normalized-activation-momentum", "1.0"], r"--normalized-activation-momentum must be in \[0, 1\), got 1.0"),
        (["--normalized-activation-momentum", "-0.1"], r"--normalized-activation-momentum must be in \[0, 1\), got -0.1"),
        (["--normalized-activation-clamp-min", "0"], r"--normalized-activation-clamp-min must be > 0, got 0.0"),
        (["--normalized-activation-clamp-min", "0.5", "--normalized-activation-clamp-max", "0.5"],
         r"--normalized-activation-clamp-max must be > --normalized-activation-clamp-min \(0.5\), got 0.5"),
        (["--encoder-unnormalized-top-layers", "7"], r"--encoder-unnormalized-top-layers must be an integer in \[0, 6\] \(--encoder-layers\), got 7"),
        (["--decoder-unnormalized-top-layers", "-1"], r"--decoder-unnormalized-top-layers must be an integer in \[0, 6\] \(--decoder-layers\), got -1"),
    ],
)
def test_validation_names_flag_value_and_range(argv, message):
    args = parse(["--normalized-activation", "nswish", *argv])
    with pytest.raises(ValueError, match=message):
        validate_normalized_activation_args(args)


def test_validation_rejects_top_layers_without_normalized_activation():
    args = parse(["--encoder-unnormalized-top-layers", "2"])
    with pytest.raises(ValueError, match="--encoder-unnormalized-top-layers 2 has no effect without --normalized-activation"):
        validate_normalized_activation_args(args)


def test_validation_rejects_batch_statistics_with_activation_checkpointing():
    args = parse(["--normalized-activation", "nrelu", "--normalized-activation-stats", "batch"])
    args.checkpoint_activations = True  # the recomputed forward would update the estimates again
    with pytest.raises(ValueError, match="batch cannot be used with --checkpoint-activations"):
        validate_normalized_activation_args(args)
    args.normalized_activation_stats = "instance"
    validate_normalized_activation_args(args)


def test_validation_reports_every_problem_at_once():
    args = parse(["--normalized-activation", "nrelu", "--normalized-activation-momentum", "2",
                  "--normalized-activation-clamp-min", "-1"])
    with pytest.raises(ValueError) as err:
        validate_normalized_activation_args(args)
    assert "momentum" in str(err.value) and "clamp-min" in str(err.value)


def test_constructor_rejects_bad_values():
    with pytest.raises(ValueError, match="--normalized-activation must be one of nrelu, nswish, got 'gelu'"):
        NormalizedActivation("gelu")
    with pytest.raises(ValueError, match="--normalized-activation-stats must be one of instance, batch"):
        NormalizedActivation("nrelu", "layer")


def test_padding_mask_of_the_wrong_shape_is_an_error():
    h, mask = sample()
    with pytest.raises(ValueError, match=r"padding_mask must be \(batch, seq_len\)"):
        NormalizedActivation("nrelu", "batch")(h, mask.t())


# ---------------------------------------------------------------- in a built model

def ffn_activations(model):
    return {n: m for n, m in model.named_modules() if n.endswith("ffn_activation")}


def test_built_model_normalizes_all_but_the_top_k_ffns(tiny_bin):
    model, _, _ = build(tiny_bin, "resnmt_transformer", [
        "--normalized-activation", "nswish", "--normalized-activation-stats", "batch",
        "--encoder-unnormalized-top-layers", "1", "--decoder-unnormalized-top-layers", "2",
    ])
    kinds = {n: (type(m).__name__, m.kind) for n, m in ffn_activations(model).items()}
    assert kinds == {
        "encoder.layers.0.ffn_activation": ("NormalizedActivation", "nswish"),
        "encoder.layers.1.ffn_activation": ("UnnormalizedActivation", "nswish"),
        "decoder.layers.0.ffn_activation": ("UnnormalizedActivation", "nswish"),
        "decoder.layers.1.ffn_activation": ("UnnormalizedActivation", "nswish"),
    }
    assert "encoder.layers.0.ffn_activation.running_rho" in model.state_dict()
    plain, _, _ = build(tiny_bin, "resnmt_transformer", [])
    assert not any(isinstance(m, (NormalizedActivation, UnnormalizedActivation)) for m in plain.modules())


@pytest.mark.parametrize("mode", MODES)
def test_model_incremental_decoding_and_checkpoint_round_trip(tiny_bin, mode):
    extra = ["--normalized-activation", "nswish", "--normalized-activation-stats", mode]
    model, task, _ = build(tiny_bin, "resnmt_transformer", extra)
    model.train()
    for n in (4, 6):  # a few training forwards set the batch estimates
        logits = model(**sample_batch(task, n=n, split="train")["net_input"])[0]
    logits.float().sum().backward()
    assert all(m.omega.grad is not None for m in ffn_activations(model).values())
    model.eval()
    assert_incremental_equals_full(model, task)

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh, _, _ = build(tiny_bin, "resnmt_transformer", extra, seed=7)
    fresh.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    fresh.eval()
    net_input = sample_batch(task, n=3)["net_input"]
    with torch.no_grad():
        torch.testing.assert_close(fresh(**net_input)[0], model(**net_input)[0], rtol=0, atol=0)


def test_bad_flag_stops_fairseq_parsing(tiny_bin, capsys):
    with pytest.raises(SystemExit):
        parse_train_args(tiny_bin, "resnmt_transformer", [
            "--normalized-activation", "nrelu", "--decoder-unnormalized-top-layers", "3",
        ])
    assert "--decoder-unnormalized-top-layers must be an integer in [0, 2]" in capsys.readouterr().err


# ---------------------------------------------------------------- ActivationSpec


def test_spec_from_unset_flags_is_the_default_spec_and_is_frozen():
    spec = activation_spec(parse([]))
    assert spec == ActivationSpec(encoder_layers=6, decoder_layers=6)
    assert spec.kind is None and spec.build("encoder", 0, 6) is None
    with pytest.raises(AttributeError):
        spec.kind = "nrelu"


def test_spec_builds_modules_with_its_values():
    spec = activation_spec(parse(["--normalized-activation", "nswish", "--normalized-activation-stats", "batch",
                                  "--normalized-activation-momentum", "0.25"]))
    module = spec.build("encoder", 0, 6)
    assert (module.kind, module.stats, module.momentum, module.eps) == ("nswish", "batch", 0.25, spec.eps)


def test_spec_error_is_one_line_naming_every_bad_flag():
    with pytest.raises(ValueError) as err:
        ActivationSpec(kind="nrelu", stats="layer", clamp_min=0.0, encoder_unnormalized_top_layers=3, encoder_layers=2)
    message = str(err.value)
    assert "\n" not in message
    assert "--normalized-activation-stats must be one of instance, batch, got 'layer'" in message
    assert "--normalized-activation-clamp-min must be > 0, got 0.0" in message
    assert "--encoder-unnormalized-top-layers must be an integer in [0, 2] (--encoder-layers), got 3" in message
