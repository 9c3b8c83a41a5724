"""The generated parts of the docs, and the check that every link in the docs resolves.

- ``docs/configuration.md`` is made from the pipeline model: every key of
  :class:`kafka_ingest.config.Pipeline` and of the models nested in it, and of a declared
  contract (:class:`kafka_ingest.contracts.declared.ContractSpec`), with its type, bounds,
  default and the doc comment (``#:``) above it in the model.
- The code map in ``docs/development.md`` (between the ``generated`` markers) is made from
  the tree: every module of the project's Python folders with its docstring's summary.

Usage, from the repository root::

    python -m kafka_ingest_dev.docs config    # print docs/configuration.md
    python -m kafka_ingest_dev.docs tree      # print the code map
    python -m kafka_ingest_dev.docs write     # rewrite every generated part in place
    python -m kafka_ingest_dev.docs check     # exit 1 if a part is stale or a link broken

``tests/unit/test_docs.py`` runs the same checks, so the docs cannot drift from the code.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kafka_ingest.config import Pipeline
from kafka_ingest.contracts.declared import ContractSpec
from kafka_ingest.ops import metrics, rules

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = Path("docs/configuration.md")
DEVELOPMENT = Path("docs/development.md")
RUNBOOK = Path("docs/runbook.md")
OPERATIONS = Path("docs/operations.md")
#: The folders of the code map, in the order a newcomer reads them.
CODE_FOLDERS = ("dags", "plugins", "include/kafka_ingest", "include/kafka_ingest_dev",
                "benchmarks", "scripts")
BEGIN = "<!-- generated: python -m kafka_ingest_dev.docs write (do not edit by hand) -->"
END = "<!-- end of generated part -->"

# --------------------------------------------------------------------------- text


def markdown(doc: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown, on one line per
    paragraph."""
    text = re.sub(r":[a-z]+:`~?(?:[\w.]*\.)?([^`]+)`", r"`\1`", doc)
    text = text.replace("``", "`")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(p for p in paragraphs if p)


def summary(doc: str | None) -> str:
    """A docstring's first paragraph, as Markdown on one line."""
    return markdown(doc or "").split("\n\n")[0]


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"<[^>]+>", "", title).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n\n", "<br>")


# --------------------------------------------------------------------------- a model's keys


def _own_doc(model: type) -> str:
    doc = model.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if doc else ""


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field's doc comment: the ``#:`` lines right above it in the class body (the
    convention Sphinx reads), or the string right below it; the model's bases first."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if issubclass(cls, BaseModel) and not cls.__module__.startswith("pydantic"):
            docs.update(_class_field_docs(cls))
    return docs


def _class_field_docs(cls: type) -> dict[str, str]:
    lines, _ = inspect.getsourcelines(cls)
    body = typing.cast(ast.ClassDef, ast.parse(textwrap.dedent("".join(lines))).body[0]).body
    docs: dict[str, str] = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        above = node.lineno - 2  # the line above, 0-based
        while above >= 0 and lines[above].strip().startswith("#:"):
            comment.insert(0, lines[above].strip()[2:].strip())
            above -= 1
        after = body[i + 1] if i + 1 < len(body) else None
        if (not comment and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            comment = [after.value.value]
        if comment:
            docs[node.target.id] = markdown(" ".join(comment))
    return docs


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"),
           ("min_length", "length ≥"), ("max_length", "length ≤"))


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{value:g}"


def bounds(metadata: Sequence[Any]) -> str:
    """What a field's constraints allow, in words (``≥ 1, ≤ 500,000``)."""
    said = []
    for item in metadata:
        for attr, sign in _BOUNDS:
            value = getattr(item, attr, None)
            if value is not None:
                said.append(f"{sign} {_number(value)}")
        if getattr(item, "pattern", None):
            said.append(f"matches `{item.pattern}`")
    return ", ".join(said)


_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}


def _inner_metadata(extra: Sequence[Any]) -> list[Any]:
    return [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]


def type_text(tp: Any, metadata: Sequence[Any] = ()) -> str:
    """A field's type as a reader of the YAML file sees it; nested models link to their
    section."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_text(args[0], [*metadata, *_inner_metadata(args[1:])])
    if origin in (typing.Union, types.UnionType):
        text = " or ".join(type_text(a) for a in args if a is not type(None))
        return text + (" or `null`" if type(None) in args else "")
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}"
    if origin in (tuple, list):
        return f"list of {type_text(args[0])}"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return " | ".join(f"`{m.value}`" for m in tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{slug(tp.__name__)})"
    said = bounds(metadata)
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp))) + (f" ({said})" if said else "")


def default_text(field: FieldInfo) -> str:
    """A field's default as YAML would say it (``required`` when it has none)."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str) and re.fullmatch(r"[\w.:/-]+", value):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


@dataclass(frozen=True)
class Key:
    """One key of the pipelines file, documented."""

    name: str
    type: str
    default: str
    doc: str


def model_keys(model: type[BaseModel]) -> list[Key]:
    """Every key of ``model`` (its field, or the field's alias), in declaration order."""
    docs = field_docs(model)
    return [Key(field.alias or name, type_text(field.annotation, field.metadata),
                default_text(field), docs.get(name) or field.description or "")
            for name, field in model.model_fields.items()]


def _models_in(tp: Any) -> Iterator[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        yield tp
    for arg in typing.get_args(tp):
        yield from _models_in(arg)


def nested_models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """``root`` and every model its fields hold, at any depth, first seen first."""
    found: list[type[BaseModel]] = [root]
    for model in found:  # grows while it is walked
        for field in model.model_fields.values():
            found += [m for m in _models_in(field.annotation) if m not in found]
    return found


def undocumented(roots: Sequence[type[BaseModel]] = (Pipeline, ContractSpec)) -> list[str]:
    """``Model.field`` of every key without a doc comment (each key must say what it is)."""
    return [f"{model.__name__}.{name}" for root in roots for model in nested_models(root)
            for name in model.model_fields if name not in field_docs(model)
            and not model.model_fields[name].description]


# --------------------------------------------------------------------------- the reference


_INTRO = """\
# Configuration reference

<!-- Generated from the pipeline model by `python -m kafka_ingest_dev.docs write`;
tests/unit/test_docs.py fails when it is stale. Edit the models' doc comments
(include/kafka_ingest/config.py, contracts/declared.py), not this file. -->

The pipelines file is `include/pipelines.yaml`, or the file `KAFKA_INGEST_PIPELINES` names.
It has three keys at the top: `pipelines` (one entry per pipeline, its key the pipeline's
name), `defaults` (any pipeline key, applied to every pipeline; `alerts` and `retention`
merge key by key, so a pipeline may change one limit and keep the shared notifiers) and
`contracts` (contracts declared in the file instead of written in Python). Loading
validates everything at once: an unknown key, a wrong type, a bound broken or a
combination that cannot work is an error naming the pipeline and the key, before any DAG
or run is built from the file.

How to use these keys: [Onboarding a topic](onboarding.md); the registry formats:
[Formats](formats.md).

Models: """


def _table(keys: Sequence[Key]) -> list[str]:
    rows = ["| key | type | default | what |", "|---|---|---|---|"]
    rows += [f"| `{k.name}` | {_cell(k.type)} | {_cell(k.default)} | {_cell(k.doc)} |"
             for k in keys]
    return rows


def _section(model: type[BaseModel], where: str) -> list[str]:
    lines = [f"## {model.__name__}", "", where]
    doc = markdown(_own_doc(model))
    if doc:
        lines += ["", doc]
    return [*lines, "", *_table(model_keys(model)), ""]


def _where(model: type[BaseModel], parents: dict[type[BaseModel], str]) -> str:
    return parents.get(model, "")


def _parents(roots: Sequence[tuple[type[BaseModel], str]]) -> dict[type[BaseModel], str]:
    """Where each model sits in the file, in words: the first key that holds it."""
    said = {root: where for root, where in roots}
    for root, _ in roots:
        for model in nested_models(root):
            for name, field in model.model_fields.items():
                for inner in _models_in(field.annotation):
                    said.setdefault(inner, f"Where: `{field.alias or name}` in "
                                           f"[{model.__name__}](#{slug(model.__name__)}).")
    return said


#: The two models a pipelines file is made of, and where they sit.
ROOTS: tuple[tuple[type[BaseModel], str], ...] = (
    (Pipeline, "Each entry under `pipelines` (and the keys of `defaults`)."),
    (ContractSpec, "Each entry under `contracts`, its key the event type (lower case, "
                   "digits and `_`); version N accepts payloads of versions 1 to N."),
)


def config_reference() -> str:
    """``docs/configuration.md``: every key of the pipelines file."""
    parents = _parents(ROOTS)
    models = [m for root, _ in ROOTS for m in nested_models(root)]
    index = ", ".join(f"[{m.__name__}](#{slug(m.__name__)})" for m in models)
    lines = [_INTRO + index + ".", ""]
    for model in models:
        lines += _section(model, _where(model, parents))
    lines += enum_sections(models)
    return "\n".join(lines).rstrip() + "\n"


def enum_sections(models: Sequence[type[BaseModel]]) -> list[str]:
    """The documented choices (enums with a docstring) the models' keys take."""
    seen: list[type[Enum]] = []
    for model in models:
        for field in model.model_fields.values():
            seen += [e for e in _enums_in(field.annotation) if e not in seen and _own_doc(e)]
    if not seen:
        return []
    lines = ["## Choices", ""]
    for enum in seen:
        values = ", ".join(f"`{m.value}`" for m in enum)
        lines += [f"- **{enum.__name__}** ({values}): {markdown(_own_doc(enum))}"]
    return [*lines, ""]


def _enums_in(tp: Any) -> Iterator[type[Enum]]:
    if isinstance(tp, type) and issubclass(tp, Enum):
        yield tp
    for arg in typing.get_args(tp):
        yield from _enums_in(arg)


# --------------------------------------------------------------------------- the code map


def _docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def _subpackages(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file())


def _map_lines(folder: Path, label: str, depth: int) -> list[str]:
    indent = "  " * depth
    init = folder / "__init__.py"
    about = summary(_docstring(init)) if init.is_file() else ""
    lines = [f"{indent}- `{label}/`" + (f": {about}" if about else "")]
    for module in _modules(folder):
        lines.append(f"{indent}  - `{module.name}`: {summary(_docstring(module)) or '-'}")
    for package in _subpackages(folder):
        lines += _map_lines(package, package.name, depth + 1)
    return lines


def code_map(root: Path = ROOT) -> str:
    """Every module of the project's Python folders with its docstring's summary."""
    lines: list[str] = []
    for folder in CODE_FOLDERS:
        lines += _map_lines(root / folder, folder, 0)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- generated parts


def _splice(text: str, part: str, where: Path) -> str:
    """``text`` with the part between the markers replaced by ``part``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{where}: needs one {BEGIN!r} and one {END!r} line")
    head, rest = text.split(BEGIN + "\n", 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{part}{END}{tail}"


def _block(text: str, block: str, begin: str, end: str, where: Path) -> str:
    """``text`` with the block from its ``begin`` line to its ``end`` line (a block that
    carries its own markers) replaced by ``block``."""
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"{where}: needs one {begin!r} and one {end!r} line")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end + "\n", 1)
    return f"{head}{block}{tail}"


def generated(root: Path = ROOT) -> dict[Path, str]:
    """Each file with a generated part, as it must read (relative path -> text): the
    configuration reference, the code map, the alert rules' runbook sections
    (:data:`kafka_ingest.ops.rules.RULES`) and the chunk counters
    (:class:`kafka_ingest.records.ChunkCounts`)."""
    def read(path: Path) -> str:
        return (root / path).read_text(encoding="utf-8")

    return {CONFIGURATION: config_reference(),
            DEVELOPMENT: _splice(read(DEVELOPMENT), code_map(root), DEVELOPMENT),
            RUNBOOK: _block(read(RUNBOOK), rules.runbook(), rules.DOCS_BEGIN, rules.DOCS_END,
                            RUNBOOK),
            OPERATIONS: _block(read(OPERATIONS), metrics.counters_table(),
                               metrics.COUNTERS_BEGIN, metrics.COUNTERS_END, OPERATIONS)}


def stale(root: Path = ROOT) -> list[Path]:
    """The files whose generated part differs from what the code says now."""
    return [path for path, text in generated(root).items()
            if not (root / path).is_file()
            or (root / path).read_text(encoding="utf-8") != text]


# --------------------------------------------------------------------------- links


_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered, with inline code blanked out."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"`[^`]*`", "``", line)


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown file: its headings' (as GitHub numbers repeats) and
    ``<a id=...>`` ones."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else _HEADING.match(line)
        if heading:
            base = slug(heading.group(1).replace("`", ""))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
        found.update(_ANCHOR.findall(line))
    return found


def broken_links(files: Sequence[Path], root: Path = ROOT) -> list[str]:
    """Every relative link of ``files`` whose file or anchor does not exist, as
    ``file:line: target``. External links (a scheme, ``mailto:``) are not followed."""
    problems = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        for number, line in _prose(text):
            for target in _LINK.findall(line):
                if not _resolves(file, target, root):
                    problems.append(f"{file.relative_to(root)}:{number}: {target}")
    return problems


def _resolves(file: Path, target: str, root: Path) -> bool:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return True
    path, _, anchor = target.partition("#")
    dest = (file.parent / path).resolve() if path else file
    if not dest.exists() or root not in (dest, *dest.parents):
        return False
    if not anchor:
        return True
    return dest.suffix == ".md" and anchor in anchors(dest.read_text(encoding="utf-8"))


def doc_files(root: Path = ROOT) -> list[Path]:
    """The README, the changelog and every page under docs/."""
    return [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]


# --------------------------------------------------------------------------- command line


def _write(root: Path) -> int:
    for path, text in generated(root).items():
        (root / path).write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _check(root: Path) -> int:
    problems = [f"{p}: stale; run `python -m kafka_ingest_dev.docs write`" for p in stale(root)]
    problems += [f"{p}: broken link" for p in broken_links(doc_files(root), root)]
    problems += [f"{k}: no doc comment (#:) in the model" for k in undocumented()]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def _print(text: Callable[[], str]) -> int:
    sys.stdout.write(text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands: dict[str, Callable[[], int]] = {
        "config": lambda: _print(config_reference),
        "tree": lambda: _print(code_map),
        "write": lambda: _write(ROOT),
        "check": lambda: _check(ROOT),
    }
    if len(args) != 1 or args[0] not in commands:
        print(f"usage: python -m kafka_ingest_dev.docs {{{','.join(commands)}}}", file=sys.stderr)
        return 2
    return commands[args[0]]()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
