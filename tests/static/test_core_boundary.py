"""The core in include/kafka_ingest is plain Python: no module imports Airflow.

ruff enforces the same rule (TID251 bans ``airflow`` under include/); this test walks the
syntax trees so the boundary holds even where ruff is not run, and checks the ban exists.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

import kafka_ingest
from tests.support import ROOT

CORE = Path(kafka_ingest.__file__).resolve().parent
CORE_FILES = sorted(CORE.rglob("*.py"))


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an ``import`` names, including imports inside functions."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def test_the_core_is_where_the_tests_expect_it() -> None:
    assert CORE == ROOT / "include" / "kafka_ingest"
    assert len(CORE_FILES) > 10


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_no_core_module_imports_airflow(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    offending = [(line, name) for line, name in imported_modules(tree)
                 if name == "airflow" or name.startswith("airflow.")]
    assert offending == [], f"{path.relative_to(ROOT)} imports Airflow: {offending}"


def test_the_walker_sees_every_kind_of_import() -> None:
    source = ("import airflow\nfrom airflow.sdk import dag\n"
              "def f():\n    import airflow.models\n"
              "    importlib.import_module('airflow.hooks')\n")
    names = [name for _, name in imported_modules(ast.parse(source))]
    assert sorted(names) == ["airflow", "airflow.hooks", "airflow.models", "airflow.sdk"]


def test_ruff_bans_airflow_in_the_core_only() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "TID" in lint["select"]
    assert "airflow" in lint["flake8-tidy-imports"]["banned-api"]
    ignored = {path for path, rules in lint["per-file-ignores"].items() if "TID251" in rules}
    assert not any(path.startswith("include") for path in ignored)


#: Where the runtime's SQL lives: the Postgres side (DESIGN: one home per concept).
SQL_HOME = CORE / "db"
_SQL = ("SELECT ", "INSERT INTO ", "UPDATE ", "DELETE FROM ")


def sql_sent(tree: ast.AST) -> list[int]:
    """Lines that send SQL: a call of ``execute``/``executemany``, or a string constant
    that starts like a statement (as a query written beside its call would)."""
    return sorted({node.lineno for node in ast.walk(tree)
                   if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                       and node.func.attr in ("execute", "executemany"))
                   or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                       and node.value.lstrip().upper().startswith(_SQL))})


@pytest.mark.parametrize("path", [p for p in CORE_FILES if SQL_HOME not in p.parents],
                         ids=lambda p: str(p.relative_to(CORE)))
def test_no_sql_outside_the_db_package(path: Path) -> None:
    assert sql_sent(ast.parse(path.read_text(encoding="utf-8"))) == [], (
        f"{path.relative_to(ROOT)} sends SQL: move the query into kafka_ingest.db")


def test_the_sql_walker_sees_calls_and_statements() -> None:
    tree = ast.parse('conn.execute(q)\nQ = "SELECT 1"\nx = "delete from t"\n'
                     'cur.executemany(q, [])\n')
    assert sql_sent(tree) == [1, 2, 3, 4]
    assert sql_sent(ast.parse('print("deleted rows")\n')) == []
