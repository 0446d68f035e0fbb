"""Undo the data's own subword segmentation when decoding, and notice when nobody did.

fairseq decodes into subword pieces; ``fairseq-generate --post-process X`` (alias
``--remove-bpe``) and the hub's ``bpe=X`` turn them back into words, and only the X the
data was segmented with does: sentencepiece data decoded with ``--post-process
subword_nmt`` (or none) keeps its ``\u2581`` pieces, and sacreBLEU scores it near 0 with
no error anywhere. The data's subword model is read from its prepared directory
(``resnmt.data.manifest``: ``prepared.json``, or ``spm/spm.model`` / ``bpe/bpe.codes``
for a directory prepared before the manifest existed), in fairseq's spelling:

* ``sentencepiece``: pieces joined, ``\u2581`` turned into spaces;
* ``subword_nmt``: ``@@ `` joined.

``decode_post_process`` gives the ``--post-process`` value for decoding a directory and
refuses (``SubwordError``, one line) a different one asked for (``checked_post_process``
when the kind is known); ``hub_overrides`` the
hub's ``bpe``/model arguments; ``leftover_warning`` is the one-line warning
``resnmt-evaluate`` prints when hypotheses still hold pieces or markers.
"""
import re
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

SUBWORD_KINDS = ("sentencepiece", "subword_nmt")
# fairseq.data.data_utils.post_process's other spellings of subword_nmt
_SUBWORD_NMT_ALIASES = ("@@ ", "@@")
# what each kind leaves in text it was not undone from
_MARKER_RES = {"sentencepiece": re.compile("\u2581"), "subword_nmt": re.compile(r"@@(?: |$)")}
_DESCRIPTIONS = {"sentencepiece": "sentencepiece pieces ('\u2581')", "subword_nmt": "BPE markers ('@@ ')"}
# the hub's arguments naming each kind's model file (fairseq's --sentencepiece-model, --bpe-codes)
_HUB_MODEL_ARG = {"sentencepiece": "sentencepiece_model", "subword_nmt": "bpe_codes"}

PathLike = Union[str, Path]


class SubwordError(ValueError):
    """A post-processing that does not undo the data's segmentation (one line, naming both)."""


def normalize_kind(value: Optional[str]) -> Optional[str]:
    """fairseq's spellings of subword-nmt (``@@ ``, ``@@``; data-prep's ``subword-nmt``) as ``subword_nmt``."""
    if value in _SUBWORD_NMT_ALIASES or value == "subword-nmt":
        return "subword_nmt"
    return value


def data_subword(data: PathLike) -> Optional[Tuple[str, Path]]:
    """``(kind, model file)`` of the data in ``data`` (a prepared directory or its ``bin/``),
    or None when it names no subword model (word-level data, or made by other tools).
    SubwordError for an unreadable ``prepared.json``."""
    from resnmt.data.manifest import MANIFEST, SUBWORD_MODELS, ManifestError, prepared_directory, read_manifest

    directory = prepared_directory(data)
    try:
        manifest = read_manifest(directory)
        return manifest.subword, manifest.directory / manifest.subword_model
    except ManifestError as e:
        if (directory / MANIFEST).exists():
            raise SubwordError(str(e)) from None
    # no manifest, and not enough beside the model for read_manifest to infer one
    for kind, model in SUBWORD_MODELS.items():
        if (directory / model).is_file():
            return kind, directory / model
    return None


def post_process_flag(flags: Sequence[str]) -> Optional[str]:
    """The ``--post-process``/``--remove-bpe`` value among fairseq-generate ``flags`` (the
    last, as argparse takes it; ``subword_nmt`` for the bare flag, fairseq's const);
    None when neither is given."""
    value = None
    flags = list(flags)
    for i, flag in enumerate(flags):
        name, eq, inline = flag.partition("=")
        if name not in ("--post-process", "--remove-bpe"):
            continue
        if eq:
            value = inline
        elif i + 1 < len(flags) and not flags[i + 1].startswith("-"):
            value = flags[i + 1]
        else:
            value = "subword_nmt"
    return value


def checked_post_process(kind: str, flags: Sequence[str], data: PathLike) -> str:
    """``kind`` (the subword kind of the data in ``data``), after checking that no
    ``--post-process``/``--remove-bpe`` among fairseq-generate ``flags`` names another
    (SubwordError, one line naming both)."""
    asked = post_process_flag(flags)
    if asked is not None and normalize_kind(asked) != kind:
        raise SubwordError(f"--post-process {asked} does not undo the segmentation of {data}: it is {kind} data; "
                           f"use --post-process {kind}, or leave the flag out")
    return kind


def decode_post_process(data: PathLike, flags: Sequence[str] = ()) -> Optional[str]:
    """The ``--post-process`` for decoding the data in ``data``: its subword kind.

    A ``--post-process``/``--remove-bpe`` among ``flags`` (more fairseq-generate flags)
    must name the same kind, else SubwordError; for data without a subword model the
    flags' own value (None when they have none) is returned unchecked.
    """
    found = data_subword(data)
    if found is None:
        return post_process_flag(flags)
    return checked_post_process(found[0], flags, data)


def hub_overrides(data: PathLike, bpe: Optional[str] = None, model: Optional[PathLike] = None) -> Dict[str, str]:
    """The hub's ``bpe=`` and ``sentencepiece_model=``/``bpe_codes=`` for the data in ``data``.

    ``bpe``/``model``: what the caller passed (None: not passed). A ``bpe`` that is not the
    data's kind is refused (SubwordError); a ``model`` given is kept. For data without a
    subword model only what was passed is returned.
    """
    found = data_subword(data) if Path(data).is_dir() else None
    if found is None:
        out = {"bpe": bpe} if bpe is not None else {}
        if model is not None and bpe in _HUB_MODEL_ARG:
            out[_HUB_MODEL_ARG[bpe]] = str(model)
        return out
    kind, data_model = found
    if bpe is not None and normalize_kind(bpe) != kind:
        raise SubwordError(f"bpe='{bpe}' does not match the data in {data}: it is {kind} data ({data_model}); "
                           f"pass bpe='{kind}', or leave it out")
    return {"bpe": kind, _HUB_MODEL_ARG[kind]: str(model if model is not None else data_model)}


def leftover_markers(lines: Sequence[str]) -> Optional[Tuple[str, int]]:
    """``(kind, number of lines)`` of the segmentation markers still in ``lines``, the kind
    more lines hold; None when no line holds ``\u2581`` or a ``@@`` that ends a piece."""
    counts = {kind: sum(1 for line in lines if rx.search(line)) for kind, rx in _MARKER_RES.items()}
    kind = max(counts, key=counts.get)
    return (kind, counts[kind]) if counts[kind] else None


def leftover_warning(lines: Sequence[str], removed: str = "none") -> Optional[str]:
    """One line for hypotheses still holding subword markers after ``--remove-bpe removed``,
    naming the fix; None when they hold none."""
    found = leftover_markers(lines)
    if found is None:
        return None
    kind, n = found
    instead = f" instead of {removed}" if removed not in ("none", kind) else ""
    return (f"{n} of {len(lines)} hypotheses still hold {_DESCRIPTIONS[kind]}: their segmentation was not "
            f"undone and BLEU is meaningless; score with --remove-bpe {kind}{instead}, or decode with "
            f"fairseq-generate --post-process {kind}")
