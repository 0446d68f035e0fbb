"""What a results line records beside its numbers: the run's name, its settings' key, paths
that hold no machine's folders, and the machine a number was measured on.
"""
import datetime
import hashlib
import json
import os
import platform
import socket
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def run_id() -> str:
    """A run's name: the UTC time it started (or finished), YYYY-MM-DDTHH:MM:SSZ."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def settings_key(settings: dict) -> str:
    """The 10-hex-digit name of a benchmark's settings (its run directories and JSON lines)."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def portable_path(path, dataset: Optional[Path] = None, root: Optional[Path] = None) -> str:
    """``path`` as a results line records it, holding no machine's folders: relative to
    ``root`` (default: the folder the command runs in) when inside it; else, inside the prepared ``dataset`` folder,
    relative to that folder's parent (``multi30k/bin``: the dataset's name leads); else
    its name alone."""
    path, root = Path(path).resolve(), Path(root or Path.cwd()).resolve()
    if path.is_relative_to(root):
        return str(path.relative_to(root))
    if dataset is not None and path.is_relative_to(Path(dataset).resolve()):
        return str(path.relative_to(Path(dataset).resolve().parent))
    return path.name


def portable_argv(argv: Sequence[str], dataset: Optional[Path] = None) -> List[str]:
    """A command line as a committed result records it: each absolute path in it portable
    (:func:`portable_path`; a temporary folder: its name)."""
    return [portable_path(x, dataset) if os.path.isabs(str(x)) else str(x) for x in argv]


def cpu_description() -> Dict[str, str]:
    """The CPU the numbers were measured on, for the JSON records."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": "cpu", "device_name": f"{name} ({os.cpu_count()} CPUs)"}


def cuda_description() -> Dict[str, str]:
    """The GPU the numbers were measured on (the first visible one) and the CUDA version torch
    was built with, for the JSON records."""
    import torch

    return {"device": "cuda", "device_name": f"{torch.cuda.get_device_name(0)} "
                                              f"({torch.cuda.device_count()} visible, torch {torch.__version__})",
            "cuda": torch.version.cuda}


def machine_description(device: str) -> dict:
    """Where speed.py's measurements ran (recorded in each raw and result line)."""
    machine = {
        "host": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "device": device, "python": platform.python_version(),
    }
    try:
        import torch

        machine["torch"] = torch.__version__
        if device == "cuda":
            machine["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover - informational only
        pass
    return machine
