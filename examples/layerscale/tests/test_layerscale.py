"""LayerScale passes resnmt's connection contract, and computes the paper's equation."""
import pytest
import torch

from resnmt.connections import ConnectionSpec, build_connection
from resnmt.testing import contract_params, run_check
from resnmt_layerscale.connection import LayerScaleConnection, paper_epsilon


@pytest.mark.parametrize("case, check", contract_params(["layerscale"]))
def test_contract(case, check):
    run_check(case, check)


def test_equation_x_plus_diag_lambda_times_f_of_ln_x():
    torch.manual_seed(0)
    conn = build_connection(6, ConnectionSpec("layerscale", layer_scale_init=0.5))
    assert isinstance(conn, LayerScaleConnection)
    with torch.no_grad():
        conn.scale.copy_(torch.linspace(-1, 1, 6))
        conn.norm.weight.add_(0.3)
    x, fx = torch.randn(3, 2, 6), torch.randn(3, 2, 6)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    ln = (x - mean) / torch.sqrt(var + 1e-5) * conn.norm.weight + conn.norm.bias
    torch.testing.assert_close(conn.prenorm(x), ln, rtol=0, atol=1e-6)
    torch.testing.assert_close(conn(x, fx), x + torch.linspace(-1, 1, 6) * fx, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layers, epsilon", [(6, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6)])
def test_lambda_starts_at_the_papers_epsilon_for_the_depth(layers, epsilon):
    assert paper_epsilon(layers) == epsilon
    conn = build_connection(8, ConnectionSpec("layerscale", side="decoder", decoder_layers=layers))
    assert torch.equal(conn.scale.detach(), torch.full((8,), epsilon))
    given = build_connection(8, ConnectionSpec("layerscale", layer_scale_init=1e-4))
    assert torch.equal(given.scale.detach(), torch.full((8,), 1e-4))
