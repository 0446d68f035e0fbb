"""resnmt-prepare (resnmt/cli/prepare.py, through the data-prep/prepare-*.sh wrappers) end to end
through --mirror: real Multi30k and IWSLT'15 test sets, miniature WMT'14 mirrors with the
published archive names and layout; and resnmt-prepare custom on a slice of real Multi30k.

Checks the outputs against the inputs (line counts, checksums, references byte for
byte, reversible segmentation, the binarized data as fairseq loads it), failures
(bad options, missing tools, wrong checksums, corrupt archives, a failed step) and
that a second run does no work.
"""
import functools
import gzip
import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from conftest import BIN_DIR, REPO_ROOT, cli_env, run_cli, shared_data_dir
from data_prep_mirror import PLANTED_BAD, build_iwslt_mirror, build_wmt14_mirror, custom_args, write_corpus
from model_utils import TINY

from resnmt.cli import prepare as prepare_cli
from resnmt.data.manifest import read_manifest

DATA_PREP = REPO_ROOT / "data-prep"
SCRIPTS = ["prepare-multi30k.sh", "prepare-iwslt15-en-vi.sh", "prepare-wmt14-en-de.sh", "prepare-wmt14-en-fr.sh"]


def prepare(script, *args, check=True, **env):
    return run_cli(["bash", DATA_PREP / script, *args], check=check, timeout=600, **env)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def lines(path: Path) -> list:
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def spm_decode(model: Path, path: Path) -> list:
    """The sentencepiece pieces of `path` decoded back into text, line by line."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.decode(x.split()) for x in lines(path)]


def outdir_state(out: Path) -> dict:
    """Every path under OUTDIR (hidden ones, directories and OUTDIR itself included): its
    modification time, and a file's size and sha256; a run that writes nothing leaves it as it was."""
    paths = [out, *sorted(out.rglob("*"))]
    return {p: (p.stat().st_mtime_ns, *((p.stat().st_size, sha256(p)) if p.is_file() and not p.is_symlink() else ()))
            for p in paths}


def check_binarized(out: Path, src: str, tgt: str, expected_counts: dict):
    """bin/ loads in fairseq: joined dictionary, TranslationTask datasets, and every
    sentence equal to the segmented text it came from."""
    from fairseq.data import Dictionary, data_utils
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    bin_dir = out / "bin"
    assert (bin_dir / f"dict.{src}.txt").read_bytes() == (bin_dir / f"dict.{tgt}.txt").read_bytes(), \
        "dictionaries differ: not a joined dictionary"
    d = Dictionary.load(str(bin_dir / f"dict.{src}.txt"))
    for split, n in expected_counts.items():
        for lang in (src, tgt):
            ds = data_utils.load_indexed_dataset(str(bin_dir / f"{split}.{src}-{tgt}.{lang}"), d)
            assert ds is not None, f"{split}.{lang} missing in {bin_dir}"
            text = lines(out / "text" / f"{split}.{lang}")
            assert len(ds) == len(text) == n, (split, lang, len(ds), len(text), n)
            assert ds.sizes.tolist() == [len(x.split()) + 1 for x in text]  # tokens + </s>
            for i in sorted(set(range(0, n, max(1, n // 300))) | {n - 1}):
                expected = d.encode_line(text[i], add_if_not_exist=False, append_eos=True).long()
                assert ds[i].tolist() == expected.tolist(), (split, lang, i)
    cfg = TranslationConfig(data=str(bin_dir), source_lang=src, target_lang=tgt,
                            dataset_impl="mmap", required_seq_len_multiple=1)
    task = TranslationTask.setup_task(cfg)
    for split, n in expected_counts.items():
        task.load_dataset(split)
        assert len(task.dataset(split)) == n
    assert task.source_dictionary.symbols == task.target_dictionary.symbols


class HTTPMirror:
    """A local HTTP server for a directory (tests the download path without a network)."""

    def __init__(self, directory: Path):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

        handler = functools.partial(Quiet, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def check_no_work_on_rerun(script, args, out: Path):
    """A second run with nothing to do says so and writes nothing: no file, stamp, lock or
    directory under OUTDIR changes (not even OUTDIR/.stamps/config)."""
    before = outdir_state(out)
    proc = prepare(script, *args, out)
    assert proc.stderr.splitlines()[-1] == \
        f"[{script[:-3]}] nothing to do: {out} is complete (binarized data in {out / 'bin'})", proc.stderr
    assert proc.stderr.count("skipping") >= 5
    assert outdir_state(out) == before


# ----------------------------------------------------------------------- options

def call_prepare(capsys, *args):
    """``(exit status, stdout, stderr)`` of resnmt-prepare ARGS, in-process (each refusal is
    a check before any work; a subprocess would spend its time importing torch)."""
    capsys.readouterr()
    try:
        code = prepare_cli.main([str(a) for a in args])
    except SystemExit as stop:  # argparse's --help
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", ["multi30k", "iwslt15-en-vi", "wmt14-en-de", "wmt14-en-fr", "custom"])
def test_help(name, capsys):
    """Each dataset's help names the installed command (no path into the repository)."""
    code, out, _ = call_prepare(capsys, name, "--help")
    assert code == 0 and out.startswith(f"Usage: resnmt-prepare {name} ")
    words = ["--train", "--source-lang", "--target-lang"] if name == "custom" else ["--mirror", "--checksums"]
    for word in (*words, "--workers", "--bpe-size", "OUTDIR/bin", "OUTDIR/raw/test", "prepared.json"):
        assert word in out, word
    assert "data-prep" not in out


def test_the_wrappers_run_resnmt_prepare():
    """data-prep/prepare-DATASET.sh is resnmt-prepare DATASET (the other wrappers run in the tests below)."""
    proc = prepare("prepare-multi30k.sh", "--help")
    assert proc.stdout.startswith("Usage: resnmt-prepare multi30k [options]")


@pytest.mark.parametrize("script", SCRIPTS)
def test_option_errors(script, tmp_path, capsys):
    name = script[len("prepare-"):-len(".sh")]

    def fails(args, *words, rc=2):
        code, _, err = call_prepare(capsys, name, *args)
        assert code == rc, (args, code, err)
        last = err.rstrip("\n").split("\n")[-1]
        assert last.startswith(f"[prepare-{name}] error: "), err  # the error is the last line
        for w in words:
            assert w in last, (args, w, err)

    out = tmp_path / "out"
    fails(["--frobnicate", out], "unknown option '--frobnicate'")
    fails([], "missing OUTDIR")
    fails([out, tmp_path / "other"], "unexpected argument")
    fails(["--bpe-size", "lots", out], "--bpe-size 'lots': must be an integer >= 1")
    fails(["--workers", "0", out], "--workers '0': must be an integer >= 1")
    fails(["--mirror", tmp_path / "nowhere", out], "--mirror", "nowhere: no such directory")
    fails(["--spm-type", "wordpiece", out], "--spm-type 'wordpiece' is not one of: unigram bpe")
    fails(["--mirror", tmp_path, "--mirror-url", "http://localhost/x", out], "exclude each other")
    if script != "prepare-multi30k.sh":
        fails(["--bpe", "bpe-dropout", out], "--bpe 'bpe-dropout' is not one of: subword-nmt sentencepiece")
    if script.startswith("prepare-wmt14"):
        fails(["--ratio", "0.5", out], "--ratio '0.5' is not allowed")
    assert not out.exists()


def test_overview_and_unknown_dataset(capsys):
    code, out, _ = call_prepare(capsys, "--help")
    assert code == 0 and out.startswith("Usage: resnmt-prepare DATASET [options] OUTDIR")
    assert all(name in out for name in ("multi30k", "multi30k-en-fr", "iwslt15-en-vi", "wmt14-en-de", "wmt14-en-fr", "custom"))
    code, _, err = call_prepare(capsys, "wmt16-en-de", "out")
    assert code == 2 and err.rstrip().split("\n")[-1] == (
        "[resnmt-prepare] error: unknown DATASET 'wmt16-en-de'; choose one of: "
        "multi30k multi30k-en-fr iwslt15-en-vi wmt14-en-de wmt14-en-fr custom")


def test_missing_tool_and_python_module(tmp_path, capsys, monkeypatch):
    """A clear error before any work: no fairseq-preprocess on PATH nor beside this Python;
    the wrappers' Python without resnmt's requirements (here: one started with -S)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", f"{bare}:/usr/bin:/bin")
    monkeypatch.setattr(sys, "executable", str(bare / "python3"))
    out = tmp_path / "out"
    code, _, err = call_prepare(capsys, "wmt14-en-de", "--mirror", tmp_path, out)
    assert code == 1 and err.rstrip().split("\n")[-1].startswith(
        "[prepare-wmt14-en-de] error: 'fairseq-preprocess' not found on PATH nor beside")
    assert not out.exists()
    monkeypatch.undo()

    no_site = tmp_path / "python-without-packages"
    no_site.write_text(f'#!/bin/sh\nexec "{BIN_DIR / "python"}" -S "$@"\n')
    no_site.chmod(0o755)
    proc = prepare("prepare-wmt14-en-de.sh", "--mirror", tmp_path, out, check=False, PYTHON=str(no_site))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"[prepare-wmt14-en-de] error: python module(s) missing in {no_site}: ")
    assert "torch fairseq (install resnmt" in proc.stderr
    assert not out.exists()


def test_missing_python_module_is_named(tmp_path, capsys, monkeypatch):
    """A text library this dataset needs (sacremoses for WMT's Moses tokenization) missing:
    one line naming it, before any work."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sacremoses" else real_find_spec(name, *a))
    out = tmp_path / "out"
    code, _, err = call_prepare(capsys, "wmt14-en-de", "--mirror", tmp_path, out)
    assert code == 1 and "python module(s) missing in" in err and ": sacremoses (pip install resnmt" in err
    assert not out.exists()


# ---------------------------------------------------------------------- Multi30k

@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi30k") / "out"
    mirror = shared_data_dir("multi30k")
    proc = prepare("prepare-multi30k.sh", "--mirror", mirror, out)
    return out, mirror, proc


def test_multi30k_full_corpus(multi30k):
    out, mirror, proc = multi30k
    published = {f: sha256(mirror / f) for f in os.listdir(mirror) if f.endswith(".gz")}
    assert len(published) == 6
    assert proc.stderr.count("sha256 OK") == 6  # all six pinned and verified
    recorded = dict(reversed(line.split("  ")) for line in lines(out / "orig" / "SHA256SUMS"))
    assert recorded == published

    for split, name in (("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("en", "de"):
            raw = (out / "raw" / f"{split}.{lang}").read_bytes()
            assert raw == gzip.decompress((mirror / f"{name}.{lang}.gz").read_bytes()), (split, lang)
    assert (out / "spm" / "spm.model").is_file()
    check_binarized(out, "en", "de", {"train": 29000, "valid": 1014, "test": 1000})

    # sentencepiece segmentation is reversible: decoding gives back the raw reference
    decoded = spm_decode(out / "spm" / "spm.model", out / "text" / "test.de")
    assert decoded == [" ".join(x.split()) for x in lines(out / "raw" / "test.de")]
    n_types = len(lines(out / "bin" / "dict.en.txt"))
    assert 7000 < n_types <= 8000  # joint 8k vocabulary
    manifest = read_manifest(out / "bin")  # OUTDIR/bin names its OUTDIR, as fairseq-generate's DATA does
    assert (manifest.directory, manifest.dataset, manifest.source_lang, manifest.target_lang) == \
        (out, "multi30k", "en", "de")
    assert (manifest.subword, manifest.subword_model, manifest.detok) == ("sentencepiece", "spm/spm.model", "none")
    assert manifest.reference() == out / "raw" / "test.de"


def test_multi30k_second_run_does_nothing(multi30k):
    out, mirror, _ = multi30k
    check_no_work_on_rerun("prepare-multi30k.sh", ["--mirror", mirror], out)
    # a directory prepared before the manifest existed gets one, and nothing else changes
    (out / "prepared.json").unlink()
    before = outdir_state(out)
    assert "nothing to do" in prepare("prepare-multi30k.sh", "--mirror", mirror, out).stderr
    after = outdir_state(out)
    assert {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)} == {out, out / "prepared.json"}
    assert read_manifest(out).subword == "sentencepiece"
    check_no_work_on_rerun("prepare-multi30k.sh", ["--mirror", mirror], out)
    proc = prepare("prepare-multi30k.sh", "--mirror", mirror, "--bpe-size", "4000", out, check=False)
    assert proc.returncode == 1
    assert "prepared with other options" in proc.stderr and "--bpe-size=8000" in proc.stderr


def test_second_run_on_the_same_outdir_is_refused(tmp_path):
    """While one run holds OUTDIR's lock, another is refused before touching anything."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = prepare("prepare-multi30k.sh", "--mirror", shared_data_dir("multi30k"), out, check=False)
    assert proc.returncode == 1
    assert f"another prepare run is using {out}" in proc.stderr
    assert [p.name for p in out.iterdir()] == [".lock"]


def test_multi30k_checksum_mismatch(tmp_path):
    """A mirror file that is not the published one is refused, naming it; no bin/."""
    mirror = tmp_path / "mirror"
    shutil.copytree(shared_data_dir("multi30k"), mirror)
    data = bytearray((mirror / "val.en.gz").read_bytes())
    data[-9] ^= 1  # flip a bit of the gzip trailer
    (mirror / "val.en.gz").write_bytes(bytes(data))
    out = tmp_path / "out"
    proc = prepare("prepare-multi30k.sh", "--mirror", mirror, out, check=False)
    assert proc.returncode == 1
    assert "checksum mismatch for val.en.gz" in proc.stderr
    assert "pinned in resnmt's table of multi30k" in proc.stderr
    assert not (out / "bin").exists()

    shutil.copy(shared_data_dir("multi30k") / "val.en.gz", mirror / "val.en.gz")
    (mirror / "test_2016_flickr.de.gz").unlink()
    proc = prepare("prepare-multi30k.sh", "--mirror", mirror, tmp_path / "out2", check=False)
    assert proc.returncode == 1 and "test_2016_flickr.de.gz not found in mirror" in proc.stderr


# ---------------------------------------------------------------------- IWSLT'15

@pytest.fixture(scope="module")
def iwslt_mirror(tmp_path_factory):
    return build_iwslt_mirror(tmp_path_factory.mktemp("iwslt_mirror"))


@pytest.mark.slow  # subword-nmt is tested by test_wmt14_en_de, IWSLT's files by the sentencepiece test
def test_iwslt15_bpe(iwslt_mirror, tmp_path):
    out = tmp_path / "out"
    args = ["--mirror", iwslt_mirror, "--bpe-size", "500"]
    proc = prepare("prepare-iwslt15-en-vi.sh", *args, out)
    assert proc.stderr.count("sha256 OK") == 4  # tst2012/tst2013 pinned
    assert "train.en: sha256" in proc.stderr and "not pinned" in proc.stderr
    real = shared_data_dir("iwslt15-en-vi")
    for split, name in (("valid", "tst2012"), ("test", "tst2013")):
        for lang in ("en", "vi"):
            assert (out / "raw" / f"{split}.{lang}").read_bytes() == (real / f"{name}.{lang}").read_bytes()
            # BPE only splits words: removing the separators gives back the published text
            joined = [x.replace("@@ ", "") for x in lines(out / "text" / f"{split}.{lang}")]
            assert joined == [" ".join(x.split()) for x in lines(real / f"{name}.{lang}")]
    assert "&apos;" in (out / "text" / "test.en").read_text() and "&quot;" in (out / "text" / "test.vi").read_text()
    assert (out / "bpe" / "bpe.codes").is_file()
    check_binarized(out, "en", "vi", {"train": 1553, "valid": 1553, "test": 1268})
    check_no_work_on_rerun("prepare-iwslt15-en-vi.sh", args, out)



@pytest.fixture()
def iwslt_http(iwslt_mirror):
    server = HTTPMirror(iwslt_mirror)
    yield server.url
    server.close()


def test_iwslt15_sentencepiece_download_resume_after_a_failed_step(iwslt_http, tmp_path):
    """Downloads (from a local HTTP server) are verified and renamed into place;
    fairseq-preprocess fails once (a stand-in that exits 1): no bin/, a message
    naming the step; the same command then resumes without redoing finished steps."""
    out = tmp_path / "out"
    args = ["--mirror-url", iwslt_http, "--bpe", "sentencepiece", "--bpe-size", "500", "--max-train-lines", "1000"]
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    (broken / "fairseq-preprocess").write_text("#!/bin/sh\necho 'simulated failure' >&2\nexit 1\n")
    (broken / "fairseq-preprocess").chmod(0o755)
    proc = prepare("prepare-iwslt15-en-vi.sh", *args, out, check=False,
                   PATH=f"{broken}:{BIN_DIR}:{os.environ['PATH']}")
    assert proc.returncode == 1
    assert "fairseq-preprocess failed" in proc.stderr and "failed in step 6/6" in proc.stderr
    assert f"tst2013.vi: downloading {iwslt_http}/tst2013.vi" in proc.stderr
    assert proc.stderr.count("sha256 OK") == 4
    real = shared_data_dir("iwslt15-en-vi")
    assert (out / "orig" / "tst2013.vi").read_bytes() == (real / "tst2013.vi").read_bytes()
    assert not (out / "orig" / "tst2013.vi").is_symlink() and not list(out.rglob("*.part"))
    assert not (out / "bin").exists()
    assert not list(out.glob(".tmp*")) and not list(out.rglob("*.tmp"))
    # --max-train-lines 1000, then pairs longer than 250 pieces (a 500-piece vocabulary) dropped
    n_train = len(lines(out / "text" / "train.en"))
    assert 980 <= n_train < 1000 and f"kept {n_train:,} of 1,000 pairs" in proc.stderr

    # and a lost output is noticed: its step and the later ones are redone
    (out / "text" / "test.vi").unlink()
    proc = prepare("prepare-iwslt15-en-vi.sh", *args, out)
    assert "step 4/6: done earlier, but its output is missing: text/test.vi" in proc.stderr
    assert proc.stderr.count(": done, skipping") == 3  # fetch, copy, learn
    assert "step 6/6: fairseq-preprocess" in proc.stderr
    check_binarized(out, "en", "vi", {"train": n_train, "valid": 1553, "test": 1268})
    decoded = spm_decode(out / "spm" / "spm.model", out / "text" / "test.vi")
    assert "".join(x + "\n" for x in decoded).encode() == (out / "raw" / "test.vi").read_bytes()


def test_iwslt15_failed_and_corrupt_downloads(iwslt_mirror, tmp_path):
    served = tmp_path / "served"
    shutil.copytree(iwslt_mirror, served)
    server = HTTPMirror(served)
    try:
        (served / "tst2012.vi").unlink()  # 404
        out = tmp_path / "out1"
        proc = prepare("prepare-iwslt15-en-vi.sh", "--mirror-url", server.url, out, check=False)
        assert proc.returncode == 1
        assert f"download of {server.url}/tst2012.vi failed" in proc.stderr
        assert not (out / "orig" / "tst2012.vi").exists() and not (out / "bin").exists()

        shutil.copy(iwslt_mirror / "tst2013.en", served / "tst2012.vi")  # not the published bytes
        proc = prepare("prepare-iwslt15-en-vi.sh", "--mirror-url", server.url, out, check=False)
        assert proc.returncode == 1
        assert "checksum mismatch for tst2012.vi" in proc.stderr and "kept as" in proc.stderr
        assert (out / "orig" / "tst2012.vi.part.bad").is_file()
        assert not (out / "orig" / "tst2012.vi").exists() and not (out / "bin").exists()
        assert "train.en: already downloaded" in proc.stderr  # finished downloads are kept
    finally:
        server.close()


# ------------------------------------------------------------------------ WMT'14

def desegment(out: Path, path: Path) -> list:
    """The segmented text of `path` joined back into tokens (BPE) or text (sentencepiece)."""
    if (out / "bpe" / "bpe.codes").is_file():
        return [x.replace("@@ ", "") for x in lines(path)]
    return spm_decode(out / "spm" / "spm.model", path)


def check_wmt(out: Path, tgt: str, info: dict, n_train_max: int):
    assert lines(out / "raw" / "test.en") == info["test"][0]
    assert lines(out / "raw" / f"test.{tgt}") == info["test"][1]
    assert lines(out / "raw" / "valid.en") == info["valid"][0]
    assert lines(out / "raw" / f"valid.{tgt}") == info["valid"][1]
    train_en, train_tg = lines(out / "text" / "train.en"), lines(out / "text" / f"train.{tgt}")
    assert 0.8 * n_train_max < len(train_en) <= n_train_max - len(PLANTED_BAD)
    for e, t in zip(train_en, train_tg):  # the cleaning invariants
        ne, nt = len(e.split()), len(t.split())
        assert 1 <= ne <= 250 and 1 <= nt <= 250 and ne <= 1.5 * nt and nt <= 1.5 * ne
    # Moses tokenization with escaping and aggressive hyphen splitting
    test_en = desegment(out, out / "text" / "test.en")
    assert test_en[3].endswith(" &amp; amp ; R &amp; D")
    assert any(" @-@ " in x for x in desegment(out, out / "text" / f"train.{tgt}"))
    check_binarized(out, "en", tgt, {"train": len(train_en), "valid": len(info["valid"][0]),
                                     "test": len(info["test"][0])})


@pytest.fixture(scope="module")
def wmt_de_mirror(tmp_path_factory):
    mirror = tmp_path_factory.mktemp("wmt14_en_de_mirror")
    return mirror, build_wmt14_mirror(mirror, "de")


def test_wmt14_en_de(wmt_de_mirror, tmp_path):
    mirror, info = wmt_de_mirror
    out = tmp_path / "out"
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("".join(f"{sha256(mirror / f)}  {f}\n" for f in info["files"]))
    args = ["--mirror", mirror, "--bpe-size", "500", "--checksums", sums]
    proc = prepare("prepare-wmt14-en-de.sh", *args, out)
    assert proc.stderr.count("sha256 OK") == 5
    assert sorted(lines(out / "orig" / "SHA256SUMS")) == sorted(lines(sums))
    check_wmt(out, "de", info, len(info["train_pairs"]))
    assert (out / "bpe" / "bpe.codes").is_file() and not (out / "work").exists()
    # raw/test.* are byte for byte sacreBLEU's own conversion of the SGM files (wmt14/full)
    from sacrebleu.dataset import DATASETS

    with tarfile.open(mirror / "test-full.tgz") as tar:
        tar.extractall(tmp_path / "sgm", filter="data")
    for lang, role in (("en", "src.en"), ("de", "ref.de")):
        converted = tmp_path / f"sacrebleu.{lang}"
        DATASETS["wmt14/full"]._convert_format(str(tmp_path / "sgm" / "test-full" / f"newstest2014-deen-{role}.sgm"),
                                                str(converted))
        assert (out / "raw" / f"test.{lang}").read_bytes() == converted.read_bytes()
    check_no_work_on_rerun("prepare-wmt14-en-de.sh", args, out)


def test_wmt14_wrong_checksum_and_corrupt_archive(wmt_de_mirror, tmp_path):
    mirror, info = wmt_de_mirror
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("".join(f"{'0' * 64 if f == 'dev.tgz' else sha256(mirror / f)}  {f}\n" for f in info["files"]))
    out = tmp_path / "out1"
    proc = prepare("prepare-wmt14-en-de.sh", "--mirror", mirror, "--checksums", sums, "--bpe-size", "500", out,
                   check=False)
    assert proc.returncode == 1
    assert f"checksum mismatch for dev.tgz ({mirror}/dev.tgz)" in proc.stderr
    assert f"expected {'0' * 64} (--checksums {sums})" in proc.stderr
    assert not (out / "bin").exists()

    corrupt = tmp_path / "corrupt"
    shutil.copytree(mirror, corrupt)
    archive = corrupt / "training-parallel-nc-v9.tgz"
    archive.write_bytes(archive.read_bytes()[:2000])  # a truncated download
    out = tmp_path / "out2"
    proc = prepare("prepare-wmt14-en-de.sh", "--mirror", corrupt, "--bpe-size", "500", out, check=False)
    assert proc.returncode == 1
    assert "cannot extract from" in proc.stderr and "training-parallel-nc-v9.tgz" in proc.stderr
    assert "failed in step 2/8" in proc.stderr
    assert not (out / "bin").exists()


def test_wmt14_interrupted_run_leaves_no_partial_file(wmt_de_mirror, tmp_path):
    """SIGTERM to the whole run while it tokenizes: no half-written file survives,
    the finished steps' stamps do, and the message says where it stopped."""
    mirror, _ = wmt_de_mirror
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(DATA_PREP / "prepare-wmt14-en-de.sh"), "--mirror", str(mirror),
                             "--bpe-size", "500", str(out)], cwd=REPO_ROOT, env=cli_env(),
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 60
    while not list((out / "work").glob(".train.tok.en.*.tmp")):  # tokenization is writing (resnmt.atomic)
        assert proc.poll() is None and time.time() < deadline, "the run ended before tokenizing"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert "interrupted in step 4/8 (normalize punctuation and tokenize" in stderr
    assert not list(out.rglob("*.tmp")) and not list(out.glob(".tmp.*"))
    # train.tok.en may exist whole (its rename can come just before the signal, while train.de is
    # tokenized): every output is written atomically, and without step 4's stamp a re-run redoes it
    assert not (out / "bin").exists()
    assert sorted(p.name for p in (out / ".stamps").glob("*.done")) == ["01-fetch.done", "02-extract.done",
                                                                      "03-raw.done"]


def test_wmt14_en_fr_sentencepiece(tmp_path):
    mirror = tmp_path / "mirror"
    info = build_wmt14_mirror(mirror, "fr")
    out = tmp_path / "out"
    proc = prepare("prepare-wmt14-en-fr.sh", "--mirror", mirror, "--bpe", "sentencepiece", "--bpe-size", "600",
                   "--max-train-lines", "100", "--workers", "1", out)
    for f in ("training-parallel-un.tgz", "training-giga-fren.tar", "giga-fren.release2.fixed.fr.gz",
              "un/undoc.2000.fr-en.en", "dev/newstest2012.fr", "newstest2014-fren-ref.fr.sgm"):
        assert f in proc.stderr, f
    assert "valid (newstest2012+newstest2013): 120 pairs" in proc.stderr
    check_wmt(out, "fr", info, 5 * 100)
    assert (out / "spm" / "spm.model").is_file()


# ------------------------------------------------------------------- your own corpus

def test_custom_bad_input_is_one_line_before_any_work(tmp_path, capsys):
    """A missing file, parallel files of different lengths, a language code of the wrong
    shape: one error line (the last) naming the bad value, exit status 2, no OUTDIR."""
    prefixes = write_corpus(tmp_path / "corpus", n_train=20, n_valid=10, n_test=10)
    out = tmp_path / "out"
    short = tmp_path / "short"  # dev with its last German line missing
    Path(f"{short}.en").write_bytes(Path(f"{prefixes['valid']}.en").read_bytes())
    Path(f"{short}.de").write_text("".join(Path(f"{prefixes['valid']}.de").read_text(encoding="utf-8")
                                           .splitlines(keepends=True)[:-1]), encoding="utf-8")
    latin1 = tmp_path / "latin1"  # the German side in Latin-1, not UTF-8
    german = Path(f"{prefixes['train']}.de").read_text(encoding="utf-8").splitlines(keepends=True)
    Path(f"{latin1}.en").write_bytes(Path(f"{prefixes['train']}.en").read_bytes())
    Path(f"{latin1}.de").write_bytes("".join(german[:2]).encode() + "".join(german[2:]).encode("latin-1"))
    bad_byte = len("".join(german[:2]).encode()) + next(i for i, c in enumerate(german[2]) if ord(c) > 127)
    cases = [
        (custom_args({**prefixes, "test": tmp_path / "nowhere"}),
         f"--test {tmp_path / 'nowhere'}: no such readable file {tmp_path / 'nowhere'}.en"),
        (custom_args({**prefixes, "valid": short}), f"--valid {short}: {short}.en has 10 lines but {short}.de has 9"),
        ([*custom_args(prefixes)[:-4], "--source-lang", "english", "--target-lang", "de"],
         "--source-lang 'english' is not a language code of 2-3 lowercase letters (e.g. en, de, vi), "
         "optionally with _REGION (e.g. pt_br)"),
        ([*custom_args(prefixes)[:-4], "--source-lang", "en", "--target-lang", "de-AT"], "--target-lang 'de-AT' is not"),
        ([*custom_args(prefixes)[:-4], "--source-lang", "de", "--target-lang", "de"],
         "--source-lang and --target-lang are both 'de'"),
        (custom_args(prefixes)[2:], "missing --train PREFIX (the files PREFIX.en and PREFIX.de)"),
        (custom_args(prefixes, "--bpe-size", "5"), "--bpe-size '5': must be an integer >= 10"),
        (custom_args({**prefixes, "train": latin1}),
         f"--train {latin1}: {latin1}.de, line 3: not valid UTF-8 at byte {bad_byte} of the file "
         "(invalid continuation byte)"),
    ]
    for args, message in cases:
        code, _, err = call_prepare(capsys, "custom", *args, out)
        last = err.rstrip("\n").split("\n")[-1]
        assert code == 2 and last.startswith("[prepare-custom] error: ") and message in last, (args, err)
    assert not out.exists()


def test_a_small_corpus_prepares_with_the_readmes_command(tmp_path):
    """3,000 pairs hold fewer sentencepiece pieces than the default 8,000: the vocabulary is
    capped at what sentencepiece can learn from them, one line says so, prepared.json
    records the size used; nothing is refused."""
    prefixes = write_corpus(tmp_path / "corpus", n_train=3000, n_valid=100, n_test=100)
    out = tmp_path / "data" / "my-corpus"
    proc = run_cli([BIN_DIR / "resnmt-prepare", "custom", *custom_args(prefixes, "--workers", "1"), out],
                   cwd=tmp_path, timeout=600)
    capped = [line for line in proc.stderr.splitlines() if "capped at" in line]
    import sentencepiece as spm

    size = spm.SentencePieceProcessor(model_file=str(out / "spm" / "spm.model")).get_piece_size()
    assert 1000 < size < 8000
    assert capped == [f"[prepare-custom]   sentencepiece unigram model, {size:,} pieces (--bpe-size 8000 is more than "
                      f"this corpus holds: capped at {size:,}, the most sentencepiece can learn from it)"]
    assert read_manifest(out).subword_size == size
    assert json.loads((out / "prepared.json").read_text())["subword_size"] == size
    check_binarized(out, "en", "de", {"train": 3000, "valid": 100, "test": 100})


def test_a_failed_step_resumes_with_the_option_its_error_names(tmp_path):
    """A vocabulary too small for the corpus's characters fails in the learning step with
    the --bpe-size that works; re-run with it, the run goes on from that step (the finished
    ones kept). Once the step has finished, changing its option is refused, saying how to
    start over."""
    prefixes = write_corpus(tmp_path / "corpus", n_train=300, n_valid=20, n_test=20)
    out = tmp_path / "out"

    def run(size, check=True):
        return run_cli([BIN_DIR / "resnmt-prepare", "custom", *custom_args(prefixes, "--bpe-size", size,
                                                                           "--workers", "1"), out], check=check)

    failed = run("10", check=False)
    last = failed.stderr.rstrip().splitlines()[-1]
    assert failed.returncode == 1 and "Vocabulary size is smaller than required_chars" in last
    needed = re.search(r"\(use --bpe-size (\d+) or more: every character needs a piece\)$", last).group(1)
    assert "failed in step 3/6" in failed.stderr and not (out / "spm" / "spm.model").exists()
    resumed = run(needed).stderr
    assert (f"options changed since the last run (--bpe-size=10 before, --bpe-size={needed} now); no step they "
            "change has finished: going on from step 3 with the new ones") in resumed
    assert resumed.count(": done, skipping") == 2 and read_manifest(out).subword_size == int(needed)
    refused = run(str(int(needed) + 10), check=False)
    assert refused.returncode == 1 and refused.stderr.rstrip().endswith(
        f"was prepared with other options (above): use a new OUTDIR, or delete {out} to start over")
    assert read_manifest(out).subword_size == int(needed)


def test_an_edited_input_is_rebuilt_and_a_touched_one_is_not(tmp_path):
    """An input file edited after its corpus was prepared: the next run names it in one line
    and redoes every step (they all read it), the data and orig/SHA256SUMS then hold its new
    text (resnmt-experiment, before, refuses the old data in one line naming it); an input
    only touched (same bytes) redoes nothing."""
    prefixes = write_corpus(tmp_path / "corpus", n_train=300, n_valid=20, n_test=20)
    out, train_de = tmp_path / "out", Path(f"{prefixes['train']}.de")
    args = [BIN_DIR / "resnmt-prepare", "custom", *custom_args(prefixes, "--bpe-size", "300", "--workers", "1"), out]
    run_cli(args)
    size = train_de.stat().st_size
    text = train_de.read_text(encoding="utf-8").split("\n")
    train_de.write_text("\n".join(["Ein ganz neuer Satz ."] + text[1:]), encoding="utf-8")
    # resnmt-experiment cannot prepare a corpus of one's own again: it refuses, naming the file
    from resnmt.experiment.errors import ExperimentError
    from resnmt.experiment.pipeline import Experiment, ExperimentRequest
    from resnmt.experiment.presets import TrainRequest

    experiment = Experiment(ExperimentRequest(TrainRequest(str(out), "transformer", preset="cpu",
                                                           save_dir=tmp_path / "run")), print, print)
    with pytest.raises(ExperimentError) as refused:
        experiment.prepare()
    assert str(refused.value) == (f"input {train_de} (train.de) changed since it was prepared (size {size} -> "
                                  f"{train_de.stat().st_size}, other sha256): prepare {out} again with the "
                                  "resnmt-prepare custom command that prepared it")
    err = run_cli(args).stderr.splitlines()
    changed = [line for line in err if "changed since" in line]
    assert changed == [f"[prepare-custom] input {train_de} (train.de) changed since it was prepared "
                       f"(size {size} -> {train_de.stat().st_size}, other sha256): redoing steps 1-6"], err
    assert "skipping" not in "\n".join(err) and err[-1].startswith("[prepare-custom] finished in")
    assert spm_decode(out / "spm" / "spm.model", out / "text" / "train.de")[0] == "Ein ganz neuer Satz ."
    assert f"{sha256(train_de)}  train.de" in (out / "orig" / "SHA256SUMS").read_text().splitlines()
    os.utime(train_de, ns=(time.time_ns(), time.time_ns()))
    err = run_cli(args).stderr.splitlines()
    assert f"[prepare-custom] input {train_de} (train.de): modified time changed, same bytes (sha256): " \
           "nothing to redo" in err and err[-1].startswith("[prepare-custom] nothing to do"), err
    experiment.prepare()  # up to date
    # a run that stopped before its end (as one failing after it recorded new inputs): not prepared, whatever bin/ holds
    next(out.glob(".stamps/*-binarize.done")).unlink()
    with pytest.raises(ExperimentError, match=f"^{out} holds no prepared data .* from a resnmt-prepare run that "
                                              "finished"):
        experiment.prepare()


def test_experiment_prepares_a_builtin_dataset_again_when_a_mirror_file_changed(tmp_path, capfd, monkeypatch):
    """resnmt-experiment's prepare step on a built-in dataset prepared before (IWSLT'15
    EN-VI from a mirror, 200 training pairs): skipped without reading a file while the
    mirror is as recorded; a file only touched is recorded anew in one line; an edited one
    is named in one line and the data is prepared again from its new text; --prep-args are
    checked by resnmt-prepare; a file whose sha256 is pinned, edited, is refused,
    resnmt-prepare's error the experiment's."""
    from resnmt.data import fetch
    from resnmt.experiment.errors import ExperimentError
    from resnmt.experiment.pipeline import Experiment, ExperimentRequest
    from resnmt.experiment.presets import TrainRequest

    real, mirror, out = shared_data_dir("iwslt15-en-vi"), tmp_path / "mirror", tmp_path / "data"
    mirror.mkdir()
    for lang in ("en", "vi"):
        (mirror / f"train.{lang}").write_text("".join(x + "\n" for x in lines(real / f"tst2012.{lang}")[:200]),
                                              encoding="utf-8")
        for name in ("tst2012", "tst2013"):
            os.symlink(real / f"{name}.{lang}", mirror / f"{name}.{lang}")
    def request(prep_args=""):
        return ExperimentRequest(train=TrainRequest("iwslt15-en-vi", "transformer", preset="cpu",
                                                    save_dir=tmp_path / "run"),
                                 data_root=out, mirror=mirror, prep_args=prep_args)

    options = "--bpe sentencepiece --bpe-size 300 --workers 1"
    hashed = []
    monkeypatch.setattr(fetch, "sha256_of", lambda path, digest=fetch.sha256_of: hashed.append(path) or digest(path))

    def prepare(prep_args=""):
        """The experiment's lines and resnmt-prepare's, in order; the files it hashed."""
        logged, hashed[:] = [], []
        capfd.readouterr()
        Experiment(request(prep_args), logged.append, logged.append).prepare()
        return logged + capfd.readouterr().err.splitlines(), [p.name for p in hashed]

    printed, _ = prepare(options)
    assert printed[0] == f"step 1/5: prepare {out}" and printed[-1].startswith("[prepare-iwslt15-en-vi] finished")
    assert prepare() == ([f"step 1/5: prepare: {out}/bin exists, skipped"], [])  # nothing read
    train_vi = mirror / "train.vi"
    os.utime(train_vi, ns=(time.time_ns(), time.time_ns()))
    assert prepare() == ([f"input {train_vi} (train.vi): modified time changed, same bytes (sha256): nothing to redo",
                          f"step 1/5: prepare: {out}/bin exists, skipped"], ["train.vi"])
    assert prepare()[1] == []  # recorded anew: not read again

    train_en = mirror / "train.en"
    size, text = train_en.stat().st_size, train_en.read_text(encoding="utf-8").split("\n")
    train_en.write_text("\n".join([text[0], "Edited : " + text[1]] + text[2:]), encoding="utf-8")
    printed, _ = prepare(options)
    assert printed[0] == f"step 1/5: prepare {out} again: an input changed since it was prepared", printed
    assert [line for line in printed if str(train_en) in line] == [  # one line names it
        f"[prepare-iwslt15-en-vi] input {train_en} (train.en) changed since it was prepared "
        f"(size {size} -> {train_en.stat().st_size}, other sha256): redoing steps 1-6"], printed
    assert not [line for line in printed if "skipping" in line] and printed[-1].startswith("[prepare-iwslt15-en-vi] "
                                                                                          "finished")
    decoded = spm_decode(out / "spm" / "spm.model", out / "text" / "train.en")
    assert "Edited : " + text[1] in decoded and text[1] not in decoded
    assert f"{sha256(train_en)}  train.en" in (out / "orig" / "SHA256SUMS").read_text().splitlines()
    check_binarized(out, "en", "vi", {"train": len(lines(out / "text" / "train.en")), "valid": 1553, "test": 1268})
    assert prepare() == ([f"step 1/5: prepare: {out}/bin exists, skipped"], [])
    # --prep-args: resnmt-prepare compares them with those the data was prepared with
    printed, _ = prepare(options)
    assert printed[0] == f"step 1/5: prepare: {out}/bin exists; resnmt-prepare checks it against --prep-args"
    assert printed[-1] == f"[prepare-iwslt15-en-vi] nothing to do: {out} is complete (binarized data in {out}/bin)"
    with pytest.raises(ExperimentError, match=f"^resnmt-prepare iwslt15-en-vi failed: {out} was prepared with other "
                                              "options \\(above\\): use a new OUTDIR"):
        prepare(options.replace("300", "400"))

    # a published file whose hash is pinned, edited: resnmt-prepare refuses it, and so does every later run
    test_vi = mirror / "tst2013.vi"
    test_vi.unlink()
    test_vi.write_text("".join(x + "\n" for x in ["Edited ."] + lines(real / "tst2013.vi")[1:]), encoding="utf-8")
    for _ in range(2):
        with pytest.raises(ExperimentError) as refused:
            prepare(options)
        assert str(refused.value).startswith(f"resnmt-prepare iwslt15-en-vi failed: checksum mismatch for tst2013.vi "
                                             f"({test_vi}): sha256 is {sha256(test_vi)}, expected "), refused.value


@pytest.fixture(scope="module")
def custom_corpus(tmp_path_factory):
    """2000 real Multi30k pairs prepared as a corpus of one's own by the installed
    resnmt-prepare console script: (OUTDIR, {split: PREFIX}, its stderr)."""
    root = tmp_path_factory.mktemp("custom")
    prefixes = write_corpus(root / "corpus")
    out = root / "data" / "my-corpus"
    proc = run_cli([BIN_DIR / "resnmt-prepare", "custom", *custom_args(prefixes, "--bpe-size", "800", "--workers", "1"),
                    out], timeout=600)
    return out, prefixes, proc.stderr


def test_custom_corpus(custom_corpus, tmp_path):
    """Joint sentencepiece model, joined dictionary, the references kept byte for byte, the
    manifest; a second run does nothing, other input files for the same OUTDIR are refused."""
    out, prefixes, err = custom_corpus
    assert "step 1/6: link the 6 files of your corpus" in err and "step 6/6: fairseq-preprocess" in err
    assert "kept 2,000 of 2,000 pairs" in err
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            assert (out / "raw" / f"{split}.{lang}").read_bytes() == Path(f"{prefixes[split]}.{lang}").read_bytes()
    assert (out / "orig" / "train.en").resolve() == Path(f"{prefixes['train']}.en").resolve()
    check_binarized(out, "en", "de", {"train": 2000, "valid": 100, "test": 100})
    decoded = spm_decode(out / "spm" / "spm.model", out / "text" / "test.de")
    assert decoded == [" ".join(x.split()) for x in lines(out / "raw" / "test.de")]
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "spm" / "spm.model"))
    assert sp.get_piece_size() == 800  # --bpe-size
    # fairseq pads the dictionary to a multiple of 8 with madeupwordNNNN
    words = {line.split()[0] for line in lines(out / "bin" / "dict.en.txt") if not line.startswith("madeupword")}
    pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    assert len(words & pieces) > 700  # one joint vocabulary; beside it only characters train never saw
    assert all(len(w.lstrip("▁")) == 1 for w in words - pieces), words - pieces
    manifest = read_manifest(out)
    assert (manifest.dataset, manifest.source_lang, manifest.target_lang, manifest.subword, manifest.detok) == \
        ("custom", "en", "de", "sentencepiece", "none")

    args = ["custom", *custom_args(prefixes, "--bpe-size", "800", "--workers", "1")]
    before = outdir_state(out)
    again = run_cli([BIN_DIR / "resnmt-prepare", *args, out]).stderr
    assert again.splitlines()[-1].startswith("[prepare-custom] nothing to do") and outdir_state(out) == before
    other = dict(prefixes, train=prefixes["valid"])
    refused = run_cli([BIN_DIR / "resnmt-prepare", "custom", *custom_args(other, "--bpe-size", "800"), out],
                      check=False)
    assert refused.returncode == 1 and "prepared with other options" in refused.stderr
    assert f"before: --train={prefixes['train']}" in refused.stderr
    assert refused.stderr.rstrip().endswith(f"use a new OUTDIR, or delete {out} to start over")


def test_custom_corpus_end_to_end(custom_corpus, tmp_path):
    """resnmt-experiment on the prepared directory of one's own corpus: a tiny model
    trained a few dozen updates, its epoch checkpoints averaged, the test set decoded with
    the sentencepiece post-processing the manifest names, and scored against the raw
    references."""
    out, prefixes, _ = custom_corpus
    save_dir, results = tmp_path / "run", tmp_path / "results.jsonl"
    proc = run_cli([BIN_DIR / "resnmt-experiment", out, "transformer_rskip_base", "--preset", "cpu", "--max-epoch", "2",
                    "--max-tokens", "2000", "--save-dir", save_dir, "--results", results, "--average", "2",
                    "--gen-args", "--max-len-b 10", "--", *TINY, "--num-workers", "0", "--no-progress-bar"],
                   cwd=tmp_path, timeout=600)
    assert f"step 1/5: prepare: {out}/bin exists, skipped" in proc.stderr
    printed = (proc.stdout + proc.stderr).splitlines()  # without --verbose: resnmt's lines, not fairseq's INFO
    assert not [line for line in printed if " | INFO | " in line or line.startswith("INFO:")], printed
    assert "[train] epoch 2: train loss " in proc.stdout and "[train] valid loss " in proc.stdout
    assert "step 3/5: average the last 2 epoch checkpoints" in proc.stderr and "decoded 100 sentences" in proc.stderr
    record = json.loads(results.read_text().splitlines()[-1])
    assert (record["dataset"], record["arch"], record["averaged"], record["epochs"]) == \
        ("my-corpus", "transformer_rskip_base", 2, 2)
    # TINY after -- shrinks the named arch: every line naming the run says the size trained
    assert record["size"] == "2+2 layers, d=16, not base" and "transformer_rskip_base (base)" not in proc.stderr
    assert f"step 2/5: train transformer_rskip_base (2+2 layers, d=16, not base) into {save_dir}" in proc.stderr
    assert "my-corpus transformer_rskip_base (2+2 layers, d=16, not base): BLEU " in proc.stdout
    assert record["n_sentences"] == 100 and record["ref"] == str(out / "raw" / "test.de")
    assert 0 <= record["bleu"] <= 100 and record["signature"].startswith("nrefs:1")
    generated = (save_dir / "gen.test.avg2.beam4.lenpen0.6.gen-max-len-b10.out").read_text(encoding="utf-8")
    hypotheses = [line.split("\t")[2] for line in generated.splitlines() if line.startswith("D-")]
    assert len(hypotheses) == 100 and not any("\u2581" in h for h in hypotheses)  # the pieces were joined
    assert generated.splitlines()[-1].startswith("Generate test with beam=4: BLEU4 = ") and \
        generated.splitlines()[-1].endswith("(fairseq's BLEU over its dictionary's tokens: not the papers' score, "
                                            "which resnmt-evaluate gives)")  # one unlabelled score: resnmt's
    train_cmd = (save_dir / "train.cmd").read_text()
    assert f"{out}/bin" in train_cmd and "--source-lang en --target-lang de" in train_cmd

    # the same run with another model flag, then after the corpus was binarized again: refused, one line each
    args = proc.args[:proc.args.index("--encoder-ffn-embed-dim") + 1]
    other = run_cli([*args, "64", *proc.args[len(args) + 1:]], cwd=tmp_path, check=False)
    assert other.returncode == 1 and other.stderr.splitlines()[-1] == (
        f"[resnmt-experiment] error: {save_dir} was trained with other flags (--encoder-ffn-embed-dim 32 then, "
        f"--encoder-ffn-embed-dim 64 now): use another --save-dir (or --tag), or delete {save_dir} to train again; "
        f"or delete {save_dir / 'train.done'} to resume it with these"), other.stderr
    # a data file written again with the same bytes: recorded anew, in one line; with other bytes: refused
    dictionary = out / "bin" / "dict.de.txt"
    os.utime(dictionary, ns=(dictionary.stat().st_atime_ns, dictionary.stat().st_mtime_ns + 10**9))
    touched = run_cli(proc.args, cwd=tmp_path).stderr
    assert (f"[resnmt-experiment] {out / 'bin'}: dict.de.txt written again with the same bytes since {save_dir} was "
            f"trained: its training stands") in touched and f"step 2/5: train: {save_dir}/train.done exists" in touched
    assert "decoded" not in touched and json.loads((save_dir / "train.done").read_text())["data"]["dict.de.txt"][1] \
        == dictionary.stat().st_mtime_ns
    text = dictionary.read_text(encoding="utf-8").split("\n")
    count = text[0].split()[1]
    dictionary.write_text("\n".join([f"{text[0].split()[0]} {int(count) + 1:0{len(count)}d}"] + text[1:]),
                          encoding="utf-8")  # one count one higher, the same size
    reprepared = run_cli(proc.args, cwd=tmp_path, check=False)
    assert reprepared.returncode == 1 and reprepared.stderr.splitlines()[-1] == (
        f"[resnmt-experiment] error: {save_dir} was trained on {out / 'bin'} before dict.de.txt changed (the corpus "
        f"was prepared again): use another --save-dir (or --tag), or delete {save_dir} to train again")
