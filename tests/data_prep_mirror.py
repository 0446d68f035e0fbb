"""Miniature mirrors of the published corpora, and a corpus of one's own, for the data-prep tests.

Each mirror holds files under their published names with the published internal
paths (archive members), filled with a few hundred real sentences from the
Multi30k EN-DE corpus in ../shared/data. They exercise the plumbing of
data-prep/prepare-*.sh end to end; the numbers they produce mean nothing.
"""
import gzip
import io
import os
import tarfile
from pathlib import Path

from conftest import shared_data_dir

# Planted in the first training corpus: each must be dropped by the cleaning step.
LONG_EN = " ".join(["word"] * 300)
PLANTED_BAD = [
    ("", "Ein leeres Englisch."),                                    # empty side
    (LONG_EN, "Ein sehr langer Satz."),                              # > 250 tokens
    ("A man in a blue shirt is standing on a ladder cleaning windows while his "
     "friend holds the ladder and two dogs watch them from the sidewalk .", "Ja."),  # ratio > 1.5
]


def multi30k_lines(name: str, lang: str) -> list:
    """The lines of a real Multi30k file (name: train, val, test_2016_flickr)."""
    with gzip.open(shared_data_dir("multi30k") / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def _text(lines) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def write_tar(path: Path, members: dict, gz: bool) -> None:
    """A tar (gzipped when gz) holding members {internal path: bytes}."""
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1400000000
            tar.addfile(info, io.BytesIO(data))


def sgm(lines, setid: str, lang: str, kind: str) -> bytes:
    """WMT 'fake SGML' as in test-full.tgz, with the oddities of the real files
    (spaces around segments, entities left escaped)."""
    tag = "srcset" if kind == "src" else "refset"
    out = [f'<{tag} setid="{setid}" srclang="any" trglang="{lang}">',
           f'<doc sysid="{kind}" docid="doc1" genre="news" origlang="en">', "<p>"]
    for i, line in enumerate(lines, 1):
        out.append(f'<seg id="{i}"> {line}  </seg>')
    out += ["</p>", "</doc>", f"</{tag}>"]
    return _text(out)


def expected_sgm_text(lines) -> list:
    """What sacreBLEU (and prepare-wmt14-*.sh) extract from sgm(lines)."""
    return [" ".join(line.split()) for line in lines]


def build_wmt14_mirror(dest: Path, tgt: str, n_per_corpus: int = 120, n_dev: int = 60, n_test: int = 50) -> dict:
    """Archives with the real names and internal paths of the WMT'14 EN-DE (tgt='de')
    or EN-FR (tgt='fr') release. For EN-FR the 'French' side is German text: only the
    plumbing is tested. Returns what the test needs to check the outputs."""
    dest.mkdir(parents=True, exist_ok=True)
    en_all, tgt_all = multi30k_lines("train", "en"), multi30k_lines("train", "de")
    pair = f"{tgt}-en"
    corpora = [
        ("training-parallel-europarl-v7.tgz", f"training/europarl-v7.{pair}", ""),
        ("training-parallel-commoncrawl.tgz", f"commoncrawl.{pair}", ""),
    ]
    if tgt == "fr":
        corpora.append(("training-parallel-un.tgz", f"un/undoc.2000.{pair}", ""))
    corpora.append(("training-parallel-nc-v9.tgz", f"training/news-commentary-v9.{pair}", ""))
    if tgt == "fr":
        corpora.append(("training-giga-fren.tar", "giga-fren.release2.fixed", ".gz"))

    archives = {}
    train_pairs = []
    for k, (archive, prefix, suffix) in enumerate(corpora):
        lo = k * n_per_corpus
        en, tg = en_all[lo:lo + n_per_corpus], tgt_all[lo:lo + n_per_corpus]
        if k == 0:
            en = [e for e, _ in PLANTED_BAD] + en
            tg = [t for _, t in PLANTED_BAD] + tg
        if k == 1:
            # Common Crawl has stray carriage returns inside lines
            en[5] = en[5].replace(" ", " \r", 1)
        train_pairs += list(zip(en, tg))
        for lang, lines in (("en", en), (tgt, tg)):
            data = _text(lines)
            if suffix == ".gz":
                data = gzip.compress(data, mtime=0)
            archives.setdefault(archive, {})[f"{prefix}.{lang}{suffix}"] = data

    val_en, val_tg = multi30k_lines("val", "en"), multi30k_lines("val", "de")
    dev_sets = ["newstest2013"] if tgt == "de" else ["newstest2012", "newstest2013"]
    valid_en, valid_tg = [], []
    for j, name in enumerate(dev_sets):
        en, tg = val_en[j * n_dev:(j + 1) * n_dev], val_tg[j * n_dev:(j + 1) * n_dev]
        archives.setdefault("dev.tgz", {})[f"dev/{name}.en"] = _text(en)
        archives["dev.tgz"][f"dev/{name}.{tgt}"] = _text(tg)
        # dev.tgz holds many other sets and languages: the script must pick the right ones
        archives["dev.tgz"][f"dev/{name}.cs"] = _text(["Nesmí se použít ."] * len(en))
        valid_en += en
        valid_tg += tg

    test_en = multi30k_lines("test_2016_flickr", "en")[:n_test]
    test_tg = multi30k_lines("test_2016_flickr", "de")[:n_test]
    test_en[3] = test_en[3] + " &amp; R&D"  # entities stay escaped, as in sacreBLEU
    code = "deen" if tgt == "de" else "fren"
    archives["test-full.tgz"] = {
        f"test-full/newstest2014-{code}-src.en.sgm": sgm(test_en, "newstest2014", "en", "src"),
        f"test-full/newstest2014-{code}-ref.{tgt}.sgm": sgm(test_tg, "newstest2014", tgt, "ref"),
        f"test-full/newstest2014-{code}-src.{tgt}.sgm": sgm(test_tg, "newstest2014", tgt, "src"),
    }
    for archive, members in archives.items():
        write_tar(dest / archive, members, gz=archive.endswith(".tgz"))
    return {
        "train_pairs": train_pairs,
        "valid": (valid_en, valid_tg),
        "test": (expected_sgm_text(test_en), expected_sgm_text(test_tg)),
        "files": sorted(archives),
    }


def build_iwslt_mirror(dest: Path) -> Path:
    """The four real test files; tst2012 stands in for the missing train split."""
    src = shared_data_dir("iwslt15-en-vi")
    dest.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "vi"):
        os.symlink(src / f"tst2012.{lang}", dest / f"train.{lang}")
        for name in ("tst2012", "tst2013"):
            os.symlink(src / f"{name}.{lang}", dest / f"{name}.{lang}")
    return dest


def write_corpus(dest: Path, n_train: int = 2000, n_valid: int = 100, n_test: int = 100) -> dict:
    """A corpus of one's own: the first lines of real Multi30k EN-DE, raw, as train/dev/test
    PREFIX.{en,de}; returns {split: PREFIX}."""
    dest.mkdir(parents=True, exist_ok=True)
    prefixes = {}
    for split, (name, n) in {"train": ("train", n_train), "valid": ("val", n_valid),
                             "test": ("test_2016_flickr", n_test)}.items():
        prefixes[split] = dest / {"train": "train", "valid": "dev", "test": "test"}[split]
        for lang in ("en", "de"):
            Path(f"{prefixes[split]}.{lang}").write_text("".join(x + "\n" for x in multi30k_lines(name, lang)[:n]),
                                                         encoding="utf-8")
    return prefixes


def custom_args(prefixes: dict, *more) -> list:
    return ["--train", prefixes["train"], "--valid", prefixes["valid"], "--test", prefixes["test"],
            "--source-lang", "en", "--target-lang", "de", *more]
