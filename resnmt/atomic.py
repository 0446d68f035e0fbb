"""Atomic file output: the one helper every resnmt step writes its results through.

A file is written to a temporary file beside its destination and renamed over it only when
the writer finished without an exception, so an interrupted step never leaves a
half-written file under the final name, and a re-run can trust every file that exists.
"""
import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union

PathLike = Union[str, os.PathLike]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: PathLike, mode: str = "w", *, fsync: bool = False) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing (``mode`` ``"w"``: UTF-8 text with
    ``\\n`` line ends, ``"wb"``: bytes); on a clean exit it replaces ``path``, on an
    exception it is removed and ``path`` is left as it was. Parent folders are created.
    ``fsync`` flushes the data to disk before the rename (large binary results)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open mode {mode!r}: choose 'w' (text) or 'wb' (bytes)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
        text = mode == "w"
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": "\n"} if text else {})) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as f:
        f.write(text)
