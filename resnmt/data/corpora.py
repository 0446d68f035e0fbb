"""The one table of corpora: a declarative `Dataset` per built-in corpus (``DATASETS``),
and `custom` for a corpus of one's own.

A dataset names its published files (URL, sha256 when a verified hash is known), where
each split's parallel text lies in them, its languages, its subword and cleaning
defaults, the papers' training budget for it and how its test set is scored. The steps
that turn it into fairseq data are in resnmt.data.fetch and resnmt.data.process, written
once for all datasets (run by resnmt.data.pipeline); ``resnmt-prepare NAME`` runs them.
"""
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional


@dataclass(frozen=True)
class Published:
    """A file as published: its name (also its name in a --mirror), URL and sha256
    (None: not pinned, no copy of the published bytes was available to verify one)."""

    name: str
    url: str
    sha256: Optional[str] = None
    local: Optional[str] = None  # a file of one's own (resnmt-prepare custom): linked, never downloaded


@dataclass(frozen=True)
class Text:
    """One corpus of a split: per language, the published file holding its text or, when
    `archive` is set, the member of that archive. `sgm`: WMT "fake SGML" (test sets)."""

    paths: tuple  # ((language, path), ...)
    archive: Optional[str] = None
    sgm: bool = False

    def path(self, lang: str) -> str:
        return dict(self.paths)[lang]

    @property
    def name(self) -> str:
        """A short name for messages: the first path without directory and language."""
        first = self.paths[0][1].rsplit("/", 1)[-1]
        return first.split(f".{self.paths[0][0]}")[0]


def both(template: str, src: str, tgt: str, archive: Optional[str] = None) -> Text:
    """A Text whose two paths differ only in the language: template with "{lang}"."""
    return Text(tuple((lang, template.format(lang=lang)) for lang in (src, tgt)), archive)


def papers_budget(base: int, big: int) -> Dict[str, int]:
    """Updates the papers trained base and big models for."""
    return {"base": base, "big": big}


@dataclass(frozen=True)
class Dataset:
    name: str  # the entry point is resnmt-prepare NAME (data-prep/prepare-NAME.sh in a checkout)
    summary: str  # the --help description
    src: str
    tgt: str
    files: tuple  # Published, in fetch order
    train: tuple  # Text, concatenated in order
    valid: tuple
    test: tuple
    files_help: str  # --help epilog: where the files come from
    test_help: str  # --help: what OUTDIR/raw/test.* is
    expected_pairs: dict = field(default_factory=dict)  # split -> published line count
    moses: bool = False  # Moses normalization + tokenization of raw text (a "tokenize" step)
    subword_methods: tuple = ("subword-nmt", "sentencepiece")  # the first is the default
    subword_size: int = 32000
    subword_min_size: int = 1
    subword_size_help: str = ""
    max_len: Optional[int] = 250  # --max-len default; None: no cleaning step
    ratio: Optional[str] = None  # --ratio default; None: no --ratio, no ratio test
    max_train_lines: bool = True  # has --max-train-lines
    # training (the paper preset of resnmt-experiment): tokens per update, updates per model size
    tokens_per_update: int = 4096
    max_update: Dict[str, int] = field(default_factory=lambda: papers_budget(50000, 50000))
    # scoring: Moses detokenization of the hypotheses (and compound splitting) for WMT
    detok: str = "none"
    compound_split: bool = False

    @property
    def score_options(self) -> dict:
        """The scoring keywords (resnmt.decoding.scoring) of this dataset's test set."""
        if self.detok == "none":
            return {}
        return {"detok": self.detok, "lang": self.tgt, "compound_split": self.compound_split}

    @property
    def archives(self) -> bool:
        return any(t.archive for t in self.train + self.valid + self.test)

    @property
    def langs(self) -> tuple:
        return (self.src, self.tgt)


MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
# sha256 checked against a copy of the files as published at MULTI30K_URL
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")


def multi30k(name: str, tgt: str, tgt_name: str) -> Dataset:
    """Multi30k task 1, English->``tgt``: the published raw files of the three splits."""
    files = [f"{split}.{lang}.gz" for split in MULTI30K_SPLITS for lang in ("en", tgt)]
    return Dataset(
        name=name,
        summary=f"Multi30k task 1, English->{tgt_name} (29,000 train / 1,014 val / 1,000 test2016\n"
        "pairs, raw untokenized text), segmented with one joint sentencepiece model\n"
        f"trained on train.en + train.{tgt}, binarized with fairseq-preprocess\n"
        "--joined-dictionary (so --share-all-embeddings works).",
        src="en",
        tgt=tgt,
        files=tuple(Published(n, f"{MULTI30K_URL}/{n}", MULTI30K_SHA256[n]) for n in files),
        train=(both("train.{lang}.gz", "en", tgt),),
        valid=(both("val.{lang}.gz", "en", tgt),),
        test=(both("test_2016_flickr.{lang}.gz", "en", tgt),),
        files_help=f"Files ({MULTI30K_URL}/):\n"
        f"  train.{{en,{tgt}}}.gz val.{{en,{tgt}}}.gz test_2016_flickr.{{en,{tgt}}}.gz  (sha256 pinned)",
        test_help="raw test source/reference for sacreBLEU (and valid.*)",
        expected_pairs={"train": 29000, "valid": 1014, "test": 1000},
        subword_methods=("sentencepiece",),
        subword_size=8000,
        subword_min_size=10,
        subword_size_help="sentencepiece vocabulary size",
        max_len=None,
        max_train_lines=False,
    )


MULTI30K = multi30k("multi30k", "de", "German")
MULTI30K_EN_FR = multi30k("multi30k-en-fr", "fr", "French")

IWSLT_URL = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi"
# sha256 of the published test sets, checked against a copy of the files as published at
# IWSLT_URL; train.* is not pinned: no copy of the published bytes was available.
IWSLT_SHA256 = {
    "tst2012.en": "b8fbcd0d4199d41276421d1f7228298df67dd9e2c5c134c2ee8cdf3ec27801e2",
    "tst2012.vi": "01004078b3f36b0c46e81b65fc6851230b3c823405c76d1d82ef3b786b512ff0",
    "tst2013.en": "3860ce60bc5b85d96cc2d3d580cf1bc9d62440e939c1b964676d3607c4e8f1df",
    "tst2013.vi": "29af16842808da2812b8fd4d47fc05d082ba870e60ab7755090ad04b380994cd",
}

IWSLT15_EN_VI = Dataset(
    name="iwslt15-en-vi",
    summary="IWSLT'15 English->Vietnamese as released by the Stanford NLP group (train 133K\n"
    "pairs, tst2012 = valid, tst2013 = test). The release is already tokenized\n"
    "(Moses-style, with escapes such as &apos; and &quot;): the text is kept exactly\n"
    "as published, only segmented into joint subwords and binarized with\n"
    "fairseq-preprocess --joined-dictionary (so --share-all-embeddings works).\n"
    "Training pairs with an empty side or more than --max-len subwords are dropped;\n"
    "valid and test are kept whole.",
    src="en",
    tgt="vi",
    files=tuple(Published(f"{n}.{lang}", f"{IWSLT_URL}/{n}.{lang}", IWSLT_SHA256.get(f"{n}.{lang}"))
                for n in ("train", "tst2012", "tst2013") for lang in ("en", "vi")),
    train=(both("train.{lang}", "en", "vi"),),
    valid=(both("tst2012.{lang}", "en", "vi"),),
    test=(both("tst2013.{lang}", "en", "vi"),),
    files_help=f"Files ({IWSLT_URL}/):\n"
    "  train.{en,vi} (not pinned), tst2012.{en,vi}, tst2013.{en,vi} (sha256 pinned)",
    test_help="tst2013 exactly as published (references), and valid.*",
    subword_size_help="BPE merge operations (subword-nmt) or vocabulary size (sentencepiece); "
    "32000 is the size of the papers' tensor2tensor vocabulary, translate_envi_iwslt32k",
)


def wmt14(tgt: str, tgt_name: str, train: list, dev_sets: list, extra_files: list) -> Dataset:
    """WMT'14 English->tgt with the archives and members of fairseq's
    examples/translation/prepare-wmt14en2{de,fr}.sh, plus the WMT'14 dev.tgz.
    train: (archive, member prefix, suffix after the language) per corpus."""
    files = [
        Published("training-parallel-europarl-v7.tgz", "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"),
        Published("training-parallel-commoncrawl.tgz", "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"),
        *extra_files,
        Published("dev.tgz", "http://statmt.org/wmt14/dev.tgz"),
        Published("test-full.tgz", "http://statmt.org/wmt14/test-full.tgz"),
    ]
    code = f"{tgt}en"
    test = Text((("en", f"test-full/newstest2014-{code}-src.en.sgm"),
                 (tgt, f"test-full/newstest2014-{code}-ref.{tgt}.sgm")), "test-full.tgz", sgm=True)
    return Dataset(
        name=f"wmt14-en-{tgt}",
        summary=f"WMT'14 English->{tgt_name}: the standard training corpora; Moses punctuation\n"
        "normalization, non-printing character removal and tokenization (sacremoses,\n"
        f"aggressive hyphen splitting, as fairseq's prepare-wmt14en2{tgt}.sh); joint subwords\n"
        "learned on the tokenized training text; training pairs cleaned like Moses\n"
        "clean-corpus-n (1..--max-len subwords, length ratio <= --ratio); and\n"
        "fairseq-preprocess --joined-dictionary (so --share-all-embeddings works).\n"
        f"Dev: {'+'.join(dev_sets)}; test: newstest2014 (the full 3,003-sentence set in\n"
        "test-full.tgz). Dev and test are never cleaned.",
        src="en",
        tgt=tgt,
        files=tuple(files),
        train=tuple(Text((("en", f"{p}.en{s}"), (tgt, f"{p}.{tgt}{s}")), a) for a, p, s in train),
        valid=tuple(both(f"dev/{d}.{{lang}}", "en", tgt, "dev.tgz") for d in dev_sets),
        test=(test,),
        files_help="Files (not sha256-pinned, see --checksums):\n"
        + "\n".join(f"  {f.name:<36} {f.url}" for f in files),
        test_help="newstest2014 source/reference, untokenized, identical to\n"
        "sacreBLEU's wmt14/full (the references for sacreBLEU); valid.*: the dev set",
        moses=True,
        subword_size_help="BPE merge operations, or sentencepiece vocabulary size; 32000 is "
        f"the papers' tensor2tensor 32k vocabulary, fairseq's prepare-wmt14en2{tgt}.sh uses 40000",
        ratio="1.5",  # as fairseq's prepare-wmt14en2{de,fr}.sh
        tokens_per_update=32768,
        max_update=papers_budget(100000, 300000),
        detok="moses",
        compound_split=tgt == "de",  # the WMT'14 EN-DE convention
    )


NEWS_COMMENTARY = Published("training-parallel-nc-v9.tgz", "http://statmt.org/wmt14/training-parallel-nc-v9.tgz")

WMT14_EN_DE = wmt14(
    "de", "German",
    train=[("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en", ""),
           ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en", ""),
           ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en", "")],
    dev_sets=["newstest2013"],
    extra_files=[NEWS_COMMENTARY],
)

WMT14_EN_FR = wmt14(
    "fr", "French",
    train=[("training-parallel-europarl-v7.tgz", "training/europarl-v7.fr-en", ""),
           ("training-parallel-commoncrawl.tgz", "commoncrawl.fr-en", ""),
           ("training-parallel-un.tgz", "un/undoc.2000.fr-en", ""),
           ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.fr-en", ""),
           ("training-giga-fren.tar", "giga-fren.release2.fixed", ".gz")],
    dev_sets=["newstest2012", "newstest2013"],
    extra_files=[Published("training-parallel-un.tgz", "http://statmt.org/wmt13/training-parallel-un.tgz"),
                 NEWS_COMMENTARY,
                 Published("training-giga-fren.tar", "http://statmt.org/wmt10/training-giga-fren.tar")],
)

DATASETS = {d.name: d for d in (MULTI30K, MULTI30K_EN_FR, IWSLT15_EN_VI, WMT14_EN_DE, WMT14_EN_FR)}

# ------------------------------------------------------------------ your own corpus

CUSTOM = "custom"
LANG_RE = re.compile(r"[a-z]{2,3}(_[A-Za-z0-9]+)?")
LANG_HELP = "a language code of 2-3 lowercase letters (e.g. en, de, vi), optionally with _REGION (e.g. pt_br)"


def custom(src: str = "S", tgt: str = "T", prefixes: Optional[Dict[str, str]] = None) -> Dataset:
    """A corpus of one's own: PREFIX.{src,tgt} per split (``prefixes``: split -> PREFIX),
    raw untokenized text, one sentence per line. Like Multi30k: one joint sentencepiece
    model on train.src + train.tgt, the references kept as given; training pairs with an
    empty side or more than --max-len pieces are dropped. Without ``prefixes``: the
    template that resnmt-prepare custom's --help describes."""
    prefixes = prefixes or {}
    files = tuple(Published(f"{split}.{lang}", "", local=str(Path(f"{prefixes[split]}.{lang}").absolute()))
                  for split in prefixes for lang in (src, tgt))
    return Dataset(
        name=CUSTOM,
        summary="A parallel corpus of your own: --train/--valid/--test PREFIX name the files\n"
        "PREFIX.S and PREFIX.T (raw untokenized text, one sentence per line, UTF-8). One\n"
        "joint sentencepiece model is trained on the training text of both languages, every\n"
        "split is segmented with it and binarized with fairseq-preprocess\n"
        "--joined-dictionary (so --share-all-embeddings works); the valid and test text is\n"
        "kept as given in OUTDIR/raw (the references for sacreBLEU). Training pairs with an\n"
        "empty side or more than --max-len pieces are dropped; valid and test are kept whole.",
        src=src,
        tgt=tgt,
        files=files,
        train=(both("train.{lang}", src, tgt),),
        valid=(both("valid.{lang}", src, tgt),),
        test=(both("test.{lang}", src, tgt),),
        files_help="Files: your own, linked into OUTDIR/orig (their sha256 in OUTDIR/orig/SHA256SUMS).\n"
        "Train a model on it: resnmt-experiment OUTDIR ARCH (or fairseq-train OUTDIR/bin ...).",
        test_help="your test set as given (the references for sacreBLEU), and valid.*",
        subword_methods=("sentencepiece",),
        subword_size=8000,
        subword_min_size=10,
        subword_size_help="sentencepiece vocabulary size (capped at what a small corpus holds, with a line saying so)",
        ratio="0",
    )
