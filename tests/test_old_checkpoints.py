"""Checkpoints written by an earlier resnmt (tests/fixtures/checkpoints) still load and
compute the same outputs. Regenerate only on a deliberate format change:
python tests/fixtures/make_checkpoints.py"""
import pytest
import torch

from old_checkpoints import FIXTURES, load, outputs

NAMES = sorted(path.name[: -len(".expected.pt")] for path in FIXTURES.glob("*.expected.pt"))


@pytest.mark.parametrize("name", NAMES)
def test_old_checkpoint_loads_strictly_and_computes_the_same(name):
    model = load(FIXTURES / f"{name}.pt")  # strict: every key present, none unexpected
    expected = torch.load(FIXTURES / f"{name}.expected.pt", weights_only=True)
    got = outputs(model, expected["batch"])["logits"]
    torch.testing.assert_close(got, expected["logits"], rtol=0, atol=1e-5)


def test_fixtures_cover_every_connection_kind():
    """Every built-in kind has a fixture (a new kind's: python tests/fixtures/make_checkpoints.py KIND)."""
    from resnmt.connections import BUILTIN_KINDS
    from resnmt.models.model_spec import side_kind

    kinds = set()
    for name in NAMES:
        args = torch.load(FIXTURES / f"{name}.pt", weights_only=True)["cfg"]["model"]
        kinds |= {side_kind(args, side) for side in ("encoder", "decoder")}
    assert kinds == set(BUILTIN_KINDS)


def test_batch_mode_activation_estimates_are_restored():
    state = torch.load(FIXTURES / "xskip_ln_xskip_nswish.pt", weights_only=True)["model"]
    model = load(FIXTURES / "xskip_ln_xskip_nswish.pt")
    loaded = model.state_dict()
    stat_keys = [k for k in state if "ffn_activation.running" in k or "ffn_activation.num_updates" in k]
    assert len(stat_keys) == 8, stat_keys  # mu, rho, rho', update count in the encoder and decoder FFN
    assert int(state["encoder.layers.0.ffn_activation.num_updates"]) == 3  # trained for 3 updates
    for key in stat_keys:
        torch.testing.assert_close(loaded[key], state[key], rtol=0, atol=0)


def test_learned_connection_parameters_are_restored():
    """ReZero's a, Admin's omega and the learned lambda come back as trained (3 updates
    moved them off their initial 0, sqrt(3/ln 3 - 1) and 1.5)."""
    for name, suffix in (("deepnorm_rezero", "residual_weight"), ("admin_xskip_ln_learned", "skip_scale")):
        state = torch.load(FIXTURES / f"{name}.pt", weights_only=True)["model"]
        loaded = load(FIXTURES / f"{name}.pt").state_dict()
        keys = [k for k in state if k.endswith(suffix)]
        assert len(keys) in (3, 5), keys
        for key in keys:
            torch.testing.assert_close(loaded[key], state[key], rtol=0, atol=0)
        if suffix == "residual_weight":
            assert all(0 < abs(float(state[k])) < 0.1 for k in keys)


def test_streams_and_normalizations_are_restored():
    """DLCL's combination weights and DyT's alpha come back as trained (3 updates moved
    them off the average and 0.5); the normalization is the one the checkpoint chose."""
    from resnmt.connections.norms import DynamicTanh
    from resnmt.connections.streams import dlcl_initial_weights

    state = torch.load(FIXTURES / "dlcl_post_dyt.pt", weights_only=True)["model"]
    model = load(FIXTURES / "dlcl_post_dyt.pt")
    weights = model.encoder.residual_stream.weights.detach()
    torch.testing.assert_close(weights, state["encoder.residual_stream.weights"], rtol=0, atol=0)
    assert not torch.allclose(weights, dlcl_initial_weights(3, 2))
    alphas = [k for k in state if k.endswith(".alpha")]
    assert alphas and all(abs(float(state[k]) - 0.5) > 0 for k in alphas)
    assert all(isinstance(m, DynamicTanh) for m in model.encoder.residual_stream.norms)
    rms = load(FIXTURES / "peri_ln_dlcl_rms_norm.pt")
    assert isinstance(rms.decoder.layer_norm, torch.nn.RMSNorm)
    assert isinstance(rms.encoder.layers[0].ffn_connection.output_norm, torch.nn.RMSNorm)
