"""The plain FFN activations are fairseq's functions (swish mapped to SiLU)."""
import pytest
import torch
import torch.nn.functional as F

from resnmt.activations.ffn import PlainActivation


@pytest.mark.parametrize("name, reference", [("relu", F.relu), ("swish", F.silu), ("gelu", None)])
def test_plain_activation_computes_the_function(name, reference):
    h = torch.linspace(-4, 4, 24).view(2, 3, 4)
    out = PlainActivation(name)(h, None)
    assert isinstance(out, torch.Tensor) and out.shape == h.shape
    if reference is not None:
        torch.testing.assert_close(out, reference(h), rtol=0, atol=0)
