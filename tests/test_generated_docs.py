"""Every generated table and generated line of README.md and docs/*.md is what its generator
writes from the committed results, byte for byte: each document holding a marker of
benchmarks/make_tables.py is copied, rewritten by ``make_tables.py --write`` from
benchmarks/results/ and compared with the committed file; every ``<!-- NAME:begin -->`` marker
of the documents belongs to make_tables.py or to benchmarks/kind_table.py (whose tables
tests/test_kind_table.py compares with the registry)."""
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH = REPO_ROOT / "benchmarks"
RESULTS = BENCH / "results"
DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
BEGIN = re.compile(r"^<!-- ([\w-]+):begin -->$", re.M)


def lab_module(name: str):
    """A generator of the lab folder (benchmarks/), imported as its commands import it."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return __import__(name)


def table_writer():
    """The tables' generator: its markers (name -> begin, end) and its command-line entry point."""
    make_tables = lab_module("make_tables")

    return make_tables.MARKERS, make_tables.main


def holders(markers) -> list:
    """The documents holding at least one of ``markers``' begin lines."""
    return [d for d in DOCUMENTS if any(begin in d.read_text(encoding="utf-8") for begin, _ in markers.values())]


def regenerated(documents, tmp_path: Path, capsys) -> dict:
    """Each document's text as make_tables.py --write leaves it, from the committed results."""
    _, write = table_writer()
    copies = {}
    for doc in documents:
        copy = tmp_path / doc.relative_to(REPO_ROOT).as_posix().replace("/", "__")
        shutil.copyfile(doc, copy)
        copies[doc] = copy
    argv = ["--results", str(RESULTS)]
    for copy in copies.values():
        argv += ["--write", str(copy)]
    assert write(argv) == 0
    capsys.readouterr()  # the tables it prints
    return {doc: copy.read_bytes() for doc, copy in copies.items()}


def test_every_generated_table_and_line_is_its_results_byte_for_byte(tmp_path, capsys):
    markers, _ = table_writer()
    documents = holders(markers)
    assert {REPO_ROOT / "README.md", REPO_ROOT / "docs" / "study.md", REPO_ROOT / "docs" / "benchmarks.md"} <= set(
        documents)
    stale = [doc.relative_to(REPO_ROOT).as_posix() for doc, text in regenerated(documents, tmp_path, capsys).items()
             if text != doc.read_bytes()]
    assert not stale, f"regenerate with: python benchmarks/make_tables.py {' '.join('--write ' + s for s in stale)}"


def test_every_marker_of_the_documents_has_a_generator():
    markers, _ = table_writer()
    generated = {re.match(r"<!-- (.+):begin -->", begin).group(1) for begin, _ in markers.values()}
    found = {name: doc.relative_to(REPO_ROOT).as_posix() for doc in DOCUMENTS
             for name in BEGIN.findall(doc.read_text(encoding="utf-8"))}
    assert {"glance-table", "speed-glance", "pairs-glance", "pairs-table", "curves-table", "cross-layer-table",
            "gen2025-table", "speed-table", "gpu-train-table", "fp16-table", "fp16-headroom-table"} <= set(found)
    orphans = {name: doc for name, doc in found.items() if name not in generated | set(lab_module("kind_table").TABLES)}
    assert not orphans, orphans


def test_a_table_that_differs_from_its_results_is_found(tmp_path, capsys, monkeypatch):
    """The check fails on a hand-edited generated line (a verdict turned around)."""
    study = REPO_ROOT / "docs" / "study.md"
    text = study.read_text(encoding="utf-8")
    inside = text[text.index("<!-- glance-table:begin -->"):text.index("<!-- glance-table:end -->")]
    row = next(line for line in inside.splitlines() if line.endswith("| no (1 seed) |"))
    edited = tmp_path / "docs" / "study.md"
    edited.parent.mkdir()
    edited.write_text(text.replace(row, row[:-len("| no (1 seed) |")] + "| yes (1 seed) |"), encoding="utf-8")
    monkeypatch.setattr(__import__(__name__), "REPO_ROOT", tmp_path)
    (result,) = regenerated([edited], tmp_path, capsys).values()
    assert result != edited.read_bytes() and result == study.read_bytes()
