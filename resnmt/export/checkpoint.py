"""A translation checkpoint loaded for export: the model in eval mode, float32, on the CPU,
with its task (whose dictionaries the exports write out)."""
from pathlib import Path
from typing import Tuple

from resnmt.export import ExportError


def data_folder(data) -> Path:
    """The binarized data (its ``dict.*.txt``): ``data`` itself, or the ``bin/`` of a
    directory prepared by ``resnmt-prepare``."""
    data = Path(data)
    if not data.is_dir():
        raise ExportError(f"--data {data}: no such directory")
    if not any(data.glob("dict.*.txt")) and (data / "bin").is_dir():
        data = data / "bin"
    if not any(data.glob("dict.*.txt")):
        raise ExportError(f"--data {data}: no dict.*.txt here (the binarized data, or a folder prepared by "
                          "resnmt-prepare holding it in bin/)")
    return data


def load_translation_model(checkpoint, data) -> Tuple[object, object]:
    """(model, task) of ``checkpoint`` with the dictionaries of ``data``: eval mode, float32,
    CPU. A file that is not a translation checkpoint is one ExportError line."""
    import resnmt  # noqa: F401  (the model, task and the checkpoint's classes registered)
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModelBase

    path = Path(checkpoint)
    if not path.is_file():
        raise ExportError(f"--path {path}: no such checkpoint file")
    data = data_folder(data)
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)],
                                                                        arg_overrides={"data": str(data)})
    except (RuntimeError, KeyError, OSError, EOFError, ValueError) as e:  # torch.load's and fairseq's failures
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"--path {path}: not a fairseq translation checkpoint ({first})") from None
    model = models[0]
    if not isinstance(model, TransformerModelBase):
        raise ExportError(f"--path {path}: a {type(model).__name__}, not a Transformer translation model "
                          "(resnmt_transformer or fairseq's transformer)")
    return model.eval().float().cpu(), task
