"""The check a command makes of the user's connection kinds before anything trains.

:func:`check_kinds` imports the kinds' modules (``--connections``, ``RESNMT_CONNECTIONS``,
the installed entry points), checks every kind named is registered, builds the model once
at the contract's tiny size (:mod:`resnmt.testing.tiny`: d=16, a corpus of made-up words,
no file of the user's read) with the kinds' flags, and runs one forward and one incremental
decoding step, checking that each connection returns the shape it was given and that the
model returns one score per target word. Whatever is wrong is a :class:`PreflightError`:
one line naming the kind, its module and what is wrong (a shape: the one expected and the
one returned). ``resnmt-study verdict``, ``resnmt-train`` and ``resnmt-experiment`` run it
first and end such a line with exit status 2, leaving nothing behind; the contract's first
check (``preflight``) is the same.
"""
import contextlib
import difflib
import io
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

KIND_FLAGS = ("--residual", "--encoder-residual", "--decoder-residual")
CONNECTIONS_FLAG = "--connections"
ENVIRONMENT = "RESNMT_CONNECTIONS"


class PreflightError(ValueError):
    """A user's kind that cannot train: one line naming the kind, its module and what is wrong."""


def flag_values(argv: Sequence[str], flag: str) -> List[str]:
    """Every value of ``flag`` on the command line ``argv`` (``--flag V`` and ``--flag=V``)."""
    found = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            found.append(arg.split("=", 1)[1])
    return found


def named_kinds(argv: Sequence[str]) -> List[str]:
    """The kinds ``argv`` names (``--residual``, ``--encoder-residual``, ``--decoder-residual``)."""
    return list(dict.fromkeys(v for flag in KIND_FLAGS for v in flag_values(argv, flag)))


def named_sources(argv: Sequence[str], environ: Optional[Dict[str, str]] = None) -> List[str]:
    """The connection modules ``argv`` (``--connections``) and the environment name."""
    from resnmt.connections.plugins import split_sources

    environ = os.environ if environ is None else environ
    return list(dict.fromkeys(split_sources(environ.get(ENVIRONMENT))
                              + [s for v in flag_values(argv, CONNECTIONS_FLAG) for s in split_sources(v)]))


def needed(argv: Sequence[str], environ: Optional[Dict[str, str]] = None) -> bool:
    """Whether ``argv`` involves a kind of the user's: a kind named that is not built in, or
    a connection module named (the built-in kinds pass the contract in the test suite)."""
    from resnmt.connections import BUILTIN_KINDS

    return bool(named_sources(argv, environ)) or any(k not in BUILTIN_KINDS for k in named_kinds(argv))


def module_of(kind: str, sources: Sequence[str]) -> str:
    """Where ``kind`` comes from, as an error line names it."""
    from resnmt.connections import CONNECTION_CLASSES
    from resnmt.connections.plugins import source_of

    if kind in CONNECTION_CLASSES:
        return f"module {source_of(kind)}" if source_of(kind) else "built in"
    return f"module {', '.join(sources)}" if sources else "no module named"


def named(kinds: Sequence[str], sources: Sequence[str]) -> str:
    """How an error line names what it is about: the kinds and their module (else the modules)."""
    if not kinds:
        return f"{CONNECTIONS_FLAG} {','.join(sources)}"
    return f"{' '.join(f'--residual {k}' for k in kinds)} ({module_of(kinds[0], sources)})"


def import_sources(kinds: Sequence[str], sources: Sequence[str]) -> None:
    """Import each connection module of ``sources`` and the installed entry points."""
    from resnmt.connections import ConnectionConfigError
    from resnmt.connections.plugins import import_connections, load_entry_points

    load_entry_points()
    for source in sources:
        try:
            import_connections(source)
        except ConnectionConfigError as e:
            raise PreflightError(f"{' '.join(f'--residual {k}' for k in kinds) or CONNECTIONS_FLAG}: "
                                 f"{e}") from None


def check_registered(kinds: Sequence[str], sources: Sequence[str]) -> None:
    """Every kind of ``kinds`` is registered; else why not: its entry point's module failed
    to load, or it is no kind (the closest names, and how to provide one)."""
    from resnmt.connections import CONNECTION_CLASSES
    from resnmt.connections.plugins import BROKEN, HOW_TO_PROVIDE

    for kind in kinds:
        if kind in CONNECTION_CLASSES:
            continue
        broken = [why for why in BROKEN.values() if why.startswith(f"entry point {kind} = ")]
        if broken:
            raise PreflightError(f"--residual {kind}: its {broken[0]}")
        close = difflib.get_close_matches(kind, list(CONNECTION_CLASSES), n=3)
        where = f" (module {', '.join(sources)})" if sources else ""
        loaded = f"the modules loaded register " if sources else "choose from "
        raise PreflightError(f"--residual {kind}{where}: no such connection kind"
                             + (f" (closest: {', '.join(close)})" if close else "")
                             + f"; {loaded}{', '.join(CONNECTION_CLASSES)}; {HOW_TO_PROVIDE}")


def kind_argv(argv: Sequence[str]) -> List[str]:
    """The part of ``argv`` that makes the connections: the kinds and every connection flag
    given (``--skip-lambda 2``, a kind's own flags, ``--normalization``)."""
    from resnmt.connections import CONNECTION_FLAGS

    options = {o.flag: o for o in CONNECTION_FLAGS.values()}
    out = []
    for i, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if name in KIND_FLAGS or (name in options and name != CONNECTIONS_FLAG):
            switch = name in options and options[name].kind == "switch"
            if "=" in arg or switch:
                out.append(arg)
            elif i + 1 < len(argv):
                out += [arg, argv[i + 1]]
    return out


def built(kinds: Sequence[str], flags: Sequence[str], sources: Sequence[str]):
    """The tiny model and task of ``flags``; its parser's or builder's error as one line."""
    from fairseq import tasks

    from resnmt.testing import tiny

    where = named(kinds, sources)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = tiny.parse(flags)
    except SystemExit:  # argparse's usage error: its last line is the message
        lines = [x for x in stderr.getvalue().splitlines() if x.strip()]
        raise PreflightError(f"{where}: {lines[-1].split('error: ', 1)[-1] if lines else 'its flags are refused'}") \
            from None
    except Exception as e:
        raise PreflightError(f"{where}: its flags are refused: {one_line(e)}") from None
    task = tasks.setup_task(args)
    try:
        return task.build_model(args), task
    except Exception as e:
        raise PreflightError(f"{where}: the model cannot be built: {one_line(e)}") from None


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


class ShapeCheck:
    """Forward hooks on every connection: each must return the shape of the stream it was
    given (``x``); the first that does not is kept (its kind, the shapes)."""

    def __init__(self, model):
        from resnmt.connections import SublayerConnection

        self.wrong: Optional[Tuple[str, tuple, tuple]] = None
        self.handles = [m.register_forward_hook(self.hook) for m in model.modules()
                        if isinstance(m, SublayerConnection)]

    def hook(self, module, inputs, output):
        x = inputs[0] if inputs else None
        shape = getattr(output, "shape", None)
        if self.wrong is None and x is not None and shape is not None and tuple(shape) != tuple(x.shape):
            self.wrong = (type(module).kind, tuple(x.shape), tuple(shape))
            raise PreflightError("shape")

    def close(self):
        for h in self.handles:
            h.remove()


def run_once(model, task, kinds: Sequence[str], sources: Sequence[str]) -> None:
    """One forward and one incremental decoding step of the tiny ``model``: each
    connection returns its input's shape, the model one score per target word."""
    import torch

    from resnmt.testing import tiny

    sample = tiny.batch(task, n=2)
    net_input, vocab = sample["net_input"], len(task.target_dictionary)
    model.eval()
    check = ShapeCheck(model)
    try:
        for step in ("the forward", "an incremental decoding step"):
            try:
                with torch.no_grad():
                    if step == "the forward":
                        out = model(**net_input)[0]
                        expected = (*sample["target"].shape, vocab)
                    else:
                        enc = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
                        out = model.decoder(net_input["prev_output_tokens"][:, :1], encoder_out=enc,
                                            incremental_state={})[0]
                        expected = (net_input["src_tokens"].size(0), 1, vocab)
            except Exception as e:
                if check.wrong:
                    kind, want, got = check.wrong
                    raise PreflightError(f"--residual {kind} ({module_of(kind, sources)}): in {step} of a tiny "
                                         f"model, the connection returns shape {got}, expected {want} (the shape "
                                         f"of its input x)") from None
                raise PreflightError(f"{named(kinds, sources)}: {step} of a tiny model fails: {one_line(e)}") from None
            if tuple(out.shape) != expected:
                raise PreflightError(f"{named(kinds, sources)}: {step} of a tiny model returns shape "
                                     f"{tuple(out.shape)}, expected {expected}")
    finally:
        check.close()


def check_kinds(argv: Sequence[str], environ: Optional[Dict[str, str]] = None) -> None:
    """The preflight of the kinds a command line ``argv`` names (its ``--residual``,
    ``--encoder-residual``, ``--decoder-residual``, ``--connections`` and connection flags;
    ``RESNMT_CONNECTIONS`` from ``environ``): a :class:`PreflightError` line where one is
    wrong."""
    kinds, sources = named_kinds(argv), named_sources(argv, environ)
    import_sources(kinds, sources)
    check_registered(kinds, sources)
    with quiet_fairseq():
        model, task = built(kinds, kind_argv(argv), sources)
        run_once(model, task, kinds, sources)


@contextlib.contextmanager
def quiet_fairseq():
    """fairseq's INFO lines (the tiny corpus's dictionaries and splits) left out."""
    log = logging.getLogger("fairseq")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def problem(argv: Sequence[str], environ: Optional[Dict[str, str]] = None, always: bool = False) -> Optional[str]:
    """What a command says before it starts: :func:`check_kinds`' line where ``argv`` involves
    a kind of the user's (:func:`needed`; ``always``: any kind) and it is wrong, else None."""
    if not (always or needed(argv, environ)):
        return None
    try:
        check_kinds(argv, environ)
    except PreflightError as e:
        return str(e)
    return None
