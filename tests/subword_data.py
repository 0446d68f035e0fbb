"""Small prepared directories in the layout resnmt-prepare writes (spm/ or bpe/, bin/, raw/),
made from the first lines of the real Multi30k EN-DE corpus in ../shared/data."""
from pathlib import Path

from conftest import built_once, fairseq_preprocess, write_multi30k_subset


def segment_with_sentencepiece(root: Path, vocab_size: int = 400):
    """Train a joint sentencepiece model on ROOT/text/train.{en,de} into ROOT/spm/spm.model;
    returns the loaded processor."""
    import sentencepiece as spm

    (root / "spm").mkdir(parents=True, exist_ok=True)
    text = root / "text"
    spm.SentencePieceTrainer.train(
        input=f"{text / 'train.en'},{text / 'train.de'}", model_prefix=str(root / "spm" / "spm"),
        vocab_size=vocab_size, character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2)
    return sentencepiece_of(root)


def sentencepiece_of(root: Path):
    """The processor of ROOT/spm/spm.model and a function segmenting a line with it."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(root / "spm" / "spm.model"))
    return processor, lambda line: " ".join(processor.encode(line, out_type=str))


def segment_with_subword_nmt(root: Path, merges: int = 300):
    """Learn joint BPE (subword-nmt) on ROOT/text/train.{en,de} into ROOT/bpe/bpe.codes."""
    import io

    from subword_nmt.learn_bpe import learn_bpe

    (root / "bpe").mkdir(parents=True, exist_ok=True)
    text = root / "text"
    joined = io.StringIO((text / "train.en").read_text(encoding="utf-8") + (text / "train.de").read_text(encoding="utf-8"))
    with open(root / "bpe" / "bpe.codes", "w", encoding="utf-8") as codes:
        learn_bpe(joined, codes, merges)
    return subword_nmt_of(root)


def subword_nmt_of(root: Path):
    """The BPE of ROOT/bpe/bpe.codes and a function segmenting a line with it."""
    from subword_nmt.apply_bpe import BPE

    with open(root / "bpe" / "bpe.codes", encoding="utf-8") as codes:
        bpe = BPE(codes)
    return bpe, lambda line: bpe.process_line(line)


def prepare(root: Path, kind: str = "sentencepiece", n_train: int = 300, n_valid: int = 20, n_test: int = 10) -> Path:
    """ROOT prepared like resnmt-prepare does (segmented with ``kind``, binarized with a joined
    dictionary, raw valid/test kept); returns ROOT."""
    text = write_multi30k_subset(root / "text", n_train=n_train, n_valid=n_valid, n_test=n_test)
    _, segment = (segment_with_sentencepiece if kind == "sentencepiece" else segment_with_subword_nmt)(root)
    pieces, raw = root / "pieces", root / "raw"
    pieces.mkdir()
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            lines = (text / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (pieces / f"{split}.{lang}").write_text("".join(segment(x) + "\n" for x in lines), encoding="utf-8")
            if split != "train":
                (raw / f"{split}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    fairseq_preprocess("--source-lang", "en", "--target-lang", "de", "--trainpref", pieces / "train",
                       "--validpref", pieces / "valid", "--testpref", pieces / "test", "--destdir", root / "bin",
                       "--joined-dictionary", "--workers", "1")
    return root


def prepared_once(tmp_path_factory, kind: str = "sentencepiece") -> Path:
    """``prepare(ROOT, kind)`` with its defaults, built once per test run and shared by the
    test files that read it (test_subword, test_hub): tests only read it."""
    return built_once(tmp_path_factory, f"prepared_{kind}", lambda root: prepare(root, kind))
