"""How and when ``import resnmt`` plugs resnmt into fairseq.

Plugging in (``plug_into_fairseq``) registers the ``resnmt_transformer`` model and its named
architectures, the ``resnmt_translation`` task, the ``adam_fused`` optimizer and the
``token_bleu`` scorer (``resnmt.decoding.token_bleu``), keeps the
float32 master weights of ``--fp16``/``--bf16`` runs in their checkpoints
(``resnmt.training.bf16``), lets fairseq's launch code run ranks on the CPU
(``resnmt.training.launch``), lets runs of several ranks resume on any number of ranks and
stop within a bounded time when one is lost (``resnmt.training.resume``), words torch's
refusal of an unsafe checkpoint in one line
(``resnmt.checkpoints.compat``), words an invalid choice in fairseq's parser (``--arch``'s ~180 names) as one line
naming the closest (``resnmt.options``) and lowers the DEBUG level fairseq's import leaves on the root logger
(``resnmt.training.quiet``). ``allow_fairseq_checkpoints`` (``resnmt.checkpoints.compat``)
allow-lists the types fairseq checkpoints hold for torch's ``weights_only`` loading.

All of that needs fairseq or torch, about two seconds to import, which data preparation
(``resnmt.data``, ``resnmt-prepare``) never uses. So ``import resnmt`` does each part as
soon as the library it needs is loaded: at once when it already is (``fairseq-train
--user-dir resnmt`` imports fairseq before the user directory), otherwise right after
that library's own import finishes, whoever imports it (where one of resnmt's modules
imports it, once that module's import has finished: plugging in imports resnmt's modules,
which must not be half-initialized then). ``import resnmt`` followed by
``from fairseq.models import ARCH_MODEL_REGISTRY`` finds resnmt's archs either way, a
checkpoint read with torch alone (``resnmt.checkpoints.averaging``) loads, and ``import
resnmt.data.corpora`` loads neither library.
"""
import importlib.abc
import importlib.machinery
import sys
from typing import Callable, Dict, List


def plug_into_fairseq() -> None:
    """Register resnmt's model, archs, task and optimizer with fairseq and install its
    patches of fairseq's training (idempotent: the registrations are module imports)."""
    from resnmt.checkpoints.compat import refuse_unsafe_checkpoints
    from resnmt.options import shorten_choice_errors
    from resnmt.training.bf16 import keep_fp32_master_weights
    from resnmt.training.launch import cpu_ranks_with_every_launcher, ddp_on_cpu_modules
    from resnmt.training.quiet import lower_fairseqs_debug_logging
    from resnmt.training.resume import install as resume_with_any_ranks

    keep_fp32_master_weights()
    ddp_on_cpu_modules()  # fairseq's default DDP on CPU ranks (resnmt.training.launch)
    cpu_ranks_with_every_launcher()  # spawn, torchrun and SLURM start CPU ranks (resnmt.training.launch)
    resume_with_any_ranks()  # several ranks: resume without a flag, on any number of ranks (resnmt.training.resume)
    refuse_unsafe_checkpoints()  # a crafted checkpoint: one line naming the global it asks for
    from resnmt import models  # noqa: F401  (registers the model and archs)
    from resnmt import tasks  # noqa: F401  (registers resnmt_translation)
    from resnmt.decoding import token_bleu  # noqa: F401  (registers --scoring token_bleu)
    from resnmt.training import optim  # noqa: F401  (registers --optimizer adam_fused)

    lower_fairseqs_debug_logging()  # fairseq's import leaves the root logger at DEBUG (resnmt.training.quiet)
    shorten_choice_errors()  # an invalid --arch (or other long choice): the closest names on one line (resnmt.options)


def allow_fairseq_checkpoints() -> None:
    from resnmt.checkpoints.compat import allow_fairseq_checkpoints as allow

    allow()


def when_imported(actions: Dict[str, Callable[[], None]]) -> None:
    """For each top-level module name of ``actions``: its action now if the module is
    loaded, else once, right after its import has finished, or, where a module of resnmt
    imported it, right after that module's import has (the action imports resnmt's
    modules, which must not be half-initialized then)."""
    waiting = {}
    for name, action in actions.items():
        if name in sys.modules:
            action()
        else:
            waiting[name] = action
    if waiting:
        sys.meta_path.insert(0, _AfterImport(waiting))


# loaders made for one module each: wrapping one's exec_module touches no other module
_FILE_LOADERS = (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader,
                 importlib.machinery.ExtensionFileLoader)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds modules with the other finders, wrapping the loaders of the ``waiting``
    modules (to run their actions after them) and of resnmt's own modules (to run an
    action that had to wait for them); steps aside once every action has run."""

    def __init__(self, waiting: Dict[str, Callable[[], None]]):
        self.waiting = waiting
        self.due: List[Callable[[], None]] = []  # actions whose module is loaded
        self.resnmt_depth = 0  # resnmt modules whose code is running

    def find_spec(self, fullname, path=None, target=None):
        ours = fullname.startswith("resnmt.")
        if fullname not in self.waiting and not ours:
            return None
        spec = next((s for s in (f.find_spec(fullname, path, target) for f in sys.meta_path
                                 if f is not self and hasattr(f, "find_spec")) if s is not None), None)
        if spec is None or not isinstance(spec.loader, _FILE_LOADERS):
            return spec
        run_module, action = spec.loader.exec_module, self.waiting.pop(fullname, None)

        def exec_module(module):
            self.resnmt_depth += ours
            try:
                run_module(module)
            finally:
                self.resnmt_depth -= ours
            if action is not None:
                self.due.append(action)
            self._run_due()

        spec.loader.exec_module = exec_module
        return spec

    def _run_due(self) -> None:
        while self.due and self.resnmt_depth == 0:
            self.due.pop(0)()
        if not self.waiting and not self.due and self in sys.meta_path:
            sys.meta_path.remove(self)
