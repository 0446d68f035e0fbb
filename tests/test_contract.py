"""Every built-in connection kind passes the contract (resnmt.testing), the checks a kind of
one's own passes too: its defaults with every check, each other value of its switches and
choices with those that depend on them, and the settings below (other numbers, two kinds in one model, other norms)
with the gradients, incremental decoding (and bf16) and TorchScript."""
import pytest

from resnmt.connections import BUILTIN_KINDS, CONNECTION_CLASSES
from resnmt.testing import CHECKS, Case, cases, contract_params, fast_path, run_check

MORE = [Case(name, tuple(flags)) for name, flags in {
    "xskip-lambda-1": ["--residual", "xskip", "--skip-lambda", "1"],
    "xskip_ln-learned-1.5": ["--residual", "xskip_ln", "--skip-lambda", "1.5", "--skip-lambda-learned"],
    "rskip_ln-lambda-3": ["--residual", "rskip_ln", "--skip-lambda", "3"],
    "sas-gate-dim-4": ["--residual", "sas", "--sas-gate-dim", "4", "--sas-alpha-bias-init", "1"],
    "resi_dual-scaled": ["--residual", "resi_dual", "--resi-dual-scale", "0.5", "--resi-dual-alpha", "0.7"],
    "dlcl-window-2": ["--residual", "dlcl", "--dlcl-window", "2", "--encoder-layers", "3"],
    "mix_ln-half": ["--residual", "mix_ln", "--mix-ln-fraction", "0.5"],  # 2 layers: post-LN, then pre-LN
    "hyper-dynamic-3-streams": ["--residual", "hyper", "--hc-dynamic", "--hc-streams", "3"],
    "mhc-5-iterations-dyt": ["--residual", "mhc", "--mhc-sinkhorn-iterations", "5", "--normalization", "dyt"],
    "rskip_ln-sas": ["--encoder-residual", "rskip_ln", "--decoder-residual", "sas"],
    "dlcl-resi_dual": ["--encoder-residual", "dlcl", "--decoder-residual", "resi_dual"],
    "hyper-denseformer": ["--encoder-residual", "hyper", "--decoder-residual", "denseformer"],
    "pre_ln-rms_norm": ["--residual", "pre_ln", "--normalization", "rms_norm"],
    "post_ln-dyt": ["--residual", "post_ln", "--normalization", "dyt", "--dyt-alpha-init", "0.8"],
    "dlcl_post-dyt": ["--residual", "dlcl_post", "--normalization", "dyt"],
    "resi_dual-rms_norm": ["--residual", "resi_dual", "--normalization", "rms_norm"],
    "hyper-dynamic-rms_norm": ["--residual", "hyper", "--hc-dynamic", "--normalization", "rms_norm"],
    "hybrid_norm-rms_norm": ["--residual", "hybrid_norm", "--normalization", "rms_norm"],
}.items()]
MORE_CHECKS = ("gradients", "incremental", "torchscript")
# The fast path's update against fairseq's step beyond the kinds' defaults (docs/training.md; the
# cases of tests/test_fast_path.py's KIND_CASES): the normalized activations (NSwish with batch
# statistics) and the other norms.
FAST_PATH_MORE = [Case(name, tuple(flags)) for name, flags in {
    "sas-nrelu": ["--residual", "sas", "--normalized-activation", "nrelu"],
    "sas-nswish-batch": ["--residual", "sas", "--normalized-activation", "nswish",
                         "--normalized-activation-stats", "batch"],
    "pre_ln-rms_norm": ["--residual", "pre_ln", "--normalization", "rms_norm"],
    "post_ln-dyt": ["--residual", "post_ln", "--normalization", "dyt"],
}.items()]


@pytest.mark.parametrize("case, check", contract_params(BUILTIN_KINDS) + contract_params(MORE, MORE_CHECKS)
                         + contract_params(FAST_PATH_MORE, ("fast_path",)))
def test_contract(case, check):
    run_check(case, check)


def test_every_check_runs_on_every_kind_and_variants_come_from_its_flags():
    items = {(p.values[0].name, p.values[1]) for p in contract_params(BUILTIN_KINDS)}
    assert {(kind, check) for kind in BUILTIN_KINDS for check in CHECKS} <= items
    assert [c.name for c in cases("sas")] == ["sas", "sas --sas-gate single_layer", "sas --sas-gamma gate"]
    assert [c.flags for c in cases("b2t")] == [("--residual", "b2t"), ("--residual", "b2t", "--b2t-rescale-init")]
    assert set(BUILTIN_KINDS) <= set(CONNECTION_CLASSES)
    # docs/training.md: "every kind ... and 4 variants, 1+1 layers, 3 updates"
    assert fast_path.UPDATES == 3 and len(BUILTIN_KINDS) == 21 and len(FAST_PATH_MORE) == 4


BROKEN_KINDS = """
import torch
from torch import nn
from resnmt.connections import SublayerConnection, register_connection


@register_connection
class UnusedGain(SublayerConnection):
    kind, equation, source = "contract_unused_gain", "x + F, g never used", "a test"

    def __init__(self, dim, spec):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x, fx):
        return x + fx


@register_connection
class LengthScaled(SublayerConnection):
    kind, equation, source = "contract_length_scaled", "x + F / T, T the sequence length", "a test"

    def __init__(self, dim, spec):
        super().__init__()

    def forward(self, x, fx):
        return x + fx / x.size(0)


@register_connection
class HiddenCount(SublayerConnection):
    kind, equation, source = "contract_hidden_count", "x + F * (1 + n / 8), n forwards in training, not saved", "a test"

    def __init__(self, dim, spec):
        super().__init__()
        self.n = 0

    def forward(self, x, fx):
        if self.training:
            self.n += 1
        return x + fx * (1 + self.n / 8)
"""


def test_the_contract_fails_a_kind_that_breaks_it_naming_the_check():
    """A parameter that gets no gradient, an output that depends on the sequence's length
    (so a decoding step differs from the full forward), and state kept outside the
    checkpoint (so a resumed run differs from the uninterrupted one) each fail their check."""
    from resnmt.connections import import_connections
    from resnmt.testing import check_connection
    from resnmt.testing.tiny import tiny_data

    path = tiny_data() / "broken_kinds.py"
    path.write_text(BROKEN_KINDS)
    import_connections(str(path))
    with pytest.raises(AssertionError, match=r"contract_unused_gain: check gradients failed: .*gain"):
        check_connection("contract_unused_gain", ["spec", "gradients"])
    check_connection("contract_length_scaled", ["forward", "gradients"])
    with pytest.raises(AssertionError, match="contract_length_scaled: check incremental failed"):
        check_connection("contract_length_scaled", ["incremental"])
    check_connection("contract_hidden_count", ["forward", "gradients"])
    with pytest.raises(AssertionError, match="contract_hidden_count: check two_ranks failed: .*losses differ"):
        check_connection("contract_hidden_count", ["two_ranks"])
