"""Every change resnmt makes to fairseq, torch and the standard library: the one inventory.

resnmt is a fairseq plugin, and a few things it needs cannot be had through fairseq's
registries: fairseq 0.12 predates torch's ``weights_only`` loading, ties ``--bf16`` to
TPUs, saves no float32 master weights, prints 4,700 characters for a mistyped
``--arch``. Each such change is one :class:`Patch` below: what it changes (``targets``,
the attributes it replaces), why, what it was written against, and when it applies
(``when``: as soon as a library is loaded, or when a flag asks for it). Its code stays in
the module whose job it serves (named by ``install``); this module is the one place that
applies them (:func:`apply`), each once: applying one again changes nothing.

``import resnmt`` applies the ``"import"`` patches of each library as soon as that library
is loaded (:func:`apply_loaded`, run by :mod:`resnmt.plugin`); a flag's patch is applied
by the component that reads the flag (the ``resnmt_translation`` task, the fused path),
through :func:`apply`, and :func:`remove` puts fairseq's own code back where the patch
can be undone. Adding a patch is one entry in :data:`PATCHES` (and its test in
tests/test_fairseq_patches.py, which checks each entry is in force and leaves fairseq's
own behaviour alone where resnmt is not used).

Changes to one object rather than to a library (an attention module's ``forward``, a
criterion's ``compute_loss``, a layer's compiled ``forward``) are :class:`Replacement`\\ s:
the replacing callable's class declares the method it stands in for, so whether an
object carries one is asked of that declaration (:meth:`Replacement.on`), never by
probing the object. They are listed in :data:`REPLACEMENTS`.

How ``import resnmt`` waits for a library it has not seen loaded (a finder on
``sys.meta_path`` that steps aside once fairseq and torch are loaded) is
:func:`resnmt.plugin.when_imported`; it changes neither library. Standard library only at
import: each patch's own module is imported when it is applied.
"""
import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

FAIRSEQ = "fairseq 0.12.2/0.12.3"
TORCH = "torch 2.6-2.13"


@dataclass(frozen=True)
class Patch:
    """One change to another library. ``library``: the one that must be loaded first
    ("python" for the standard library alone); ``when``: "import" (applied as soon as
    ``library`` is loaded in a process that imported resnmt) or the flag that asks for it;
    ``install``/``uninstall``: ``module:function`` paths (``uninstall`` empty: it stays for
    the process); ``targets``: the dotted attributes it replaces (kept by :func:`apply`,
    so that a test can compare fairseq's own behaviour with the patched one)."""

    name: str
    library: str
    when: str
    changes: str
    why: str
    written_for: str
    install: str
    uninstall: str = ""
    targets: Tuple[str, ...] = ()


PATCHES: Tuple[Patch, ...] = (
    Patch("deprecation-filters", "python", "import",
          "warnings filters: ignore hydra's UserWarnings, torch's torch.cuda.amp FutureWarning raised from fairseq, "
          "torch's mismatched-mask and no-accelerator pin_memory UserWarnings",
          "fairseq's calls into hydra's old API and deprecated torch APIs print ~24 notices per command that no "
          "user can act on; every other warning is shown", f"{FAIRSEQ}, hydra-core 1.0.7, {TORCH}",
          "resnmt.training.quiet:hide_third_party_deprecations"),
    Patch("park-prefetch-threads", "python", "import",
          "atexit: fairseq's live BackgroundConsumer threads are parked at their next queue put before shutdown",
          "a daemon prefetch thread inside torch's C++ code at shutdown aborts the process (SIGABRT) after a "
          "successful run on Python 3.11", f"{FAIRSEQ}, Python 3.10-3.12",
          "resnmt.training.prefetch_exit:park_prefetch_threads_at_exit"),
    Patch("one-line-errors", "python", "import",
          "sys.excepthook: an uncaught resnmt error whose class declares one_line = True prints as one "
          "'PROG: error: MESSAGE' line; every other exception goes to the hook before it",
          "a refused checkpoint or a checkpoint whose connection module is gone is the user's to fix, "
          "not a traceback through fairseq's loading", "Python 3.10-3.12",
          "resnmt.fairseq_patches:install_one_line_errors", targets=("sys.excepthook",)),
    Patch("safe-checkpoint-globals", "torch", "import",
          "torch.serialization's safe globals: argparse.Namespace added",
          "torch >= 2.6 loads weights_only, and fairseq's checkpoints of legacy models keep their configuration "
          "as an argparse.Namespace: without it no checkpoint loads (nothing else is allowed)", TORCH,
          "resnmt.checkpoints.compat:allow_fairseq_checkpoints"),
    Patch("refuse-unsafe-checkpoints", "fairseq", "import",
          "fairseq.checkpoint_utils.load_checkpoint_to_cpu: torch's refusal of a pickle's global raised as "
          "UnsafeCheckpointError naming the file and the global",
          "torch's refusal is a multi-line message about weights_only; a crafted checkpoint is one line",
          f"{FAIRSEQ}, {TORCH}", "resnmt.checkpoints.compat:refuse_unsafe_checkpoints",
          targets=("fairseq.checkpoint_utils.load_checkpoint_to_cpu",)),
    Patch("fp32-master-weights", "fairseq", "import",
          "fairseq.optim.fp16_optimizer.FP16Optimizer.state_dict/load_state_dict: the float32 master weights "
          "saved with the optimizer state and put back on load",
          "fairseq saves only the half-precision model, so a resumed --fp16/--bf16 run drifted from the "
          "uninterrupted one; checkpoints without the key load as before", FAIRSEQ,
          "resnmt.training.bf16:keep_fp32_master_weights",
          targets=("fairseq.optim.fp16_optimizer.FP16Optimizer.state_dict",
                   "fairseq.optim.fp16_optimizer.FP16Optimizer.load_state_dict")),
    Patch("short-choice-errors", "fairseq", "import",
          "argparse.ArgumentParser.error: in a parser with --user-dir (fairseq's), an invalid choice is one "
          "line naming the closest choices; other errors and other parsers as argparse's",
          "a mistyped --arch printed fairseq's ~185 lines of usage and 4,700 characters of choices",
          f"{FAIRSEQ}, Python 3.10-3.12 argparse", "resnmt.options:shorten_choice_errors",
          targets=("argparse.ArgumentParser.error",)),
    Patch("ddp-on-cpu-modules", "fairseq", "import",
          "fairseq.models.distributed_fairseq_model.DistributedDataParallel: device_ids and output_device "
          "dropped where every parameter of the module is on the CPU; a GPU module built as before",
          "fairseq's default --ddp-backend (pytorch_ddp/c10d) passes device_ids=[device_id] whatever the device, "
          "which torch refuses for a CPU module: CPU ranks could train with legacy_ddp only", FAIRSEQ,
          "resnmt.training.launch:ddp_on_cpu_modules",
          targets=("fairseq.models.distributed_fairseq_model.DistributedDataParallel",)),
    Patch("cpu-ranks-with-every-launcher", "fairseq", "import",
          "fairseq.distributed.utils.call_main: on the CPU, the ranks taken from fairseq's own launch "
          "(--distributed-world-size N processes started here), torchrun's or SLURM's variables, over gloo; "
          "runs on GPUs go to fairseq's call_main unchanged",
          "fairseq infers the launch from one GPU per rank: on the CPU its own launch started 0 processes and "
          "exited 0 having trained nothing, torchrun ended in ZeroDivisionError, SLURM counted a world of 0",
          FAIRSEQ, "resnmt.training.launch:cpu_ranks_with_every_launcher",
          targets=("fairseq.distributed.utils.call_main",)),
    Patch("each-rank-reads-the-checkpoint", "fairseq", "import",
          "fairseq.trainer.Trainer.load_checkpoint: with several data-parallel ranks every rank reads the file "
          "itself (fairseq's --load-checkpoint-on-all-dp-ranks, always)",
          "fairseq sends rank 0's loaded state to the others through torch.save/torch.load, which torch >= 2.6 "
          "loads weights-only and refuses (omegaconf's DictConfig): every resumed run of 2 or more ranks crashed; "
          "the same safe loader on every rank unpickles nothing more", f"{FAIRSEQ}, {TORCH}",
          "resnmt.training.resume:each_rank_reads_the_checkpoint", targets=("fairseq.trainer.Trainer.load_checkpoint",)),
    Patch("record-data-parallel-layout", "fairseq", "import",
          "fairseq.trainer.Trainer.state_dict: extra_state gains data_parallel (ranks, --update-freq, --max-tokens, "
          "--batch-size)",
          "a run resumed on another number of ranks must know how the checkpoint's batches were dealt out; stock "
          "fairseq ignores the key", FAIRSEQ, "resnmt.training.resume:record_the_data_parallel_layout",
          targets=("fairseq.trainer.Trainer.state_dict",)),
    Patch("iterators-resume-at-any-world-size", "fairseq", "import",
          "fairseq.data.iterators.EpochBatchIterator.state_dict/load_state_dict: the batches all ranks took "
          "together recorded, and an epoch continued from there on any number of ranks",
          "fairseq stores iterations_in_epoch per rank: resumed on another number of ranks, a mid-epoch run "
          "re-trained batches already seen (or skipped some); a state without the keys loads as before", FAIRSEQ,
          "resnmt.training.resume:iterators_resume_at_any_world_size",
          targets=("fairseq.data.iterators.EpochBatchIterator.state_dict",
                   "fairseq.data.iterators.EpochBatchIterator.load_state_dict")),
    Patch("say-when-the-global-batch-changes", "fairseq", "import",
          "fairseq.trainer.Trainer.load_checkpoint: rank 0 logs one line where the resumed run's global batch "
          "(ranks x --update-freq x --max-tokens) differs from the checkpoint's",
          "a run resumed with other batches trains other updates; the user is told before the first one", FAIRSEQ,
          "resnmt.training.resume:say_when_the_global_batch_changes",
          targets=("fairseq.trainer.Trainer.load_checkpoint",)),
    Patch("bounded-process-group-timeout", "fairseq", "import",
          "fairseq.distributed.utils.distributed_init: the process group, and every group made after it, wait "
          "--distributed-timeout seconds (default 300) for a rank",
          "torch's gloo default is 30 minutes: a run whose rank died hung that long before it stopped", f"{FAIRSEQ}, {TORCH}",
          "resnmt.training.resume:bounded_process_group_timeout",
          targets=("fairseq.distributed.utils.distributed_init",)),
    Patch("name-a-lost-rank", "fairseq", "import",
          "fairseq.distributed.utils.distributed_main: a rank whose peers stop answering ends with one line naming "
          "the lost rank and the checkpoint a re-run resumes from (exit status 1)",
          "a lost rank showed as a gloo traceback on each survivor, naming neither the rank nor what to do", FAIRSEQ,
          "resnmt.training.resume:name_a_lost_rank", targets=("fairseq.distributed.utils.distributed_main",)),
    Patch("atomic-checkpoint-copies", "fairseq", "import",
          "fairseq.file_io.PathManager.copy of a local file: written beside the target, then renamed over it",
          "fairseq copies checkpoint_last.pt (and checkpointN, _best) in place: a rank killed during the copy left a "
          "half-written checkpoint the re-run could not load; remote paths are copied as before", FAIRSEQ,
          "resnmt.training.resume:atomic_checkpoint_copies", targets=("fairseq.file_io.PathManager.copy",)),
    Patch("user-kinds-when-parsing", "fairseq", "import",
          "fairseq.options.parse_args_and_arch: the connection modules of --connections and RESNMT_CONNECTIONS "
          "imported before parsing; their failure, and the resnmt model flags' checks, one 'PROG: error:' "
          "line and exit status 2",
          "--residual's choices and a kind's own flags must be on the parser before it parses, and importing "
          "resnmt reads neither the command line nor the environment", FAIRSEQ,
          "resnmt.models.resnmt_transformer:load_user_kinds_when_parsing",
          targets=("fairseq.options.parse_args_and_arch",)),
    Patch("root-logger-level", "fairseq", "import",
          "logging's root logger: back to $LOGLEVEL or INFO, in fairseq-train's format, where importing fairseq "
          "left logging.basicConfig(level=DEBUG)",
          "fairseq/models/wav2vec/wav2vec2_classification.py configures DEBUG at import, so fairseq-generate "
          "and a Python session printed hydra's DEBUG lines", FAIRSEQ,
          "resnmt.training.quiet:lower_fairseqs_debug_logging"),
    Patch("fused-master-weights", "fairseq", "--fused-master-weights",
          "fairseq.optim.fp16_optimizer._FP16OptimizerMixin's grad/param syncs and zero_grad as multi-tensor "
          "copies; fairseq.utils.multi_tensor_total_norm from torch's _foreach_norm where apex is missing",
          "one kernel launch per parameter per copy: 533 of an update's 1,470 launches on the base Transformer",
          f"{FAIRSEQ}, {TORCH}", "resnmt.training.master_sync:install", "resnmt.training.master_sync:uninstall",
          targets=("fairseq.optim.fp16_optimizer._FP16OptimizerMixin._sync_fp16_grads_to_fp32",
                   "fairseq.optim.fp16_optimizer._FP16OptimizerMixin._sync_fp32_params_to_fp16",
                   "fairseq.optim.fp16_optimizer._FP16OptimizerMixin.zero_grad",
                   "fairseq.utils.multi_tensor_total_norm", "fairseq.utils.multi_tensor_l2norm_available")),
    Patch("fast-path-trainer", "fairseq", "--fast-path",
          "fairseq_cli.train.Trainer: resnmt.training.fast.step.FastPathTrainer",
          "fairseq-train builds the Trainer it finds in its module, and fairseq's reads device values every update",
          FAIRSEQ, "resnmt.training.fast:install", "resnmt.training.fast:uninstall",
          targets=("fairseq_cli.train.Trainer",)),
    Patch("dynamo-recompile-limit", "torch", "--fused-connections",
          "torch._dynamo.config.recompile_limit (cache_size_limit before torch 2.6) raised to 64 where lower",
          "the fused chains compile a few graphs per function (grad on/off, dtypes); past the limit dynamo "
          "falls back to eager silently", TORCH, "resnmt.training.compile:raise_recompile_limit"),
)

# what resnmt replaces on one object (an instance attribute standing in for its class's method)
REPLACEMENTS = {
    "resnmt.training.fast.attention.SDPAForward": "fairseq MultiheadAttention.forward of each layer's attention "
                                                    "(--fast-path): torch's SDPA while training",
    "resnmt.training.fast.fused_loss.FusedCompute": "a fairseq criterion's compute_loss (--fast-path on CUDA): one "
                                                     "Triton kernel from the logits",
    "resnmt.training.compile.CompiledForTraining": "each encoder and decoder layer's forward (--compile-layers): "
                                                    "torch.compile while training",
}

BY_NAME: Dict[str, Patch] = {p.name: p for p in PATCHES}
_APPLIED: Dict[str, Dict[str, Any]] = {}  # name -> the targets' values before it was applied


def _resolve(path: str) -> Callable:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


MISSING = object()  # a target whose module is not loaded (nothing of it to keep)


def target_value(target: str) -> Any:
    """The current value of the dotted attribute ``target`` (a loaded module's, or a class's in
    one), or MISSING where its module is not loaded (nothing is imported here)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            value = module
            for attr in parts[i:]:
                value = getattr(value, attr, MISSING)
            return value
    return MISSING


def apply(name: str) -> bool:
    """Apply the patch ``name`` (once: applying it again changes nothing); returns whether it
    was applied now."""
    patch = BY_NAME[name]
    if name in _APPLIED:
        return False
    before = {t: target_value(t) for t in patch.targets}
    if _resolve(patch.install)() is False:  # nothing to patch in this process (fairseq-train's module not loaded)
        return False
    _APPLIED[name] = before
    return True


def remove(name: str) -> None:
    """Put back what the patch ``name`` replaced (a patch with an ``uninstall``)."""
    patch = BY_NAME[name]
    if not patch.uninstall:
        raise ValueError(f"patch {name} stays for the process: it has no uninstall")
    _APPLIED.pop(name, None)
    _resolve(patch.uninstall)()


def applied(name: str) -> bool:
    return name in _APPLIED


def original(name: str, target: str) -> Any:
    """What ``target`` was before the applied patch ``name`` replaced it: fairseq's own."""
    return _APPLIED[name][target]


def apply_loaded(library: str) -> None:
    """Apply every ``"import"`` patch of ``library`` ("python", "torch", "fairseq"), in order."""
    for patch in PATCHES:
        if patch.when == "import" and patch.library == library:
            apply(patch.name)


# ------------------------------------------------------------------ one-line errors


def install_one_line_errors() -> None:
    """``sys.excepthook``: an exception whose class declares ``one_line = True`` (resnmt's
    errors a user fixes: a refused checkpoint, a model whose flags or connection module are
    wrong) prints as ``PROG: error: MESSAGE``, alone; any other goes to the hook before."""
    before = sys.excepthook

    def one_line(kind, value, traceback):
        if not getattr(kind, "one_line", False):
            return before(kind, value, traceback)
        prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "python"
        print(f"{prog}: error: {value}", file=sys.stderr)

    sys.excepthook = one_line


# ------------------------------------------------------------------ changes to one object


class Replacement:
    """A callable standing in for one object's method (``method``, declared by each
    subclass), keeping the object's own as ``eager``. :meth:`on` tells whether an object
    carries one of a class; :meth:`put_on` installs one once; :meth:`take_off` removes it."""

    method = "forward"

    def __init__(self, owner):
        self.owner, self.eager = owner, getattr(owner, self.method)

    @classmethod
    def on(cls, owner) -> Optional["Replacement"]:
        """The ``cls`` replacement ``owner`` carries, or None."""
        found = getattr(owner, cls.method, None)
        return found if isinstance(found, cls) else None

    @classmethod
    def put_on(cls, owner, *args, **kwargs) -> "Replacement":
        """``owner``'s ``cls`` replacement, made now if it has none (calling again changes nothing)."""
        found = cls.on(owner)
        if found is None:
            found = cls(owner, *args, **kwargs)
            setattr(owner, cls.method, found)
        return found

    def take_off(self) -> None:
        """The owner's own method back."""
        if type(self).on(self.owner) is self:
            delattr(self.owner, self.method)
