"""OpenLineage events checked against the spec's JSON Schemas, as a consumer would read them.

The event against the run event schema (its ``schemaURL``), then every facet, wherever it is
(run, job, dataset, input and output facets), against the schema its ``_schemaURL`` names:
the spec's core facets (vendored in ``openlineage_spec/``, see its README), this project's
custom facet (shipped in the package; its ``_schemaURL`` is the package URL with the file's
path). A ``_schemaURL`` that resolves to nothing is an error too.

The Airflow provider's own facets (``airflow``, ``airflowDagRun``, ``airflowState``) name
the spec's generic run facet as their schema, and are checked against it. The provider also
ships stricter schemas of them (``airflow/providers/openlineage/facets/``), which its 2.20.3
does not meet under Airflow 3.3 (``taskInstance.pool`` missing, ``task.
retry_exponential_backoff`` a number): not this project's to fix, so not checked here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from kafka_ingest.ops.lineage import PRODUCER

SPEC_DIR = Path(__file__).resolve().parent / "openlineage_spec"


@cache
def registry() -> Registry:  # type: ignore[type-arg]
    """The spec's documents by their ``$id``."""
    resources = []
    for path in sorted(SPEC_DIR.rglob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)  # type: ignore[no-any-return]


def _own_schema(url: str, facet: str) -> dict[str, Any] | None:
    """This project's schema of ``facet`` named by ``url`` (``<PRODUCER>#<path in the
    package>``), or None if ``url`` is not this project's."""
    base, _, path = url.partition("#")
    if base != PRODUCER or not path.startswith("kafka_ingest/"):
        return None
    file = files("kafka_ingest").joinpath(*path.split("/")[1:])
    doc: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    return {**doc, "$ref": doc["properties"][facet]["$ref"]}


def _facets(event: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(where, name, facet) of every facet of the event."""
    yield from (("run", n, f) for n, f in event["run"].get("facets", {}).items())
    yield from (("job", n, f) for n, f in event["job"].get("facets", {}).items())
    for side in ("inputs", "outputs"):
        for d in event.get(side, []):
            for group in ("facets", "inputFacets", "outputFacets"):
                for n, f in d.get(group, {}).items():
                    yield f"{side} {d['name']} {group}", n, f


def _check(schema: Mapping[str, Any], instance: Any, where: str) -> list[str]:
    validator = Draft202012Validator(schema, registry=registry())
    return [f"{where}: {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
            for e in validator.iter_errors(instance)]


def spec_errors(event: Mapping[str, Any]) -> list[str]:
    """Everything in ``event`` the spec's schemas refuse (empty: valid)."""
    errors = _check({"$ref": event.get("schemaURL", "")}, event, "event")
    for where, name, facet in _facets(event):
        here = f"{where} {name}"
        url = facet.get("_schemaURL", "") if isinstance(facet, Mapping) else ""
        own = _own_schema(url, name)
        if own is not None:
            errors += _check(own, facet, here)
        elif url.partition("#")[0] in registry():
            errors += _check({"$ref": url}, facet, here)
        else:
            errors.append(f"{here}: no schema at _schemaURL {url!r}")
    return errors


__all__ = ["SPEC_DIR", "registry", "spec_errors"]
