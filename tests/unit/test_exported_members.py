"""``kafka_ingest.__all__`` is the public API: sorted, complete, and every name resolves.

After encode/httpx ``tests/test_exported_members.py``. "Sorted" is ruff's RUF022 order
(isort style): CONSTANTS, then Classes, then functions, each alphabetical.
"""

from __future__ import annotations

import types

import kafka_ingest


def isort_key(name: str) -> tuple[int, str]:
    kind = 0 if name.isupper() else (1 if name[:1].isupper() else 2)
    return (kind, name)


def test_all_is_sorted() -> None:
    assert kafka_ingest.__all__ == sorted(kafka_ingest.__all__, key=isort_key)
    assert len(set(kafka_ingest.__all__)) == len(kafka_ingest.__all__)


def test_a_star_import_gives_exactly_the_exported_names() -> None:
    # ``from kafka_ingest import *`` resolves each name of __all__ (a name the package does
    # not define fails it) and brings nothing else
    namespace: dict[str, object] = {}
    exec("from kafka_ingest import *", namespace)  # noqa: S102 - a constant statement
    assert set(namespace) - {"__builtins__"} == set(kafka_ingest.__all__)


def test_every_public_name_is_exported() -> None:
    public = {
        name for name, value in vars(kafka_ingest).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(kafka_ingest.__all__)


def test_exported_objects_come_from_the_package() -> None:
    for name in kafka_ingest.__all__:
        module = getattr(getattr(kafka_ingest, name), "__module__", "kafka_ingest")
        assert module.startswith("kafka_ingest"), (name, module)
