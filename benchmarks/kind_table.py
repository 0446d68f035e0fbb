"""Print (or write) the tables of connection kinds, generated from the registry.

    python benchmarks/kind_table.py            # the README's table, in markdown
    python benchmarks/kind_table.py --write    # rewrite every committed copy

Each kind class carries its ``equation``, ``note``, ``source`` and ``flags``
(:mod:`resnmt.connections`); the tables are made of them, in registry order:
the README's ``--residual`` table, docs/connections.md's table with each kind's flags,
and the plain-text table of the connections package's docstring. ``--write`` replaces
what stands between each file's ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` lines;
tests/test_kind_table.py checks that the committed tables are these.
"""
import argparse
from pathlib import Path
from typing import Dict, List, Tuple

from resnmt.connections import BUILTIN_KINDS, CONNECTION_CLASSES
from resnmt.options import Option, add_to_command

WRITE = Option("write", False, "rewrite the committed tables (README, docs, docstring)", kind="switch")

BUILTIN = {kind: CONNECTION_CLASSES[kind] for kind in BUILTIN_KINDS}  # the user's kinds are in no table

REPO_ROOT = Path(__file__).resolve().parents[1]


def output(cls, code: bool) -> str:
    """A kind's output: its equation (in backticks for markdown) and its note."""
    equation = f"`{cls.equation}`" if code else cls.equation
    return f"{equation}, {cls.note}" if cls.note else equation


def readme_table() -> str:
    rows = ["| `--residual` | output | source |", "|---|---|---|"]
    rows += [f"| `{kind}` | {output(cls, True)} | {cls.source} |" for kind, cls in BUILTIN.items()]
    return "\n".join(rows)


def docs_table() -> str:
    rows = ["| `--residual` | output `y` | its flags | source |", "|---|---|---|---|"]
    for kind, cls in BUILTIN.items():
        flags = ", ".join(f"`{flag.flag}`" for flag in cls.flags) or "none"
        rows.append(f"| `{kind}` | {output(cls, True)} | {flags} | {cls.source} |")
    return "\n".join(rows)


def docstring_table() -> str:
    """An RST simple table of each kind's output, as the package's docstring shows it."""
    rows = [("kind", "output y")] + [(kind, output(cls, False)) for kind, cls in BUILTIN.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    rule = "  ".join("=" * w for w in widths)

    def line(row):
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()

    return "\n".join([rule, line(rows[0]), rule, *map(line, rows[1:]), rule])


# marker name -> (file, table)
TABLES: Dict[str, Tuple[str, callable]] = {
    "kind-table": ("README.md", readme_table),
    "kind-flags-table": ("docs/connections.md", docs_table),
    "kind-docstring-table": ("resnmt/connections/__init__.py", docstring_table),
}


def markers(name: str) -> Tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def committed(name: str, root: Path = REPO_ROOT) -> str:
    """What stands between ``name``'s markers in its file."""
    begin, end = markers(name)
    text = (root / TABLES[name][0]).read_text(encoding="utf-8")
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[start:stop].strip("\n")


def write(root: Path = REPO_ROOT) -> List[str]:
    """Rewrite every table in place; the files changed."""
    changed = []
    for name, (path, table) in TABLES.items():
        file = root / path
        text = file.read_text(encoding="utf-8")
        begin, end = markers(name)
        start, stop = text.index(begin) + len(begin), text.index(end)
        new = f"{text[:start]}\n{table()}\n{text[stop:]}"
        if new != text:
            file.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(parser, (WRITE,))
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print("wrote", path)
    else:
        print(readme_table())


if __name__ == "__main__":
    main()
