"""The CPU kernel of ``--fused-connections`` for NReLU/NSwish (``csrc/normalized_activation.cpp``).

``torch.compile`` fuses the normalized activation into a few kernels, but on the CPU each
call of a compiled function first pays a fixed ~40 µs in Python (Dynamo's guards, AOT
autograd's wrapper): at decoding sizes (64 tokens per step) that is as much as the ~25
eager ops it replaces. This kernel is called through ``ctypes`` for a few µs, computes the
per-token statistics and the output in one sweep over each token's features, and is
compiled once per machine with the C++ compiler on PATH (about a second; no Python
headers, no pybind11, no ninja) into ``$RESNMT_CACHE_DIR`` (default
``~/.cache/resnmt``), under a name that hashes the source, the flags and the compiler,
so an edited source or another compiler builds a new library.
"""
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Tuple

import torch
from torch import Tensor

SOURCE = Path(__file__).parent / "csrc" / "normalized_activation.cpp"
FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp")
COMPILERS = ("g++", "c++", "clang++")


class NativeKernelError(RuntimeError):
    """The CPU kernel could not be compiled or loaded here."""


def cache_dir() -> Path:
    if os.environ.get("RESNMT_CACHE_DIR"):
        return Path(os.environ["RESNMT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resnmt"


def compiler() -> str:
    """``$CXX`` when set, else the first C++ compiler on PATH."""
    found = os.environ.get("CXX") or next((c for c in COMPILERS if shutil.which(c)), None)
    if found is None:
        raise NativeKernelError(f"no C++ compiler ({', '.join(COMPILERS)}) on PATH to build {SOURCE.name}")
    return found


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The compiled kernel, built on first use (an atomic rename, so concurrent processes
    may both build it and neither sees half a file)."""
    cxx = compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise NativeKernelError(f"{cxx} --version failed: {err}") from err
    digest = hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS, version]).encode()).hexdigest()[:16]
    target = cache_dir() / f"normalized_activation-{digest}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        except OSError as err:
            raise NativeKernelError(f"cannot write the kernel to {target.parent} ({err}); "
                                    "set RESNMT_CACHE_DIR to a writable directory") from err
        os.close(fd)
        try:
            proc = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
            if proc.returncode != 0:
                raise NativeKernelError(f"{cxx} could not build {SOURCE}: {proc.stderr.strip()[-2000:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as err:
        raise NativeKernelError(f"cannot load {target} ({err}); delete it to rebuild") from err
    fn = lib.resnmt_instance_activation
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int] + [ctypes.c_float] * 4
    return lib


def instance_activation(x: Tensor, gate: float, swish: bool, clamp_min: float, clamp_max: float,
                        eps: float) -> Tuple[Tensor, Tensor]:
    """``(out, scale)`` for float32 ``x`` on the CPU (any shape, features last): ``out`` the
    normalized activation, ``scale = gate * lambda`` per token (shaped ``x[..., :1]``).
    ``gate`` is ``2 * sigmoid(omega)`` as a number; no autograd (the caller's Function
    does the backward)."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"expected a float32 CPU tensor, got {x.dtype} on {x.device}")
    x = x.contiguous()
    out = torch.nn.functional.silu(x) if swish else torch.empty_like(x)
    scale = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32)
    cols = x.shape[-1]
    library().resnmt_instance_activation(
        x.data_ptr(), out.data_ptr(), scale.data_ptr(), x.numel() // max(cols, 1), cols, int(swish),
        gate, clamp_min, clamp_max, eps)
    return out, scale
