"""Translate from Python with a resnmt checkpoint: fairseq's hub interface, set up for resnmt.

    import resnmt

    hub = resnmt.from_pretrained("runs/multi30k-sas", checkpoint_file="checkpoint.avg10.pt",
                                 data_name_or_path="data/multi30k", lenpen_form="gnmt")
    hub.translate("Two dogs play in the snow.", beam=4, lenpen=0.6)

``from_pretrained`` is fairseq's ``from_pretrained`` (``fairseq.hub_utils``) with four
differences:

* ``data_name_or_path`` may be a directory prepared by ``resnmt-prepare`` (or its
  ``bin/``): the dictionaries are read from its ``bin/``, and the subword model the data
  was segmented with is found there (``bpe='sentencepiece'`` and ``sentencepiece_model``,
  or ``bpe='subword_nmt'`` and ``bpe_codes``; a ``bpe`` that does not match the data is
  refused), as is the Moses tokenizer of data prepared with one (WMT'14), so that
  ``translate`` takes and returns plain text;
* ``lenpen_form='gnmt'`` ranks the finished hypotheses by the GNMT length penalty
  ``log P / ((5 + |Y|) / 6) ** lenpen`` of the papers (``--lenpen-form`` of the
  ``resnmt_translation`` task, see ``resnmt/decoding/sequence_generator.py``), for a checkpoint
  trained with any translation task; ``lenpen`` sets the default ``lenpen`` of
  ``translate``/``generate`` (each call may still pass its own);
* resnmt is imported, so the checkpoint's model and task are registered and its
  ``argparse.Namespace`` loads under torch's ``weights_only``;
* its searches are resnmt's fast beam search (``resnmt/decoding/fast_beam.py``: fairseq's
  hypotheses and scores, faster) for any translation checkpoint, unless
  ``beam_search='fairseq'``;
* its calls do not log fairseq's 4 INFO lines of batching (``can_reuse_epoch_itr = ...``,
  ``creating new batches for epoch 1``) each time, unless ``verbose=True`` (or a call's
  own ``verbose=True``, fairseq's switch for its S/H/P lines).

It returns fairseq's ``GeneratorHubInterface`` (``HubInterface``, a subclass): ``translate``,
``sample``, ``generate``, ``encode``/``decode`` as in fairseq. Without ``import resnmt``, fairseq's own
``TransformerModel.from_pretrained`` on a resnmt checkpoint fails inside ``torch.load``
(``UnpicklingError: Weights only load failed ... argparse.Namespace``) and, past that,
on the unknown ``resnmt_transformer`` model: ``import resnmt`` first (or pass
``user_dir=`` the resnmt package directory, fairseq's own way to load a plugin).
"""
import os
from pathlib import Path
from typing import Optional, Union

from fairseq import hub_utils, tasks
from fairseq.tasks.translation import TranslationTask
from omegaconf import open_dict

from resnmt.decoding.fast_beam import BEAM_SEARCHES
from resnmt.decoding.sequence_generator import LENPEN_FORMS
from resnmt.decoding.subword import SubwordError, hub_overrides
from resnmt.tasks.translation import ResNMTTranslationTask
from resnmt.training.quiet import hide_batching_lines

PathLike = Union[str, Path]


class HubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's GeneratorHubInterface whose calls log fairseq's batching lines only when
    ``verbose`` (the interface's, or the call's own)."""

    def __init__(self, cfg, task, models, verbose: bool = False):
        super().__init__(cfg, task, models)
        self.verbose = verbose

    def generate(self, tokenized_sentences, beam: int = 5, verbose: bool = False, **kwargs):
        if self.verbose or verbose:
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)
        with hide_batching_lines():
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)


def _data_dir(model_path: str, data_name_or_path: str) -> str:
    """fairseq's reading of ``data_name_or_path`` ('.'-relative to the checkpoint directory),
    absolute, and the ``bin/`` of a prepared directory rather than the directory itself."""
    data = os.path.join(model_path, data_name_or_path) if data_name_or_path.startswith(".") else data_name_or_path
    data = os.path.abspath(data)
    if not os.path.isdir(data):
        raise FileNotFoundError(f"data_name_or_path {data_name_or_path}: no such directory ({data})")
    if not any(name.startswith("dict.") for name in os.listdir(data)) and os.path.isdir(os.path.join(data, "bin")):
        data = os.path.join(data, "bin")
    return data


def moses_overrides(data: str, kwargs: dict) -> dict:
    """``tokenizer='moses'`` and its languages for data whose manifest says it was Moses-tokenized."""
    if "tokenizer" in kwargs:
        return {}
    from resnmt.data.manifest import ManifestError, read_manifest

    try:
        manifest = read_manifest(data)
    except ManifestError:
        return {}
    if manifest.detok != "moses":
        return {}
    return {"tokenizer": "moses", "moses_source_lang": manifest.source_lang, "moses_target_lang": manifest.target_lang}


def from_pretrained(model_name_or_path: PathLike, checkpoint_file: str = "checkpoint_best.pt",
                    data_name_or_path: PathLike = ".", *, lenpen_form: Optional[str] = None,
                    lenpen: Optional[float] = None, bpe: Optional[str] = None, beam_search: str = "fast",
                    verbose: bool = False, **kwargs):
    """Load ``model_name_or_path/checkpoint_file`` (a resnmt or fairseq translation checkpoint;
    several files joined by ``os.pathsep`` make an ensemble) for translation.

    Args:
        model_name_or_path: the checkpoint directory (or a fairseq model archive).
        checkpoint_file: the file in it, e.g. ``checkpoint.avg10.pt``.
        data_name_or_path: the binarized data (its ``dict.*.txt``) or the prepared
            directory holding it in ``bin/``; fairseq's default ``.`` is the checkpoint
            directory.
        lenpen_form: ``'gnmt'`` or ``'fairseq'``: how ``lenpen`` normalizes scores; None
            keeps the checkpoint's task setting (fairseq's form for ``translation``).
        lenpen: the default length penalty (alpha) of the interface's searches.
        bpe: fairseq's ``bpe`` (``'sentencepiece'``, ``'subword_nmt'``); found in a
            prepared directory, and refused when it does not match it.
        beam_search: ``'fast'`` (resnmt's, the same hypotheses as fairseq's) or ``'fairseq'``.
        verbose: log fairseq's batching lines at every call too.
        **kwargs: fairseq's overrides (``sentencepiece_model``, ``bpe_codes``,
            ``tokenizer``, ``beam``, ``max_len_b``, ``cpu`` ...).

    Returns:
        ``HubInterface``, a ``fairseq.hub_utils.GeneratorHubInterface``.

    Raises:
        ValueError: an unknown ``lenpen_form`` or ``beam_search``, or a ``bpe`` the data was not made with.
    """
    if lenpen_form is not None and lenpen_form not in LENPEN_FORMS:
        raise ValueError(f"lenpen_form '{lenpen_form}' is not one of: {' '.join(LENPEN_FORMS)}")
    if beam_search not in BEAM_SEARCHES:
        raise ValueError(f"beam_search '{beam_search}' is not one of: {' '.join(BEAM_SEARCHES)}")
    model_path = str(model_name_or_path)
    data = _data_dir(model_path, str(data_name_or_path)) if os.path.isdir(model_path) else str(data_name_or_path)
    try:
        kwargs.update(hub_overrides(data, bpe, kwargs.get("sentencepiece_model") or kwargs.get("bpe_codes")))
    except SubwordError as e:
        raise ValueError(str(e)) from None
    if os.path.isdir(data):
        kwargs.update(moses_overrides(data, kwargs))
    loaded = hub_utils.from_pretrained(model_path, checkpoint_file=checkpoint_file, data_name_or_path=data,
                                       archive_map=None, **kwargs)
    cfg, task, models = loaded["args"], loaded["task"], loaded["models"]
    # the resnmt_translation task's generators search with --beam-search and rank by
    # --lenpen-form; for a checkpoint of fairseq's translation task, one is set up on the same data
    with open_dict(cfg):
        cfg.task.beam_search = beam_search
        if lenpen_form is not None:
            cfg.task.lenpen_form = lenpen_form
        if not isinstance(task, ResNMTTranslationTask) and (lenpen_form is not None or isinstance(task, TranslationTask)):
            cfg.task._name = "resnmt_translation"
            task = tasks.setup_task(cfg.task)
    if isinstance(task, ResNMTTranslationTask):
        task.cfg.beam_search = beam_search
        if lenpen_form is not None:
            task.cfg.lenpen_form = lenpen_form
    if lenpen is not None:
        with open_dict(cfg):
            cfg.generation.lenpen = float(lenpen)
    return HubInterface(cfg, task, models, verbose=verbose)
