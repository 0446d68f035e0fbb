"""Every sentence of README.md and docs/*.md that claims a checked fact (it says "tested",
"equal(s)", "exactly", "bit for bit", or gives a tolerance: "to 1e-6", "within 2^-7", an
atol/rtol) names the test that checks it as ``tests/test_x.py::test_name``, and every test a
document names exists. Generated tables (between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->``) are left out: they are checked against their results
(tests/test_generated_docs.py)."""
import ast
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "benchmarks" / "README.md"]

CLAIM = re.compile(
    r"\btested\b|\bequals?\b|\bexactly\b|\bbit[ -]for[ -]bit\b|\b[ar]tol\b|\btolerances?\b"
    r"|\b(?:to|within) (?:\d+(?:\.\d+)?e-\d+|2\^-\d+)\b", re.I)
NAMED_TEST = re.compile(r"\b(tests/[\w/.-]+\.py)::([\w:]+)")
GENERATED = re.compile(r"^<!-- ([\w-]+):begin -->$.*?^<!-- \1:end -->$", re.M | re.S)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*`\[])")
ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s")


def units(text: str):
    """The prose of a document as (line number, text) units: each table row, each heading,
    and each sentence of a paragraph or list item; fenced code and generated tables left out."""
    def blank(match):
        return "\n" * match.group(0).count("\n")

    text = FENCE.sub(blank, GENERATED.sub(blank, text))
    block, start = [], 0

    def flush():
        joined = " ".join(line.strip() for line in block)
        for sentence in SENTENCE_END.split(joined):
            if sentence.strip():
                yield start, sentence.strip()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#", "<!--")) or ITEM.match(line):
            yield from flush()
            block = []
            if stripped.startswith(("|", "#")):
                yield number, stripped
                continue
            if not stripped or stripped.startswith("<!--"):
                continue
        if not block:
            start = number
        block.append(line)
    yield from flush()


def claim_words(unit: str):
    """The claim words of a unit, inline code left out (a flag is not a claim)."""
    return [m.group(0) for m in CLAIM.finditer(re.sub(r"`[^`\n]*`", "", unit))]


def functions_of(path: Path) -> set:
    """``name`` and ``Class::name`` of every function of a test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def missing_test(file: str, name: str):
    """Why ``file::name`` names no test, or None."""
    path = REPO_ROOT / file
    if not path.is_file():
        return f"{file}::{name}: no such file"
    if not name.split("::")[-1].startswith("test") or name not in functions_of(path):
        return f"{file}::{name}: {file} has no test of that name"
    return None


def problems(path: Path) -> list:
    """Each claim without a named test, and each named test that does not exist, in ``path``."""
    found = []
    for line, unit in units(path.read_text(encoding="utf-8")):
        named = NAMED_TEST.findall(unit)
        words = claim_words(unit)
        if words and not named:
            found.append(f"line {line}: claims ({', '.join(words)}) without naming its test: {unit[:160]}")
        found += [f"line {line}: {why}" for file, name in named if (why := missing_test(file, name))]
    return found


def test_a_claim_without_its_test_and_a_test_that_does_not_exist_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO_ROOT", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_one():\n    pass\n\n\nclass TestB:\n"
                                                  "    def test_two(self):\n        pass\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\nIt equals fairseq (`tests/test_a.py::test_one`). It is tested\n"
        "on two lines. A flag `--exactly` is no claim. Within 1e-6 (tests/test_a.py::TestB::test_two).\n\n"
        "- post-LN is exactly fairseq (tests/test_a.py::test_gone).\n"
        "- bit for bit, `tests/test_b.py::test_one`.\n\n"
        "| claim | test |\n|---|---|\n| rtol 1e-5 | none |\n\n"
        "```\nexactly in code\n```\n<!-- t:begin -->\nequal in a generated table\n<!-- t:end -->\n"
        "Some words, no claim.\n", encoding="utf-8")
    assert problems(doc) == [
        "line 3: claims (tested) without naming its test: It is tested on two lines.",
        "line 6: tests/test_a.py::test_gone: tests/test_a.py has no test of that name",
        "line 7: tests/test_b.py::test_one: no such file",
        "line 11: claims (rtol) without naming its test: | rtol 1e-5 | none |"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_claim_names_a_test_that_exists(path):
    found = problems(path)
    assert not found, f"{path.relative_to(REPO_ROOT)}:\n" + "\n".join(found)


def test_the_readmes_command_table_lists_every_command_once():
    """README's "Commands" table: each console script of setup.py, each script of scripts/ and
    data-prep/, and each make target a user runs, in exactly one row (a script by its own name
    or, for data-prep/'s per-dataset wrappers, as prepare-DATASET.sh)."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Commands\n"):]
    rows = [line for line in section[:section.index("\n## ")].splitlines() if line.startswith("| ")][1:]
    setup = (REPO_ROOT / "setup.py").read_text(encoding="utf-8")
    commands = re.findall(r'"(resnmt-[\w-]+)=', setup)
    assert len(commands) >= 7
    commands += [f"scripts/{p.name}" for p in sorted((REPO_ROOT / "scripts").iterdir()) if p.suffix in (".sh", ".py")]
    commands += ["data-prep/prepare.sh", "data-prep/prepare-DATASET.sh", "make demo", "make test", "make test-slow",
                 "make bench", "-m resnmt.cli.arch_table"]
    assert all(p.name == "prepare.sh" or p.name.startswith("prepare-") for p in (REPO_ROOT / "data-prep").glob("*.sh"))

    def named(command, row):
        spans = [re.sub(r"^python ", "", s) for s in re.findall(r"`([^`]*)`", row)]
        return any(s == command or s.startswith(command + " ") for s in spans)

    counts = {c: sum(named(c, row) for row in rows) for c in commands}
    assert all(n == 1 for n in counts.values()), {c: n for c, n in counts.items() if n != 1}
    train_rows = [row for row in rows if named("resnmt-train", row) or named("scripts/train.sh", row)]
    assert "wraps" in train_rows[0] or "fairseq-train with" in train_rows[0]
    assert "preset experiment" in train_rows[1]
