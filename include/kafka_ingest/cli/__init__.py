"""``kafka-ingest``: the operator's command line.

Settings come from the environment only: ``KAFKA_INGEST_KAFKA_CONFIG`` (a JSON librdkafka
dict: bootstrap servers, TLS, SASL, ...) or ``KAFKA_BOOTSTRAP_SERVERS``, and
``KAFKA_INGEST_PG_DSN``; for ``migrate``, ``KAFKA_INGEST_PG_ADMIN_DSN`` (the schema's
owner) and ``KAFKA_INGEST_PG_GRANT_TO`` (the runtime role to grant to). A missing one is
an error naming it; nothing falls back to a default address or credential. ``run``,
``backfill`` and ``replay-dlq`` call exactly the functions the DAG tasks call, and their
arguments go through the same typed requests as the trigger forms, so the CLI and the UI
reject the same forms with the same messages.

An expected failure (a setting, a refusal, a missing privilege or topic, a service out of
reach) is one ``kafka-ingest: ...`` line on stderr and exit status 2, never a traceback:
the libraries' errors are mapped onto :mod:`kafka_ingest.errors` where they are called.

Commands of installed extensions (the development tooling's ``stack``, ``demo`` and
``produce-sample``) are added through the ``kafka_ingest.commands`` entry point.
"""

from kafka_ingest.cli.main import build_parser, main
from kafka_ingest.cli.settings import (
    MissingSetting,
    admin_database,
    database,
    grant_target,
    kafka_clients,
    new_run_id,
    print_table,
    registry_settings,
)

__all__ = ["MissingSetting", "admin_database", "build_parser", "database", "grant_target",
           "kafka_clients", "main", "new_run_id", "print_table", "registry_settings"]
