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
