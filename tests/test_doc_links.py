"""Every relative link of README.md, docs/*.md and benchmarks/README.md resolves: the file
exists in the repository and, where the link names a ``#section``, the file has that heading
(GitHub's anchor of it) or an HTML anchor of that name. Every path of the repository a document
cites, in prose, inline code or a command (``resnmt/...``, ``tests/...``, ``benchmarks/...``,
``scripts/...``, ``data-prep/...``, ``docs/...``, ``examples/...``), exists: ``{a,b}`` stands for
both, ``*`` and an upper-case placeholder (``prepare-DATASET.sh``) for any name."""
import glob
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
CITED_PATH = re.compile(r"(?<![\w./~$-])((?:resnmt|tests|benchmarks|scripts|data-prep|docs|examples)/[\w./*{},-]*)")
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]+")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped
    (letters, digits, ``_``, ``-`` and spaces kept), spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set:
    text = path.read_text(encoding="utf-8")
    found, seen = set(), {}
    for line in re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S).splitlines():
        match = HEADING.match(line)
        if match:
            anchor = github_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found | set(HTML_ANCHOR.findall(text))


def relative_links(path: Path):
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto: ...
            yield target


def broken(path: Path, target: str):
    """Why ``target``, a link of ``path``, does not resolve, or None."""
    file, _, anchor = target.partition("#")
    resolved = (path.parent / file).resolve() if file else path
    if REPO_ROOT not in resolved.parents and resolved != REPO_ROOT:
        return f"{target}: outside the repository"
    if not resolved.exists():
        return f"{target}: no such file"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: {resolved.relative_to(REPO_ROOT)} has no section #{anchor}"
    return None


def expand_braces(path: str) -> list:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (nested and repeated braces too)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(",")
            for p in expand_braces(path[:match.start()] + alt + path[match.end():])]


def cited_paths(path: Path):
    """(line number, path) of every repository path the document names."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in CITED_PATH.finditer(line):
            yield number, match.group(1).rstrip(".,")


def missing_path(cited: str):
    """Why ``cited`` names nothing in the repository, or None."""
    for path in expand_braces(cited):
        pattern = PLACEHOLDER.sub("*", path)
        if not glob.glob(str(REPO_ROOT / pattern)):
            return f"{cited}: no such path in the repository"
    return None


def test_anchors_are_githubs():
    assert github_anchor("Methods that cross layers: residual streams") == "methods-that-cross-layers-residual-streams"
    assert github_anchor("DeepNorm (`--residual deepnorm`, `transformer_deepnorm_{base,big}`)") == (
        "deepnorm---residual-deepnorm-transformer_deepnorm_basebig")
    assert github_anchor("Base size (6+6, d=512, GPU)") == "base-size-66-d512-gpu"


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO_ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n## Two words\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text("[ok](a.md#two-words) [bad](a.md#three) [gone](c.md) `[code](d.md)` [self](#here)\n",
                   encoding="utf-8")
    assert [broken(doc, t) for t in relative_links(doc)] == [
        None, "a.md#three: a.md has no section #three", "c.md: no such file", "#here: b.md has no section #here"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_resolves(path):
    problems = [problem for target in relative_links(path) if (problem := broken(path, target))]
    assert not problems, "\n".join(problems)


def test_a_cited_path_that_does_not_exist_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO_ROOT", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("", encoding="utf-8")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "prepare-x.sh").write_text("", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text("`tests/test_a.py::test_one`, tests/test_{a,b}.py and scripts/prepare-NAME.sh.\n"
                   "```bash\npython tests/test_c.py  # runs/x/y.pt is not the repository's\n```\n"
                   "tests/*.py, scripts/gone/\n", encoding="utf-8")
    assert [(n, p, missing_path(p)) for n, p in cited_paths(doc) if missing_path(p)] == [
        (1, "tests/test_{a,b}.py", "tests/test_{a,b}.py: no such path in the repository"),
        (3, "tests/test_c.py", "tests/test_c.py: no such path in the repository"),
        (5, "scripts/gone/", "scripts/gone/: no such path in the repository")]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_cited_path_exists(path):
    problems = [f"line {n}: {why}" for n, cited in cited_paths(path) if (why := missing_path(cited))]
    assert not problems, "\n".join(problems)


GENERATED = re.compile(r"^<!-- ([\w-]+):begin -->$.*?^<!-- \1:end -->$", re.M | re.S)
LAB_TALK = re.compile(r"\bsessions?\b|\bleases?\b|working (?:hours?|days?)|\bGPU (?:time )?slots?\b|\bGPU job\b"
                      r"|gpu_job\.sh|gpu-bundle|\bparts? \d|\b20\d\d-\d\d-\d\d\b", re.I)
GUIDES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_guides_speak_of_the_users_task_not_the_labs(path):
    """README and docs/ say how to do a thing and what it costs; how the lab runs its GPU job,
    its parts and its plans are benchmarks/README.md's (generated tables, which carry their
    runs' times, aside). docs/benchmarks.md and docs/study.md stay guides of at most 400 lines."""
    text = GENERATED.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text(encoding="utf-8"))
    found = [f"line {n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), 1) if LAB_TALK.search(line)]
    assert not found, "\n".join(found)
    if path.name in ("benchmarks.md", "study.md"):
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 400
