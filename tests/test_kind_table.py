"""The kind tables (README, docs/connections.md, the connections package's docstring) are
generated from the registry: regenerate with python benchmarks/kind_table.py --write."""
import sys

import pytest

from conftest import REPO_ROOT
from resnmt.connections import BUILTIN_KINDS, CONNECTION_CLASSES

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # the lab's generators
import kind_table  # noqa: E402


@pytest.mark.parametrize("name", list(kind_table.TABLES))
def test_committed_kind_tables_are_the_generated_ones(name):
    _path, table = kind_table.TABLES[name]
    assert kind_table.committed(name) == table()


def test_every_kind_has_a_row_of_its_own_words():
    rows = kind_table.readme_table().splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [f"| `{kind}`" for kind in BUILTIN_KINDS]  # not the user's
    for cls in map(CONNECTION_CLASSES.get, BUILTIN_KINDS):
        assert cls.equation and cls.source and "|" not in cls.equation + cls.note + cls.source
