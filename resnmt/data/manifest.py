"""``OUTDIR/prepared.json``: what ``resnmt-prepare`` made of a corpus, for the tools that use it.

The manifest names the dataset, its languages and the subword model, spelled as
fairseq's ``--post-process`` value (``sentencepiece`` or ``subword_nmt``), so that
decoding and scoring undo the segmentation the data was made with. ``read_manifest``
is the one reader; for a directory prepared before the manifest existed it infers the
same facts from the files (``spm/spm.model`` or ``bpe/bpe.codes``, ``bin/``'s names).

    {"format": 1, "dataset": "multi30k", "source_lang": "en", "target_lang": "de",
     "subword": "sentencepiece", "subword_model": "spm/spm.model",
     "subword_size": 8000, "detok": "none", "compound_split": false}

``subword_size`` is the size of the model learned (sentencepiece pieces, or subword-nmt
merges): ``--bpe-size``, or less where the corpus could not hold that many.
"""
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

from resnmt.atomic import atomic_write_text

MANIFEST = "prepared.json"
FORMAT = 1
SUBWORD_MODELS = {"sentencepiece": "spm/spm.model", "subword_nmt": "bpe/bpe.codes"}


class ManifestError(Exception):
    """A directory that is not prepared data (one line naming it)."""


@dataclass(frozen=True)
class Manifest:
    directory: Path  # the prepared directory (OUTDIR)
    dataset: str  # a built-in corpus name, or "custom"
    source_lang: str
    target_lang: str
    subword: str  # fairseq's --post-process value: "sentencepiece" or "subword_nmt"
    subword_model: str  # relative to directory
    detok: str = "none"  # how the hypotheses are detokenized before scoring: none, moses
    compound_split: bool = False  # also report compound-split BLEU (WMT'14 EN-DE)
    subword_size: Optional[int] = None  # pieces or merges learned (None: prepared before it was recorded)

    def reference(self, split: str = "test") -> Path:
        """The raw target side of ``split`` (valid or test): the references for sacreBLEU."""
        return self.directory / "raw" / f"{split}.{self.target_lang}"


def write_manifest(directory: Path, dataset, subword: str, subword_model: str,
                   subword_size: Optional[int] = None) -> Manifest:
    """Write ``directory/prepared.json`` for ``dataset`` (a resnmt.data.corpora.Dataset)."""
    manifest = Manifest(Path(directory), dataset.name, dataset.src, dataset.tgt, subword, subword_model,
                        dataset.detok, dataset.compound_split, subword_size)
    record = {"format": FORMAT, **{k: v for k, v in asdict(manifest).items() if k != "directory"}}
    atomic_write_text(Path(directory) / MANIFEST, json.dumps(record, indent=1) + "\n")
    return manifest


def prepared_directory(path: Union[str, Path]) -> Path:
    """``path`` itself, or its parent when ``path`` is the ``bin/`` of a prepared directory."""
    path = Path(path)
    if path.name == "bin" and not (path / MANIFEST).exists():
        return path.parent
    return path


def binarized_data_problem(path: Union[str, Path]) -> Optional[str]:
    """What keeps ``path`` from being fairseq's binarized data (a directory with its
    dict.*.txt), on one line; a prepared directory given instead names its ``bin/``. None:
    nothing."""
    path = Path(path)
    if not path.is_dir():
        return f"data directory {path} not found"
    if any(path.glob("dict*.txt")):
        return None
    if any((path / "bin").glob("dict*.txt")):
        return f"{path} is a directory prepared by resnmt-prepare: its binarized data is {path / 'bin'}"
    return f"{path} holds no binarized data (no dict.*.txt; resnmt-prepare or fairseq-preprocess writes it)"


def read_manifest(path: Union[str, Path]) -> Manifest:
    """The manifest of a directory prepared by resnmt-prepare (``path``: OUTDIR or OUTDIR/bin).
    ManifestError when ``path`` is not one."""
    directory = prepared_directory(path)
    file = directory / MANIFEST
    if file.is_file():
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            fields = {k: record[k] for k in ("dataset", "source_lang", "target_lang", "subword", "subword_model")}
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"{file}: not a manifest written by resnmt-prepare ({e})") from None
        if record.get("format", FORMAT) > FORMAT:
            raise ManifestError(f"{file}: format {record['format']} is newer than this resnmt reads ({FORMAT})")
        return Manifest(directory, **fields, detok=record.get("detok", "none"),
                        compound_split=bool(record.get("compound_split", False)),
                        subword_size=record.get("subword_size"))
    return _infer(directory)


def _infer(directory: Path) -> Manifest:
    """The manifest of a directory prepared before prepared.json existed."""
    if not directory.is_dir():
        raise ManifestError(f"{directory}: no such directory")
    subword = next((kind for kind, model in SUBWORD_MODELS.items() if (directory / model).is_file()), None)
    pairs = {m.groups() for m in (re.fullmatch(r"train\.([^.-]+)-([^.-]+)\.[^.]+\.idx", p.name)
                                  for p in (directory / "bin").glob("train.*.idx")) if m}
    if subword is None or len(pairs) != 1:
        raise ManifestError(f"{directory}: not a directory prepared by resnmt-prepare (no {MANIFEST}, "
                            f"and no spm/spm.model or bpe/bpe.codes beside bin/train.SRC-TGT.*)")
    src, tgt = pairs.pop()
    dataset = directory.name
    from resnmt.data.corpora import DATASETS  # the scoring conventions of a built-in corpus

    known = DATASETS.get(dataset)
    return Manifest(directory, dataset, src, tgt, subword, SUBWORD_MODELS[subword],
                    known.detok if known else "none", known.compound_split if known else False)
