"""Connection kinds from outside resnmt: the user's own module, file or installed package.

A kind of one's own is a :class:`~resnmt.connections.SublayerConnection` subclass decorated
with :func:`~resnmt.connections.register_connection`, exactly as the built-in kinds are,
in a module resnmt imports from one of three places:

* an installed package's entry point in the group ``resnmt.connections``
  (``[project.entry-points."resnmt.connections"] layerscale = "my_package.connection"``):
  ``pip install`` of the package is enough;
* the ``RESNMT_CONNECTIONS`` environment variable: module names or ``.py`` files,
  comma-separated;
* the ``--connections MODULE_OR_FILE[,...]`` model flag.

Installed packages' kinds are registered when :mod:`resnmt.connections` is imported, after
the built-in kinds; importing reads neither the command line nor the environment. The
other two are loaded by :func:`load_user_kinds`, which fairseq's parsing calls before it
parses (``fairseq-train``, ``fairseq-generate``, ``resnmt-train``: the
``user-kinds-when-parsing`` patch of :mod:`resnmt.fairseq_patches`), so that ``--residual``
offers the user's kinds and their flags when fairseq parses them, and which a look-up of a
kind not registered calls first (:func:`require_kinds`: building a model from Python,
loading a checkpoint). From Python, ``load_user_kinds("my_kind.py")`` registers a file's
kinds and returns their names. A model records the module (or absolute file) of every kind
of its own it uses in its flags' ``connections`` (:func:`sources_of`), so its checkpoint
names what it needs, and loading the checkpoint imports it (:func:`require_kinds`) or says
in one line which kind and module are missing. Every failure is a ConnectionConfigError
whose message is the one line a command prints (``PROG: error: MESSAGE``).
"""
import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from resnmt.connections.spec import CONNECTION_CLASSES, FILE_MODULE_PREFIX, ConnectionConfigError, is_builtin, origin

ENTRY_POINT_GROUP = "resnmt.connections"
ENVIRONMENT = "RESNMT_CONNECTIONS"
FLAG = "--connections"
HOW_TO_PROVIDE = (f"pip install the package that provides it (entry-point group {ENTRY_POINT_GROUP}), "
                  f"or name its module or .py file with {FLAG} or {ENVIRONMENT}")

_LOADED: Dict[str, ModuleType] = {}  # source (module name, or a file's absolute path) -> its module
BROKEN: Dict[str, str] = {}  # entry point value -> why it failed to load


def split_sources(text: Optional[str]) -> List[str]:
    """``"a.b,path/c.py"`` -> ``["a.b", "path/c.py"]`` (None or "" -> [])."""
    return [part.strip() for part in str(text or "").split(",") if part.strip()]


def is_file_source(source: str) -> bool:
    return source.endswith(".py") or os.sep in source or (os.altsep or os.sep) in source


def import_connections(source: str) -> ModuleType:
    """Import the module name or ``.py`` file ``source`` once (its kinds register as it
    runs); a module or file that cannot be imported is one ConnectionConfigError line."""
    key = str(Path(source).resolve()) if is_file_source(source) else source
    if key in _LOADED:
        return _LOADED[key]
    try:
        module = _import_file(Path(key)) if is_file_source(source) else importlib.import_module(source)
    except ConnectionConfigError:
        raise
    except Exception as e:  # the user's code: whatever it raises, one line naming the source
        raise ConnectionConfigError(f"connection module {source!r} cannot be imported: {type(e).__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}") from None
    _LOADED[key] = module
    return module


def _import_file(path: Path) -> ModuleType:
    """``path`` (a ``.py`` file) as a module of its own, kept in ``sys.modules`` (TorchScript
    reads a scripted class's source through it)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    name = f"{FILE_MODULE_PREFIX}{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_entry_points() -> None:
    """Import every installed ``resnmt.connections`` entry point. One that fails does not stop
    resnmt (the other kinds work): it is logged once, and named when its kind is asked for."""
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.value in _LOADED or entry.value in BROKEN:
            continue
        try:
            entry.load()
        except ConnectionConfigError as e:
            BROKEN[entry.value] = str(e)
        except Exception as e:  # the package's code: whatever it raises
            BROKEN[entry.value] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            _LOADED[entry.value] = sys.modules.get(entry.module)
            continue
        dist = getattr(getattr(entry, "dist", None), "name", "?")
        BROKEN[entry.value] = f"entry point {entry.name} = {entry.value} (package {dist}) failed to load: " \
                              f"{BROKEN[entry.value]}"
        logging.getLogger(__name__).warning(BROKEN[entry.value])


def command_line_sources(argv: Sequence[str]) -> List[str]:
    """The values of ``--connections`` among the arguments ``argv``."""
    found = []
    for i, arg in enumerate(argv):
        if arg == FLAG and i + 1 < len(argv):
            found += split_sources(argv[i + 1])
        elif arg.startswith(FLAG + "="):
            found += split_sources(arg.split("=", 1)[1])
    return found


def load_user_kinds(sources: Union[str, Sequence[str], None] = None,
                    environ: Optional[Dict[str, str]] = None) -> Tuple[str, ...]:
    """Import the user's connection modules, each once: ``sources`` (a ``--connections``
    value: module names or ``.py`` files, comma-separated, or a list of such values) and
    those ``RESNMT_CONNECTIONS`` names in ``environ`` (``os.environ`` where None; ``{}``
    leaves it out). Returns the kinds those modules registered, in registry order. A module
    that cannot be imported, or a kind that clashes with one registered, is a
    ConnectionConfigError naming it, in one line."""
    environ = os.environ if environ is None else environ
    given = [sources] if isinstance(sources, str) or sources is None else list(sources)
    names = split_sources(environ.get(ENVIRONMENT)) + [s for value in given for s in split_sources(value)]
    modules = {import_connections(source) for source in names}
    return tuple(kind for kind, cls in CONNECTION_CLASSES.items()
                 if not is_builtin(cls) and sys.modules.get(cls.__module__) in modules)


def source_of(kind: str) -> Optional[str]:
    """Where the registered ``kind`` comes from: None for a built-in kind, else its module's
    name, or the absolute path of the file it was loaded from."""
    cls = CONNECTION_CLASSES[kind]
    return None if is_builtin(cls) else origin(cls)


def sources_of(kinds: Iterable[str]) -> Optional[str]:
    """The ``--connections`` value that provides ``kinds`` (None: all built in)."""
    sources = [source_of(kind) for kind in dict.fromkeys(kinds)]
    return ",".join(dict.fromkeys(s for s in sources if s)) or None


def require_kinds(kinds: Iterable[str], sources: Optional[str]) -> None:
    """Check every kind of ``kinds`` is registered, where one is not first importing the
    modules of ``RESNMT_CONNECTIONS`` and ``sources`` (a model's ``--connections``): a
    missing one is one line naming the kind and the module it needs."""
    missing = [kind for kind in dict.fromkeys(kinds) if kind not in CONNECTION_CLASSES]
    if not missing:
        return
    load_user_kinds()  # RESNMT_CONNECTIONS's modules
    for source in split_sources(sources):
        try:
            import_connections(source)
        except ConnectionConfigError as e:
            raise ConnectionConfigError(f"--residual {missing[0]} needs connection module {source}, which cannot "
                                        f"be imported ({e}); {HOW_TO_PROVIDE}") from None
    missing = [kind for kind in missing if kind not in CONNECTION_CLASSES]
    if missing:
        loaded = f" ({', '.join(split_sources(sources))})" if sources else ""
        broken = "".join(f" ({why})" for why in BROKEN.values())
        raise ConnectionConfigError(
            f"--residual {missing[0]} is not a connection kind: neither built in "
            f"({', '.join(k for k, c in CONNECTION_CLASSES.items() if is_builtin(c))}) nor registered by the "
            f"modules loaded{loaded}{broken}; {HOW_TO_PROVIDE}")
