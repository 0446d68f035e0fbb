"""Dynamic Hyper-Connections against an independent implementation: the ``HyperConnections``
of the PyPI package ``hyper-connections`` (lucidrains, pinned in requirements-dev.txt; only
the reference here, never the implementation).

The package deviates from the paper in the ways below; each
deviation is set to the paper's where its API allows, and compared part by part where not:

1. its H̄ norm is an RMSNorm ``x/‖x‖·√d·(γ+1)`` (γ from 0), the paper's a LayerNorm. Our
   module takes the stack's norm, so it is built with ``--normalization rms_norm``'s
   (``nn.RMSNorm``, gain g, ``x/√(mean x² + 1e-5)·g``) and g = γ+1 is copied. The two differ
   only by the eps: ours = theirs·√(ms/(ms + 1e-5)), ms = mean x², checked to rounding;
   with both norms replaced by the identity the rest of the two modules (tanh, s_α, s_β,
   A_m, A_r, B, W, the width and depth connections) agrees to float64 rounding, forward
   and backward. The two modules end to end, each with its own norm, agree within what
   the eps explains (1e-4 on these inputs; the bound is asserted, not assumed);
2. always dynamic with tanh: compared with our dynamic variant;
3. ``layer_index`` defaults to random: passed explicitly (its initial A_m is then the
   paper's e_{k mod n}, checked against ours for several k);
4. its ``dropout`` drops the updated streams: left at 0 (ours has none; dropout belongs to
   the branch);
5. it folds the streams into dim 0 as ``(tokens streams)``: our (T, B, n, C) is reshaped to
   (T·B·n, C), stream index innermost, and back.

mHC is not compared: the package's mHC projects each stream separately (d -> n+1) where the
paper projects the flattened nC vector, and starts from other b's, so it computes another
function.
"""
import pytest
import torch
from hyper_connections import HyperConnections
from torch import nn

from resnmt.connections.hyper import DynamicHyperMixer
from resnmt.connections.norms import build_norm

T, B, C, N = 3, 2, 8, 4


def ours_and_theirs(index, seed=0):
    """Our DHC (RMSNorm) moved off its init in float64, and the package's with the same values."""
    ours = DynamicHyperMixer(C, build_norm(C, "rms_norm"), N, index).double()
    theirs = HyperConnections(N, dim=C, layer_index=index, tanh=True, dropout=0.0).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        copy_weights(ours, theirs)
    return ours, theirs


def copy_weights(ours, theirs):
    """The package's parameters from ours: its ``static_alpha`` (n, 1+n) is our ``alpha``
    ([A_m | A_r]), ``dynamic_alpha_fn`` (d, 1+n) our ``alpha_weight``, ``static_beta``,
    ``dynamic_beta_fn`` our ``beta``, ``beta_weight``; its scales are 0-d; its RMSNorm's
    γ is our gain minus 1."""
    theirs.static_alpha.copy_(ours.alpha)
    theirs.dynamic_alpha_fn.copy_(ours.alpha_weight)
    theirs.dynamic_alpha_scale.copy_(ours.alpha_scale.reshape(()))
    theirs.static_beta.copy_(ours.beta)
    theirs.dynamic_beta_fn.copy_(ours.beta_weight)
    theirs.dynamic_beta_scale.copy_(ours.beta_scale.reshape(()))
    theirs.norm.gamma.copy_(ours.norm.weight - 1.0)


def run_ours(ours, h, f):
    h_in, mixed, write = ours.width(h)
    return h_in, ours.depth(f, mixed, write)


def run_theirs(theirs, h, f):
    """The package on our layout: (T, B, n, C) -> ((T·B)·n, C) and back."""
    branch_input, add_residual = theirs(h.reshape(T * B * N, C))
    out = add_residual(f.reshape(T * B, C))
    return branch_input.reshape(T, B, C), out.reshape(T, B, N, C)


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, B, N, C, generator=g, dtype=torch.float64)
    return h, torch.randn(T, B, C, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("index", [0, 1, 3, 6])
def test_initial_values_are_the_packages(index):
    ours = DynamicHyperMixer(C, build_norm(C, "rms_norm"), N, index)
    theirs = HyperConnections(N, dim=C, layer_index=index)
    assert torch.equal(theirs.static_alpha.data, ours.alpha.data)
    assert torch.equal(theirs.static_beta.data, ours.beta.data)
    assert not theirs.dynamic_alpha_fn.any() and not ours.alpha_weight.any()
    assert not theirs.dynamic_beta_fn.any() and not ours.beta_weight.any()
    assert float(theirs.dynamic_alpha_scale.detach()) == float(ours.alpha_scale.detach()[0]) == pytest.approx(0.01)
    assert float(theirs.dynamic_beta_scale.detach()) == float(ours.beta_scale.detach()[0]) == pytest.approx(0.01)


@pytest.mark.parametrize("index", [0, 2, 5])
def test_equals_the_package_without_the_norms_forward_and_backward(index):
    """Deviation 1 removed (both norms the identity): the same function and gradients."""
    ours, theirs = ours_and_theirs(index)
    ours.norm, theirs.norm = nn.Identity(), nn.Identity()
    h, f = inputs()
    h_ours, h_theirs = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
    f_ours, f_theirs = f.clone().requires_grad_(True), f.clone().requires_grad_(True)
    in_ours, out_ours = run_ours(ours, h_ours, f_ours)
    in_theirs, out_theirs = run_theirs(theirs, h_theirs, f_theirs)
    torch.testing.assert_close(in_ours, in_theirs, rtol=0, atol=1e-13)
    torch.testing.assert_close(out_ours, out_theirs, rtol=0, atol=1e-13)
    g = torch.Generator().manual_seed(2)
    w_in, w_out = (torch.randn(x.shape, generator=g, dtype=torch.float64) for x in (in_ours, out_ours))
    ((in_ours * w_in).sum() + (out_ours * w_out).sum()).backward()
    ((in_theirs * w_in).sum() + (out_theirs * w_out).sum()).backward()
    for a, b in ((h_ours, h_theirs), (f_ours, f_theirs)):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-12)
    pairs = {"alpha": "static_alpha", "alpha_weight": "dynamic_alpha_fn", "alpha_scale": "dynamic_alpha_scale",
             "beta": "static_beta", "beta_weight": "dynamic_beta_fn", "beta_scale": "dynamic_beta_scale"}
    for mine, package in pairs.items():
        grad_ours = getattr(ours, mine).grad
        torch.testing.assert_close(grad_ours, getattr(theirs, package).grad.reshape(grad_ours.shape),
                                   rtol=0, atol=1e-12)


def test_the_norms_differ_by_the_eps_alone():
    """Our RMSNorm = theirs · √(ms / (ms + eps)), ms the mean square of the row."""
    ours, theirs = ours_and_theirs(0)
    h, _ = inputs()
    ms = (h ** 2).mean(-1, keepdim=True)
    with torch.no_grad():
        torch.testing.assert_close(ours.norm(h), theirs.norm(h) * torch.sqrt(ms / (ms + 1e-5)), rtol=0, atol=1e-13)


@pytest.mark.parametrize("index", [0, 2, 5])
def test_equals_the_package_with_the_norms_within_the_eps(index):
    """End to end, each with its own norm: the difference is the eps's, below 1e-4 here,
    and falls as 1/scale² when the inputs are scaled up (the eps's share of ms + eps)."""
    ours, theirs = ours_and_theirs(index)
    h, f = inputs()
    with torch.no_grad():
        worst = []
        for scale in (1.0, 1e3):
            in_ours, out_ours = run_ours(ours, scale * h, f)
            in_theirs, out_theirs = run_theirs(theirs, scale * h, f)
            torch.testing.assert_close(in_ours, in_theirs, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out_ours, out_theirs, rtol=1e-4, atol=1e-4)
            worst.append(float((out_ours - out_theirs).abs().max() / out_theirs.abs().max()))
    # ~2e-6 of the output's scale, then a million times less at 1000 times the input
    assert 1e-8 < worst[0] < 1e-4 and worst[1] < 1e-5 * worst[0]
