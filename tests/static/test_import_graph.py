"""The import graph of ``include/`` has no cycle and keeps its layers (scripts/check_imports.py).

The first tests run the checker on the real tree. The others build tiny packages in
``tmp_path`` to prove the checker can fail: cycles hidden in functions, relative imports and
``import_module`` calls are found, ``if TYPE_CHECKING:`` imports are not, and the runtime
package importing the dev package or Airflow, at any depth, is a layering violation.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "check_imports.py"


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """Write ``{"pkg/a.py": source}`` under ``tmp_path/include``; return that include root."""
    root = tmp_path / "include"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def cycles(root: Path) -> list[str]:
    return [line for line in checker.check(root) if line.startswith("cycle: ")]


# --- the real tree -------------------------------------------------------------------------


#: An absolute first-party import at the start of a line: a module's top-level imports,
#: which no ``if TYPE_CHECKING:`` guards (that would indent them).
TOP_LEVEL_IMPORT = re.compile(r"^(?:from (kafka_ingest\w*(?:\.\w+)*) import \(?\s*(\w+)"
                              r"|import (kafka_ingest\w*(?:\.\w+)*))", re.MULTILINE)


def test_the_checker_sees_every_module_of_the_real_tree() -> None:
    # Python's own walk of the packages under include/: a module the checker missed would
    # hide its cycles and layering breaks.
    include = ROOT / "include"
    found = {name for _, name, _ in pkgutil.walk_packages([str(include)])}
    assert found  # the walk itself saw the packages
    assert set(checker.build_graph(include).modules) == found


def test_the_checker_sees_every_top_level_import_of_the_real_tree() -> None:
    graph = checker.build_graph(ROOT / "include")
    edges = graph.edges()
    missed = []
    for module, (path, _) in graph.modules.items():
        for match in TOP_LEVEL_IMPORT.finditer(path.read_text(encoding="utf-8")):
            base, name, plain = match.groups()
            targets = {plain} if plain else {base, f"{base}.{name}"}
            if not any((module, target) in edges for target in targets):
                missed.append(f"{module}: {match.group(0)}")
    assert missed == []


def test_real_tree_has_no_import_cycles() -> None:
    found = checker.find_cycles(checker.build_graph(ROOT / "include"))
    assert found == [], "\n".join(found)


def test_real_tree_has_no_layering_violations() -> None:
    found = checker.layering_violations(checker.build_graph(ROOT / "include"))
    assert found == [], "\n".join(found)


def test_real_tree_imports_only_modules_that_exist() -> None:
    found = checker.unresolved(checker.build_graph(ROOT / "include"))
    assert found == [], "\n".join(found)


def test_the_benchmarks_have_no_import_cycle() -> None:
    # The harness, the project's rows, the peers and the scripts: none imports a script.
    graph = checker.build_graph(ROOT / "benchmarks")
    assert {"harness", "project_rows", "bench_ingest", "peers", "peers.connect"} <= set(
        graph.modules)
    found = checker.find_cycles(graph) + checker.unresolved(graph)
    assert found == [], "\n".join(found)


# --- the checker can fail ------------------------------------------------------------------


def test_a_cycle_between_top_level_modules_is_found(tmp_path: Path) -> None:
    # benchmarks/ holds scripts and a harness as plain modules beside the peers package
    root = make_tree(tmp_path, {
        "script.py": "import lib\n",
        "lib.py": "def f():\n    import script\n",
        "pkg/__init__.py": "",
        "pkg/a.py": "import lib\n",
    })
    assert [line.split("  [")[0] for line in cycles(root)] == [
        "cycle: lib -> script -> lib"]


def test_a_cycle_made_by_a_function_local_import_is_reported(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "def f():\n    from pkg import a\n    return a\n",
    })
    assert cycles(root) == [
        "cycle: pkg.a -> pkg.b -> pkg.a  [include/pkg/a.py:1, include/pkg/b.py:2]",
    ]


def test_a_type_checking_import_is_not_a_cycle(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import B\n",
        "pkg/b.py": """\
            from typing import TYPE_CHECKING
            import typing
            if TYPE_CHECKING:
                from pkg.a import A
            if typing.TYPE_CHECKING:
                def f():
                    import pkg.a
            B = 1
            """,
    })
    assert checker.check(root) == []


def test_the_else_of_type_checking_is_a_runtime_import(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import B\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\n"
                    "else:\n    import pkg.a\nB = 1\n",
    })
    assert [line.split("  [")[0] for line in cycles(root)] == ["cycle: pkg.a -> pkg.b -> pkg.a"]


def test_a_relative_import_cycle_is_reported(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/x.py": "from . import y\n",
        "pkg/sub/y.py": "def f():\n    from ..sub import x\n    return x\n",
    })
    assert [line.split("  [")[0] for line in cycles(root)] == [
        "cycle: pkg.sub.x -> pkg.sub.y -> pkg.sub.x",
    ]


def test_an_import_module_literal_is_an_edge(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "import importlib\n\ndef f():\n    return importlib.import_module('pkg.a')\n",
    })
    assert [line.split("  [")[0] for line in cycles(root)] == ["cycle: pkg.a -> pkg.b -> pkg.a"]


def test_a_reexporting_init_is_not_a_cycle(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\nfrom .b import B\n",
        "pkg/a.py": "from pkg.b import B\nA = B\n",
        "pkg/b.py": "B = 1\n",
    })
    assert checker.check(root) == []
    assert set(checker.build_graph(root).edges()) == {
        ("pkg", "pkg.a"), ("pkg", "pkg.b"), ("pkg.a", "pkg.b"),
    }


def test_from_package_import_attribute_is_an_edge_to_init(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\nVERSION = 1\n",
        "pkg/a.py": "def f():\n    from pkg import VERSION\n    return VERSION\nA = 1\n",
    })
    assert [line.split("  [")[0] for line in cycles(root)] == ["cycle: pkg -> pkg.a -> pkg"]


def test_a_self_import_is_a_cycle(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def f():\n    import pkg.a\n"})
    assert cycles(root) == ["cycle: pkg.a -> pkg.a  [include/pkg/a.py:2]"]


def test_the_runtime_package_importing_dev_tooling_is_a_violation(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "kafka_ingest/__init__.py": "",
        "kafka_ingest/cli.py": "def f():\n    import kafka_ingest_dev.fixtures\n",
        "kafka_ingest_dev/__init__.py": "from kafka_ingest import cli\n",  # allowed way round
        "kafka_ingest_dev/fixtures.py": "",
    })
    problems = checker.check(root)
    assert len(problems) == 1
    assert problems[0].startswith("include/kafka_ingest/cli.py:2: kafka_ingest.cli imports "
                                  "kafka_ingest_dev.fixtures")


def test_the_runtime_package_importing_airflow_is_a_violation(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "kafka_ingest/__init__.py": "",
        "kafka_ingest/sub/__init__.py": "",
        "kafka_ingest/sub/deep.py": """\
            import importlib
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                import airflow
            class C:
                def m(self):
                    from airflow.sdk import dag
                    return importlib.import_module("airflow.hooks"), dag
            import airflow_lookalike
            """,
    })
    places = [line.split(": ")[0] for line in checker.layering_violations(
        checker.build_graph(root))]
    assert places == [f"include/kafka_ingest/sub/deep.py:{n}" for n in (4, 7, 8)]


def test_an_import_of_a_missing_module_is_reported(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg.gone import x\n"})
    assert checker.check(root) == [
        "include/pkg/a.py:1: pkg.a imports pkg.gone, which is not a module",
    ]


def test_main_exit_status_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = make_tree(tmp_path / "clean", {"pkg/__init__.py": "", "pkg/a.py": "import pkg\n"})
    assert checker.main([str(clean)]) == 0
    assert capsys.readouterr().out == "import graph: 2 modules, 1 edges, no cycles\n"
    cyclic = make_tree(tmp_path / "cyclic", {
        "pkg/__init__.py": "from pkg.a import A\n", "pkg/a.py": "from pkg import B\nA = 1\n",
    })
    assert checker.main([str(cyclic)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cycle: pkg -> pkg.a -> pkg")
    assert out[-1] == "import graph: 2 modules, 2 edges, 1 problem(s)"


# --- floors: arrows point down only ---------------------------------------------------------


def test_the_real_tree_keeps_to_its_floors() -> None:
    assert checker.floor_violations(checker.build_graph(ROOT / "include")) == []


def test_an_import_up_sideways_or_from_a_module_in_no_room_is_reported(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "kafka_ingest/__init__.py": "from kafka_ingest.engine import slices\n",  # re-exports
        "kafka_ingest/engine/__init__.py": "",
        "kafka_ingest/engine/slices.py": "from kafka_ingest.kafka import reader\n",  # down
        "kafka_ingest/kafka/__init__.py": "",
        "kafka_ingest/kafka/reader.py": """\
            from kafka_ingest.kafka import dlq
            def f():
                from kafka_ingest.db import upsert
            """,
        "kafka_ingest/kafka/dlq.py": "from kafka_ingest.errors import X\n",
        "kafka_ingest/db/__init__.py": "",
        "kafka_ingest/db/upsert.py": "import kafka_ingest.engine.slices\n",
        "kafka_ingest/errors.py": "X = 1\n",
        "kafka_ingest/stray.py": "",
    })
    assert checker.floor_violations(checker.build_graph(root)) == [
        "kafka_ingest.stray is in no room of FLOORS; give it one",
        "include/kafka_ingest/db/upsert.py:1: kafka_ingest.db.upsert imports "
        "kafka_ingest.engine.slices: kafka_ingest.db (floor 3) must not import up into "
        "kafka_ingest.engine (floor 1)",
        "include/kafka_ingest/kafka/reader.py:3: kafka_ingest.kafka.reader imports "
        "kafka_ingest.db.upsert: kafka_ingest.kafka (floor 3) must not import sideways into "
        "kafka_ingest.db (floor 3)",
    ]
