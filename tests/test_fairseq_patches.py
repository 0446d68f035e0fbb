"""resnmt.fairseq_patches, the one inventory of resnmt's changes to fairseq, torch and the
standard library: each patch is in force once resnmt is imported (or its flag asks for it),
and leaves fairseq's own behaviour alone where resnmt is not used (compared with what it
replaced, which the inventory keeps); each is applied once, from the inventory alone."""
import argparse
import functools
import io
import os
import pickle
import re
import subprocess
import sys
import warnings
from contextlib import redirect_stderr
from fractions import Fraction

import pytest
import torch
from fairseq import checkpoint_utils, options

import resnmt  # noqa: F401  (applies the import-time patches)
from resnmt import fairseq_patches
from resnmt.options import OptionError
from conftest import REPO_ROOT
from model_utils import TINY


def stderr_of(call, *args):
    """What ``call(*args)`` writes to stderr, and the exit status of its SystemExit (or None)."""
    err, code = io.StringIO(), None
    with redirect_stderr(err):
        try:
            call(*args)
        except SystemExit as stop:
            code = stop.code
    return err.getvalue(), code


# ------------------------------------------------------------------ one check per patch


FRESH_PROCESS = """
import logging, warnings
import fairseq
stock_level = logging.getLogger().level
import resnmt
from resnmt.training import prefetch_exit


def shown(message, category, module):
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit(message, category, "x.py", 1, module=module, registry={})
    return int(bool(caught))


prefetch_exit.park = lambda consumers, timeout=0: print("parked", len(consumers)) or {}  # what runs at exit
print(stock_level, logging.getLogger().level,
      shown("Hydra14MigrationWarning: ...", UserWarning, "hydra.core.utils"),
      shown("`torch.cuda.amp.autocast(args...)` is deprecated", FutureWarning, "fairseq.trainer"),
      shown("a warning of the user's", UserWarning, "my_module"),
      shown("`torch.cuda.amp.autocast(args...)` is deprecated", FutureWarning, "my_module"))
"""


@functools.lru_cache(maxsize=None)
def fresh_process() -> tuple:
    """What a fresh process that imports fairseq, then resnmt, finds (FRESH_PROCESS): pytest's
    own warning filters and logging are not there."""
    env = {k: v for k, v in os.environ.items() if k != "LOGLEVEL"}
    return tuple(subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, cwd=REPO_ROOT,
                                env=env, check=True).stdout.split())


def check_root_logger_level(tmp_path):
    """Importing fairseq alone leaves the root logger at DEBUG (fairseq's own behaviour);
    importing resnmt then lowers it to INFO."""
    assert fresh_process()[:2] == ("10", "20")


def check_park_prefetch_threads(tmp_path):
    """Run at exit, once (no prefetch thread alive: none parked)."""
    assert fresh_process()[6:] == ("parked", "0")


def check_deprecation_filters(tmp_path):
    """hydra's and torch's notices about fairseq's calls are hidden; the same categories from
    anywhere else, and the same texts raised elsewhere, are shown."""
    assert fresh_process()[2:6] == ("0", "0", "1", "1")


def check_one_line_errors(tmp_path):
    out, _ = stderr_of(sys.excepthook, OptionError, OptionError("--residual 'x' is not a connection kind"), None)
    prog = sys.argv[0].rsplit("/", 1)[-1]
    assert out == f"{prog}: error: --residual 'x' is not a connection kind\n"
    # any other exception: the hook before (Python's: the exception's type and message)
    out, _ = stderr_of(sys.excepthook, ValueError, ValueError("not resnmt's"), None)
    assert out.strip().splitlines()[-1] == "ValueError: not resnmt's"


def check_safe_checkpoint_globals(tmp_path):
    torch.save({"args": argparse.Namespace(arch="transformer")}, tmp_path / "namespace.pt")
    assert torch.load(tmp_path / "namespace.pt", weights_only=True)["args"].arch == "transformer"
    torch.save({"x": Fraction(1, 3)}, tmp_path / "other.pt")  # any other class: still refused by torch
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL fractions.Fraction"):
        torch.load(tmp_path / "other.pt", weights_only=True)


def check_refuse_unsafe_checkpoints(tmp_path):
    from resnmt.checkpoints.compat import UnsafeCheckpointError

    torch.save({"x": Fraction(1, 3)}, tmp_path / "crafted.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"crafted.pt is an unsafe file, not loaded: its pickle asks "
                       r"for fractions.Fraction") as refused:
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "crafted.pt"))
    assert "\n" not in str(refused.value)
    # another failure is fairseq's own, as it was
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    stock = fairseq_patches.original("refuse-unsafe-checkpoints", "fairseq.checkpoint_utils.load_checkpoint_to_cpu")
    errors = []
    for load in (stock, checkpoint_utils.load_checkpoint_to_cpu):
        with pytest.raises(Exception) as failed:
            load(str(tmp_path / "garbage.pt"))
        errors.append((type(failed.value), str(failed.value)))
    assert errors[0] == errors[1] and not issubclass(errors[0][0], UnsafeCheckpointError)


class _Inner:
    """The optimizer FP16Optimizer wraps: its state, and what it was given to load."""

    def __init__(self):
        self.loaded = None

    def state_dict(self):
        return {"state": {0: "moments"}, "param_groups": []}

    def load_state_dict(self, state, overrides=None):
        self.loaded = state


class _Wrapper:
    """FP16Optimizer's attributes that its state_dict and load_state_dict read."""

    def __init__(self):
        self.fp32_optimizer, self.scaler = _Inner(), None
        self.fp32_params = [torch.arange(3.0), torch.ones(2)]


def check_fp32_master_weights(tmp_path):
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    from resnmt.training.bf16 import MASTER_WEIGHTS_KEY

    stock_save = fairseq_patches.original("fp32-master-weights", "fairseq.optim.fp16_optimizer.FP16Optimizer.state_dict")
    saved = FP16Optimizer.state_dict(_Wrapper())
    assert [t.tolist() for t in saved.pop(MASTER_WEIGHTS_KEY)] == [[0.0, 1.0, 2.0], [1.0, 1.0]]
    assert saved == stock_save(_Wrapper())  # fairseq's state, and the master weights beside it
    restored = _Wrapper()
    FP16Optimizer.load_state_dict(restored, {"state": {}, MASTER_WEIGHTS_KEY: [torch.full((3,), 7.0), torch.zeros(2)]})
    assert restored.fp32_params[0].tolist() == [7.0] * 3 and restored.fp32_optimizer.loaded == {"state": {}}
    stock = _Wrapper()  # a stock checkpoint's state (no master weights): loaded as fairseq loads it
    FP16Optimizer.load_state_dict(stock, {"state": {1: "x"}})
    assert stock.fp32_optimizer.loaded == {"state": {1: "x"}} and stock.fp32_params[0].tolist() == [0.0, 1.0, 2.0]


def check_short_choice_errors(tmp_path):
    parser = options.get_training_parser()
    out, code = stderr_of(parser.parse_args, ["data", "--arch", "transformer_sas_bas"])
    assert code == 2 and out.count("\n") == 1 and "closest: transformer_sas_base" in out
    # a parser without --user-dir (not fairseq's): argparse's own error, usage block and all
    plain = argparse.ArgumentParser(prog="mine")
    plain.add_argument("--colour", choices=[f"c{i}" for i in range(40)])
    stock = fairseq_patches.original("short-choice-errors", "argparse.ArgumentParser.error")
    ours = stderr_of(plain.parse_args, ["--colour", "c99"])
    plain.error = stock.__get__(plain)
    assert ours == stderr_of(plain.parse_args, ["--colour", "c99"]) and ours[0].startswith("usage: mine")


def check_user_kinds_when_parsing(tmp_path, tiny_bin=None):
    kind_file = tmp_path / "halved.py"
    kind_file.write_text("from resnmt.connections import SublayerConnection, register_connection\n\n\n"
                         "@register_connection\nclass Halved(SublayerConnection):\n"
                         "    kind, equation, source = 'halved_parse', 'x + F/2', 'a test'\n\n"
                         "    def forward(self, x, fx):\n        return x + 0.5 * fx\n")
    argv = [str(tiny_bin), "--arch", "resnmt_transformer", *TINY]
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [*argv, "--connections", str(kind_file), "--residual", "halved_parse"])
    assert args.residual == "halved_parse"
    # arguments without them: what fairseq's own function parses
    stock = fairseq_patches.original("user-kinds-when-parsing", "fairseq.options.parse_args_and_arch")
    assert options.parse_args_and_arch(options.get_training_parser(), argv) == \
        stock(options.get_training_parser(), argv)


def check_fused_master_weights(tmp_path):
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    from resnmt.training import master_sync

    fairseq_patches.remove("fused-master-weights")  # whatever an earlier test's task left
    stock = _FP16OptimizerMixin.zero_grad, utils.multi_tensor_total_norm
    try:
        assert fairseq_patches.apply("fused-master-weights") and not fairseq_patches.apply("fused-master-weights")
        assert _FP16OptimizerMixin.zero_grad is master_sync.zero_grad
    finally:
        fairseq_patches.remove("fused-master-weights")
    assert (_FP16OptimizerMixin.zero_grad, utils.multi_tensor_total_norm) == stock


def check_dynamo_recompile_limit(tmp_path, monkeypatch=None):
    import torch._dynamo

    from resnmt.training.compile import MIN_RECOMPILE_LIMIT, raise_recompile_limit

    config = torch._dynamo.config  # its own patch() puts every value back as it was
    with config.patch(recompile_limit=8):
        raise_recompile_limit()
        assert config.recompile_limit == MIN_RECOMPILE_LIMIT
    with config.patch(recompile_limit=512):  # a user's higher limit stays
        raise_recompile_limit()
        assert config.recompile_limit == 512


def check_ddp_on_cpu_modules(tmp_path):
    """fairseq's DistributedDataParallel call (device_ids=[0]) builds torch's DDP around a CPU
    module; torch's own constructor, which fairseq called, refuses it."""
    import torch.distributed as dist
    from fairseq.models import distributed_fairseq_model as dfm

    stock = fairseq_patches.original("ddp-on-cpu-modules", "fairseq.models.distributed_fairseq_model."
                                                           "DistributedDataParallel")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped = dfm.DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[0], output_device=0)
        assert wrapped.device_ids is None and wrapped.output_device is None
        with pytest.raises(ValueError, match="device_ids and output_device arguments only work"):
            stock(torch.nn.Linear(2, 2), device_ids=[0], output_device=0)
    finally:
        dist.destroy_process_group()


CHECKS = {name: globals()[f"check_{name.replace('-', '_')}"] for name in fairseq_patches.BY_NAME
          if f"check_{name.replace('-', '_')}" in globals()}
# checked where their component is: fairseq-train's module is not imported into this process, and
# the patches of several ranks are checked with ranks as processes
RESUMED = "tests/test_resume_ranks.py::test_a_stopped_two_rank_run_resumes_exactly_with_the_same_command"
OTHER_RANKS = "tests/test_resume_ranks.py::test_two_ranks_resume_on_one_and_one_on_two"
ELSEWHERE = {"fast-path-trainer": "tests/test_fast_path.py::test_install_replaces_fairseq_trains_trainer_and_uninstall_"
                                  "restores_it",
             # ranks are processes: each launcher starts them for real there
             "cpu-ranks-with-every-launcher": "tests/test_launchers.py::test_launcher_trains_cpu_ranks_with_every_ddp_"
                                              "backend",
             "each-rank-reads-the-checkpoint": RESUMED, "record-data-parallel-layout": OTHER_RANKS,
             "iterators-resume-at-any-world-size": OTHER_RANKS,
             "say-when-the-global-batch-changes": "tests/test_resume_ranks.py::test_another_global_batch_is_said_and_"
                                                  "each_sentence_still_seen_once",
             "bounded-process-group-timeout": "tests/test_resume_ranks.py::test_a_hung_rank_stops_the_others_after_the_"
                                              "timeout",
             "name-a-lost-rank": RESUMED, "atomic-checkpoint-copies": RESUMED}


@pytest.mark.parametrize("name", [p.name for p in fairseq_patches.PATCHES if p.name in CHECKS])
def test_each_patch_is_in_force_and_leaves_fairseq_alone(name, tmp_path, tiny_bin, monkeypatch):
    patch = fairseq_patches.BY_NAME[name]
    if patch.when == "import":
        assert fairseq_patches.applied(name)
    kwargs = {"tiny_bin": tiny_bin} if name == "user-kinds-when-parsing" else {}
    kwargs.update({"monkeypatch": monkeypatch} if name == "dynamo-recompile-limit" else {})
    CHECKS[name](tmp_path, **kwargs)


def test_every_patch_has_its_check_and_says_what_why_and_against_what():
    assert set(CHECKS) | set(ELSEWHERE) == set(fairseq_patches.BY_NAME)
    for path in ELSEWHERE.values():
        file, test = path.split("::")
        assert f"def {test}(" in (REPO_ROOT / file).read_text()
    for patch in fairseq_patches.PATCHES:
        assert patch.changes and patch.why and patch.written_for and patch.when, patch.name
        for target in patch.targets:  # the attributes it names exist (where their module is loaded)
            assert fairseq_patches.target_value(target) is not None, target


def test_patches_are_applied_once_and_from_the_inventory_alone():
    """Applying a patch again changes nothing; no module of resnmt but the inventory calls a
    patch's install function (each is defined in its own module and named in the inventory)."""
    before = {t: fairseq_patches.target_value(t) for p in fairseq_patches.PATCHES if p.when == "import"
              for t in p.targets}
    for patch in fairseq_patches.PATCHES:
        if patch.when == "import":
            assert not fairseq_patches.apply(patch.name)
    assert before == {t: fairseq_patches.target_value(t) for t in before}
    sources = {path: path.read_text() for path in (REPO_ROOT / "resnmt").rglob("*.py")}
    for patch in fairseq_patches.PATCHES:
        for path in filter(None, (patch.install, patch.uninstall)):
            module, function = path.split(":")
            callers = sorted(str(p.relative_to(REPO_ROOT)) for p, text in sources.items()
                             if re.search(rf"\b{function}\(", text.replace(f"def {function}(", "")))
            own = "resnmt/" + module.replace(".", "/").removeprefix("resnmt/")
            assert set(callers) <= {own + ".py", own + "/__init__.py"}, (patch.name, callers)


def test_a_replacement_is_found_by_its_declared_method_and_put_on_once():
    from resnmt.fairseq_patches import Replacement

    class Doubled(Replacement):
        method = "forward"

        def __call__(self, x):
            return 2 * self.eager(x)

    layer = torch.nn.Identity()
    assert Doubled.on(layer) is None
    first = Doubled.put_on(layer)
    assert Doubled.put_on(layer) is first and Doubled.on(layer) is first and layer(3) == 6
    first.take_off()
    assert Doubled.on(layer) is None and layer(3) == 3
