"""Check the import graph of the packages under ``include/`` (no cycles, no layering breaks)
and of ``benchmarks/`` (no cycles: the harness, the rows, the peers and the scripts).

Usage (from the repo root)::

    python scripts/check_imports.py [DIR ...]

Packages are the directories under a checked directory with an ``__init__.py``; its own
``*.py`` files are top-level modules. Every import
statement counts, at any depth (in functions too), as do ``import_module("literal")`` and
``__import__("literal")``; relative imports are resolved. Imports under ``if TYPE_CHECKING:``
make no graph edge. ``from pkg import name`` is an edge to ``pkg.name`` if that is a
submodule, else to ``pkg`` (its ``__init__``); importing ``pkg.sub`` adds no implicit edge to
``pkg``. For each edge on a cycle the shortest cycle through it is printed (``a -> b -> a``),
so every strongly connected component of size > 1 and every self-loop shows up. ``LAYERING``
applies to every import, TYPE_CHECKING ones included. An import of a module of these
packages that does not exist is reported too. Exit 0 when clean, else 1 (one line a problem).
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# (importing package, forbidden module, why): no module of the importing package, at any
# depth, may import the forbidden module or any of its submodules.
LAYERING: tuple[tuple[str, str, str], ...] = (
    ("kafka_ingest", "kafka_ingest_dev", "runtime code must not use development tooling"),
    ("kafka_ingest", "airflow", "the core is plain Python; Airflow lives in dags/ and plugins/"),
)
#: The runtime package's rooms, top floor first (DESIGN §1). A module imports only from its
#: own room or from a lower floor: never up, never sideways (so the Kafka side and the
#: Postgres side meet only in the engine). The package's ``__init__`` (its re-exports)
#: stands above them all; a module in no room is reported, so a new one gets a place.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("kafka_ingest.cli",),
    ("kafka_ingest.engine",),
    ("kafka_ingest.requests", "kafka_ingest.decode", "kafka_ingest.ops"),
    ("kafka_ingest.ranges", "kafka_ingest.kafka", "kafka_ingest.db"),
    ("kafka_ingest.config",),
    ("kafka_ingest.contracts", "kafka_ingest.errors"),
    ("kafka_ingest.records",),
)
FLOORED_PACKAGE = "kafka_ingest"
DYNAMIC_IMPORTERS = frozenset({"import_module", "__import__"})


@dataclass(frozen=True)
class Import:
    """One import: module ``source`` of the tree imports ``target`` at ``where`` (file:line)."""

    source: str
    target: str
    where: str
    type_checking: bool


@dataclass
class Graph:
    modules: dict[str, tuple[Path, bool]] = field(default_factory=dict)  # name: (file, is_pkg)
    namespaces: set[str] = field(default_factory=set)  # directories without __init__.py
    imports: list[Import] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.modules or name in self.namespaces

    def edges(self) -> dict[tuple[str, str], list[str]]:
        """Runtime edges between modules of the tree, with the places that make them."""
        found: dict[tuple[str, str], list[str]] = {}
        for imp in self.imports:
            if imp.target in self.modules and not imp.type_checking:
                found.setdefault((imp.source, imp.target), []).append(imp.where)
        return found


def _import_nodes(node: ast.AST, tc: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Import statements and calls under ``node``, each with "is under TYPE_CHECKING"."""
    if isinstance(node, ast.If):
        negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
        test = node.test.operand if isinstance(node.test, ast.UnaryOp) else node.test
        if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            body_tc, else_tc = (tc, True) if negated else (True, tc)
            for child in node.body:
                yield from _import_nodes(child, body_tc)
            for child in node.orelse:
                yield from _import_nodes(child, else_tc)
            return
    if isinstance(node, ast.Import | ast.ImportFrom | ast.Call):
        yield node, tc
    for sub in ast.iter_child_nodes(node):
        yield from _import_nodes(sub, tc)


def _relative(package: str, level: int, rest: str | None) -> str | None:
    parts = package.split(".") if package else []
    if level - 1 >= len(parts):
        return None  # beyond the top-level package
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{rest}" if rest else base


def _dynamic_target(call: ast.Call, package: str) -> str | None:
    func = call.func
    fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    arg = call.args[0] if call.args and fname in DYNAMIC_IMPORTERS else None
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    name: str = arg.value
    if not name.startswith("."):
        return name
    anchor = [kw.value for kw in call.keywords if kw.arg == "package"] + call.args[1:2]
    if fname != "import_module" or not anchor or not isinstance(anchor[0], ast.Constant):
        return None
    level = len(name) - len(name.lstrip("."))
    return _relative(str(anchor[0].value), level, name[level:] or None)


def _targets(node: ast.AST, module: str, is_pkg: bool, graph: Graph) -> list[str]:
    package = module if is_pkg else module.rpartition(".")[0]
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _relative(package, node.level, node.module) if node.level else node.module
        if base is None:
            return []
        return [f"{base}.{a.name}" if graph.has(f"{base}.{a.name}") else base for a in node.names]
    target = _dynamic_target(node, package) if isinstance(node, ast.Call) else None
    return [] if target is None else [target]


def build_graph(root: Path) -> Graph:
    """Parse every module of every package under ``root`` (the ``include/`` directory)."""
    root = root.resolve()
    graph = Graph()
    packages = sorted(d for d in root.iterdir() if (d / "__init__.py").is_file())
    paths = [*sorted(root.glob("*.py")), *(p for d in packages for p in sorted(d.rglob("*.py")))]
    for path in paths:
        parts = path.relative_to(root).with_suffix("").parts
        if all(part.isidentifier() for part in parts):
            is_pkg = parts[-1] == "__init__"
            graph.modules[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
            graph.namespaces.update(".".join(parts[:i]) for i in range(1, len(parts)))
    graph.namespaces -= graph.modules.keys()
    for module, (path, is_pkg) in graph.modules.items():
        shown = path.relative_to(root.parent).as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError) as exc:
            graph.errors.append(f"{shown}: cannot parse: {exc}")
            continue
        for node, tc in _import_nodes(tree):
            where = f"{shown}:{getattr(node, 'lineno', 0)}"
            for target in dict.fromkeys(_targets(node, module, is_pkg, graph)):
                graph.imports.append(Import(module, target, where, tc))
    return graph


def _shortest_path(adj: dict[str, list[str]], start: str, goal: str) -> list[str] | None:
    seen, queue = {start}, deque([[start]])
    while queue:
        path = queue.popleft()
        if path[-1] == goal:
            return path
        for nxt in adj.get(path[-1], []):
            if nxt not in seen:
                seen.add(nxt)
                queue.append([*path, nxt])
    return None


def find_cycles(graph: Graph) -> list[str]:
    """One line per distinct cycle: the shortest cycle through each edge that is on one."""
    edges = graph.edges()
    adj: dict[str, list[str]] = {}
    for src, dst in sorted(edges):
        adj.setdefault(src, []).append(dst)
    cycles: dict[tuple[str, ...], str] = {}
    for src, dst in sorted(edges):
        back = _shortest_path(adj, dst, src)  # [src] for a self-loop
        if back is None:
            continue
        ring = [src, *back[:-1]]  # the cycle's modules, none repeated
        i = ring.index(min(ring))
        ring = ring[i:] + ring[:i]
        if tuple(ring) not in cycles:
            sites = ", ".join(edges[hop][0] for hop in zip(ring, [*ring[1:], ring[0]], strict=True))
            cycles[tuple(ring)] = f"cycle: {' -> '.join([*ring, ring[0]])}  [{sites}]"
    return list(cycles.values())


def layering_violations(graph: Graph) -> list[str]:
    """One line per import that breaks a rule of ``LAYERING``, with file:line."""
    return [f"{imp.where}: {imp.source} imports {imp.target}"
            f"{' (under TYPE_CHECKING)' if imp.type_checking else ''}: "
            f"{importer} must not import {banned} ({why})"
            for imp in graph.imports
            for importer, banned, why in LAYERING
            if f"{imp.source}.".startswith(f"{importer}.")
            and f"{imp.target}.".startswith(f"{banned}.")]


def room_of(module: str) -> tuple[str, int] | None:
    """The room of ``module`` and its floor (0 is the top), if it has one."""
    for floor, rooms in enumerate(FLOORS):
        for room in rooms:
            if f"{module}.".startswith(f"{room}."):
                return room, floor
    return None


def floor_violations(graph: Graph) -> list[str]:
    """Modules of the floored package in no room, and imports up or sideways (``FLOORS``)."""
    problems = [f"{name} is in no room of FLOORS; give it one"
                for name in sorted(graph.modules)
                if name.startswith(f"{FLOORED_PACKAGE}.") and room_of(name) is None]
    for imp in graph.imports:
        src, dst = room_of(imp.source), room_of(imp.target)
        if src is None or dst is None or src[0] == dst[0] or dst[1] > src[1]:
            continue
        way = "up" if dst[1] < src[1] else "sideways"
        problems.append(f"{imp.where}: {imp.source} imports {imp.target}: {src[0]} (floor "
                        f"{src[1]}) must not import {way} into {dst[0]} (floor {dst[1]})")
    return problems


def unresolved(graph: Graph) -> list[str]:
    """Imports of a module of these packages that does not exist (a half-done move)."""
    return [f"{imp.where}: {imp.source} imports {imp.target}, which is not a module"
            for imp in graph.imports
            if graph.has(imp.target.partition(".")[0]) and not graph.has(imp.target)]


def check(root: Path, graph: Graph | None = None) -> list[str]:
    """Every problem of the tree under ``root`` (the ``include/`` directory), one per line."""
    graph = graph or build_graph(root)
    return (graph.errors + unresolved(graph) + find_cycles(graph) + layering_violations(graph)
            + floor_violations(graph))


def main(argv: Sequence[str] | None = None) -> int:
    """Check the tree under each directory given, else ``include/`` and ``benchmarks/``
    (whose top-level modules, the harness and the scripts, count as modules too)."""
    args = list(sys.argv[1:] if argv is None else argv)
    repo = Path(__file__).resolve().parents[1]
    roots = [Path(a) for a in args] or [repo / "include", repo / "benchmarks"]
    failed = False
    for root in roots:
        graph = build_graph(root)
        problems = check(root, graph)
        for line in problems:
            print(line)
        size = f"import graph: {len(graph.modules)} modules, {len(graph.edges())} edges"
        named = "" if args else f"{root.name}/ "
        print(f"{named}{size}, {len(problems)} problem(s)" if problems
              else f"{named}{size}, no cycles")
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
