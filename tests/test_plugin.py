"""``import resnmt`` plugs resnmt into fairseq when fairseq is loaded (resnmt.plugin):
before or after fairseq's own import, the archs, task and optimizer are registered; data
preparation imports neither fairseq nor torch."""
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

REGISTERED = """
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.optim import OPTIMIZER_REGISTRY
from fairseq.tasks import TASK_REGISTRY
import argparse, torch
assert "transformer_sas_base" in ARCH_MODEL_REGISTRY and "resnmt_translation" in TASK_REGISTRY
assert "adam_fused" in OPTIMIZER_REGISTRY and argparse.Namespace in torch.serialization.get_safe_globals()
"""


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)


@pytest.mark.parametrize("first", ["import resnmt", "import fairseq, resnmt", "import torch, resnmt"])
def test_importing_resnmt_registers_with_fairseq(first):
    python(first + "\n" + REGISTERED)


def test_data_preparation_loads_neither_torch_nor_fairseq():
    python("import sys\nimport resnmt.data.corpora, resnmt.data.pipeline, resnmt.cli.prepare\n"
           "assert not {'torch', 'fairseq'} & set(sys.modules), sorted({'torch', 'fairseq'} & set(sys.modules))")


def test_a_checkpoint_read_with_torch_alone_loads_under_weights_only():
    python("import argparse, sys, resnmt.checkpoints.averaging, torch\n"
           "assert argparse.Namespace in torch.serialization.get_safe_globals() and 'fairseq' not in sys.modules")
