"""What every command reads from the environment (the Kafka clients, the schema registry,
the pipelines' database and the schema owner's, the role to grant), each missing setting
an error naming it; and how the commands print (a table, JSON)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka_ingest.db import Database
from kafka_ingest.errors import SettingsError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.registry import RegistrySettings

log = logging.getLogger("kafka_ingest")

#: The runtime role ``migrate`` grants to when ``--grant-to`` is not given (empty: none);
#: ``kafka-ingest stack env --secure`` sets it to the local stack's runtime role.
GRANT_TO_ENV = "KAFKA_INGEST_PG_GRANT_TO"


class MissingSetting(SettingsError):
    """A setting the command needs is not in the environment."""

    def __init__(self, *names: str, what: str) -> None:
        super().__init__(f"set {' or '.join(names)} ({what}); nothing is assumed")


def _json_object(name: str) -> dict[str, Any] | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        raise ValueError(f"{name} is not a JSON object") from None
    if not isinstance(config, dict):
        raise ValueError(f"{name} is not a JSON object")
    return config


def registry_settings() -> RegistrySettings | None:
    """The schema registry from ``KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG`` (the client's
    settings as JSON: ``basic.auth.user.info``, ``ssl.ca.location``, ...) and
    ``KAFKA_INGEST_SCHEMA_REGISTRY_URL``; None when neither is set."""
    config = _json_object("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG") or {}
    url = os.environ.get("KAFKA_INGEST_SCHEMA_REGISTRY_URL")
    if url:
        config = {**config, "url": url}
    return RegistrySettings(config) if config else None


def kafka_clients() -> KafkaClients:
    """Kafka clients from ``KAFKA_INGEST_KAFKA_CONFIG`` or ``KAFKA_BOOTSTRAP_SERVERS``, with
    the schema registry of :func:`registry_settings`."""
    config = _json_object("KAFKA_INGEST_KAFKA_CONFIG")
    if config is None:
        servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not servers:
            raise MissingSetting("KAFKA_INGEST_KAFKA_CONFIG", "KAFKA_BOOTSTRAP_SERVERS",
                                 what="the Kafka cluster to use")
        config = {"bootstrap.servers": servers}
    return KafkaClients(config, registry=registry_settings())


def _database(name: str, dsn: str) -> Database:
    try:
        return Database(dsn)
    except SettingsError as exc:  # a DSN libpq cannot parse: say which setting holds it
        raise SettingsError(f"{name}: {exc}") from None


def database() -> Database:
    """The pipelines' database from ``KAFKA_INGEST_PG_DSN``."""
    dsn = os.environ.get("KAFKA_INGEST_PG_DSN")
    if not dsn:
        raise MissingSetting("KAFKA_INGEST_PG_DSN", what="the pipelines' Postgres database, "
                             "a libpq URI or key=value string")
    return _database("KAFKA_INGEST_PG_DSN", dsn)


def admin_database(dsn: str | None = None) -> Database:
    """The schema owner's database, for migrations: ``--dsn``, else
    ``KAFKA_INGEST_PG_ADMIN_DSN``, else (a single-role setup) ``KAFKA_INGEST_PG_DSN``."""
    for name, value in (("--dsn", dsn),
                        ("KAFKA_INGEST_PG_ADMIN_DSN", os.environ.get("KAFKA_INGEST_PG_ADMIN_DSN")),
                        ("KAFKA_INGEST_PG_DSN", os.environ.get("KAFKA_INGEST_PG_DSN"))):
        if value:
            log.info("migrating as the role of %s", name)
            return _database(name, value)
    raise MissingSetting("KAFKA_INGEST_PG_ADMIN_DSN", "--dsn", what="the schema owner's "
                         "Postgres database, for migrations")


def grant_target(given: str | None) -> tuple[str | None, str]:
    """The runtime role ``migrate`` grants to, and where it was named: ``--grant-to``
    (``given``), else ``KAFKA_INGEST_PG_GRANT_TO``; an empty value means none."""
    if given is not None:
        return given or None, "--grant-to"
    return os.environ.get(GRANT_TO_ENV) or None, GRANT_TO_ENV


def new_run_id(kind: str) -> str:
    return f"{kind}__{datetime.now(tz=UTC):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        print("(nothing)")
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c)).ljust(widths[c]) for c in cols))


def print_json(data: Any) -> int:
    print(json.dumps(data, indent=2, default=str))
    return 0
