"""The pipelines file: loaded, validated at once (an unknown key, a wrong type or a contract
that is not registered raises ``ValueError`` naming the pipeline and the key), and the
checks across pipelines (pools, shared tables).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from kafka_ingest.config.modes import (
    DEFAULT_POOL,
    DEFAULT_POOL_SLOTS,
    NAME_PATTERN,
    UpsertMode,
)
from kafka_ingest.config.pipeline import Pipeline
from kafka_ingest.config.sections import format_error
from kafka_ingest.contracts import REGISTRY, Contract
from kafka_ingest.contracts.declared import (
    ContractSpec,
    build_versions,
)

DEFAULT_PIPELINES_FILE = Path(__file__).resolve().parents[2] / "pipelines.yaml"



def declared_contracts(document: Any, *, source: str) -> dict[str, type[Contract]]:
    """Every version of every contract under the file's ``contracts`` key, by registry
    key (see :mod:`kafka_ingest.contracts.declared`)."""
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ValueError(f"{source}: 'contracts' must be a mapping of event type -> contract")
    found: dict[str, type[Contract]] = {}
    for event_type, body in document.items():
        where = f"contracts.{event_type}"
        if not isinstance(event_type, str) or not re.fullmatch(NAME_PATTERN, event_type):
            raise ValueError(f"{source}: {where}: an event type is lower case, digits and _")
        try:
            spec = ContractSpec.model_validate(body)
        except ValidationError as exc:
            raise ValueError(f"{source}: {format_error(where, exc)}") from None
        for model in build_versions(event_type, spec):
            found[model.key()] = model
    return found


def _merge(defaults: dict[str, Any], body: dict[str, Any], name: str) -> dict[str, Any]:
    """A pipeline's keys over the defaults; ``alerts`` and ``retention`` merge key by key,
    so a pipeline may change one limit and keep the shared notifiers."""
    merged = {**defaults, **body, "name": name}
    for block in ("alerts", "retention"):
        shared, own = defaults.get(block), body.get(block)
        if isinstance(shared, dict) and isinstance(own, dict):
            merged[block] = {**shared, **own}
    return merged


def airflow_pools(pipelines: Mapping[str, Pipeline]) -> dict[str, int]:
    """The Airflow pools the pipelines name, with their size: the ``pool_slots`` of the
    pipelines naming one (they must agree), else ``DEFAULT_POOL_SLOTS``. Airflow's own
    ``default_pool`` is listed only when a pipeline sizes it explicitly."""
    sizes: dict[str, set[int]] = {}
    for pipeline in pipelines.values():
        if pipeline.pool is not None:
            said = sizes.setdefault(pipeline.pool, set())
            if pipeline.pool_slots is not None:
                said.add(pipeline.pool_slots)
    for name, said in sizes.items():
        if len(said) > 1:
            users = sorted(p.name for p in pipelines.values() if p.pool == name)
            raise ValueError(f"pipelines {', '.join(users)} give the pool {name!r} different "
                             f"sizes ({', '.join(map(str, sorted(said)))}): say one")
    return {name: (min(said) if said else DEFAULT_POOL_SLOTS)
            for name, said in sorted(sizes.items()) if name != DEFAULT_POOL or said}


def pool_import_document(pipelines: Mapping[str, Pipeline]) -> dict[str, dict[str, Any]]:
    """The pipelines' pools as ``airflow pools import <file>`` reads them."""
    return {name: {"slots": slots, "include_deferred": False,
                   "description": "kafka-ingest: slices of "
                   + ", ".join(sorted(p.name for p in pipelines.values() if p.pool == name))}
            for name, slots in airflow_pools(pipelines).items()}


def parse_pipelines(document: Any, *, source: str = "<pipelines>") -> dict[str, Pipeline]:
    """Validate a loaded YAML document ``{pipelines: {name: {...}}}`` (with ``defaults``
    and declared ``contracts``)."""
    if not isinstance(document, dict) or set(document) - {"pipelines", "defaults", "contracts"}:
        raise ValueError(f"{source}: top level must be a mapping with 'pipelines' (and "
                         "'defaults', 'contracts')")
    contracts = declared_contracts(document.get("contracts"), source=source)
    if clash := sorted(set(contracts) & set(REGISTRY)):
        raise ValueError(f"{source}: contracts {', '.join(clash)} are declared here and written "
                         "in Python: rename the declared event type")
    defaults = document.get("defaults") or {}
    entries = document.get("pipelines") or {}
    if not isinstance(entries, dict) or not isinstance(defaults, dict):
        raise ValueError(f"{source}: 'pipelines' and 'defaults' must be mappings")
    pipelines: dict[str, Pipeline] = {}
    for name, body in entries.items():
        if not isinstance(body, dict):
            raise ValueError(f"{source}: pipelines.{name} must be a mapping")
        try:
            pipelines[name] = Pipeline.model_validate(_merge(defaults, body, name),
                                                      context={"contracts": contracts})
        except ValidationError as exc:
            raise ValueError(f"{source}: {format_error(f'pipelines.{name}', exc)}") from None
        except ValueError as exc:
            raise ValueError(f"{source}: pipelines.{name}: {exc}") from None
    try:
        airflow_pools(pipelines)
        shared_tables(pipelines)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return pipelines


def shared_tables(pipelines: Mapping[str, Pipeline]) -> None:
    """A ``latest`` table keeps one version per key, ordered within its topic: pipelines
    writing it must read the same topic with the same upsert and the same tombstone rule
    (a pipeline that does not delete never reads the deletion markers, so it would write a
    deleted key's older version back); append pipelines may share a table across topics
    (their identity decides). Raise ``ValueError`` otherwise."""
    by_table: dict[str, list[Pipeline]] = {}
    for pipeline in pipelines.values():
        by_table.setdefault(pipeline.table, []).append(pipeline)
    for table, writers in sorted(by_table.items()):
        if len(writers) < 2:
            continue
        if all(p.upsert.mode is UpsertMode.APPEND for p in writers):
            _same_identity(table, writers)
            continue
        if len({(p.topic, p.upsert, p.deletes)
                for p in writers}) > 1:
            names = ", ".join(sorted(
                f"{p.name} ({p.topic}, {p.upsert.mode.value}"
                f"{', deletes' if p.deletes else ''})"
                for p in writers))
            raise ValueError(
                f"pipelines {names} all write table {table!r}: a latest table keeps one "
                "version per key, and records of two topics (or two ways of choosing the "
                "newest, or of honouring a deletion) cannot be ordered against each other; "
                "give each its own table")


def _same_identity(table: str, writers: list[Pipeline]) -> None:
    """Append pipelines sharing a table must identify records alike: the table has one
    primary key, which each one's ``ON CONFLICT`` names."""
    if len({p.conflict_columns for p in writers}) > 1:
        names = ", ".join(sorted(f"{p.name} ({', '.join(p.conflict_columns)})"
                                 for p in writers))
        raise ValueError(f"pipelines {names} all write table {table!r} but identify its "
                         "records differently: the table has one primary key; give them "
                         "the same identity, or each its own table")


def pipelines_file() -> Path:
    return Path(os.environ.get("KAFKA_INGEST_PIPELINES") or DEFAULT_PIPELINES_FILE)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's problem and where, on one line (its own message quotes the source
    over several)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None:
        return " ".join(str(exc).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _load_document(path: Path | str | None) -> tuple[Any, Path]:
    file = Path(path) if path else pipelines_file()
    try:
        return yaml.safe_load(file.read_text(encoding="utf-8")), file
    except OSError as exc:
        raise ValueError(f"cannot read pipelines file {file}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{file}: not valid YAML: {_yaml_problem(exc)}") from None


def load_pipelines(path: Path | str | None = None) -> dict[str, Pipeline]:
    """Load and validate the pipelines file."""
    document, file = _load_document(path)
    return parse_pipelines(document, source=str(file))


def load_declared_contracts(path: Path | str | None = None) -> dict[str, type[Contract]]:
    """The contracts the pipelines file declares, by registry key."""
    document, file = _load_document(path)
    body = document.get("contracts") if isinstance(document, dict) else None
    return declared_contracts(body, source=str(file))


def get_pipeline(name: str, path: Path | str | None = None) -> Pipeline:
    pipelines = load_pipelines(path)
    try:
        return pipelines[name]
    except KeyError:
        raise ValueError(
            f"unknown pipeline {name!r}; defined: {', '.join(sorted(pipelines))}"
        ) from None
