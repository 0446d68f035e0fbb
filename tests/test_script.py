"""Every connection kind's encoder and decoder layers script with torch.jit.script, as
fairseq's own layers do, and the scripted layer computes what the eager one does."""
import pytest
import torch

from model_utils import build, randomize_norms
from test_model import KIND_ARGS


def call(layer, side, x, memory):
    if side == "encoder":
        return layer(x, None)
    return layer(x, memory, None, None, self_attn_mask=torch.triu(torch.full((5, 5), float("-inf")), 1))


@pytest.mark.parametrize("name", [n for n in KIND_ARGS if not n.startswith("mixed")])
def test_layers_script_and_compute_the_same(tiny_bin, name):
    model, _, _ = build(tiny_bin, "resnmt_transformer", KIND_ARGS[name])
    randomize_norms(model)
    model.eval()
    x, memory = torch.randn(5, 2, 16), torch.randn(4, 2, 16)
    for side in ("encoder", "decoder"):
        layer = getattr(model, side).layers[-1]  # every layer of a side is built alike
        scripted = torch.jit.script(layer)
        streams = x
        if layer.ffn_connection.multi_stream:  # hyper, mhc: the layer reads and returns n streams (T, B, n, C)
            streams = torch.randn(5, 2, layer.ffn_connection.streams.num_streams, 16)
        with torch.no_grad():
            expected, got = call(layer, side, streams, memory), call(scripted, side, streams, memory)
        assert len(got) == len(expected) == 3  # (x, extra, residual sum): one shape for every layer
        for a, b in zip(got, expected):  # TorchScript may pick other kernels: float32 rounding apart
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
