"""``kafka-ingest``: the operator's command line.

Settings come from the environment only: ``KAFKA_INGEST_KAFKA_CONFIG`` (a JSON librdkafka
dict: bootstrap servers, TLS, SASL, ...) or ``KAFKA_BOOTSTRAP_SERVERS``, and
``KAFKA_INGEST_PG_DSN``. A missing one is an error naming it; nothing falls back to a
default address or credential. ``run``, ``backfill`` and ``replay-dlq`` call exactly the
functions the DAG tasks call, and their arguments go through the same typed requests as
the trigger forms, so the CLI and the UI reject the same forms with the same messages.

Commands of installed extensions (the development tooling's ``stack``, ``demo`` and
``produce-sample``) are added through the ``kafka_ingest.commands`` entry point.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import entry_points
from typing import Any

from kafka_ingest.backfill import require_window, run_backfill
from kafka_ingest.clients import KafkaClients
from kafka_ingest.config import get_pipeline, load_pipelines, pool_import_document
from kafka_ingest.contracts import json_schema
from kafka_ingest.db import Database, OffsetsRepository, grant_runtime, lock_partition, migrate
from kafka_ingest.errors import IngestError, SettingsError, TriggerParamsError
from kafka_ingest.ingest import run_ingest
from kafka_ingest.reader import partitions_of, watermarks
from kafka_ingest.replay import run_replay
from kafka_ingest.requests import ingest_request, replay_request
from kafka_ingest.status import lag, pipeline_status, status_rows
from kafka_ingest.topics import create_pipeline_topics

log = logging.getLogger("kafka_ingest")


class MissingSetting(SettingsError):
    """A setting the command needs is not in the environment."""

    def __init__(self, *names: str, what: str) -> None:
        super().__init__(f"set {' or '.join(names)} ({what}); nothing is assumed")


def kafka_clients() -> KafkaClients:
    """Kafka clients from ``KAFKA_INGEST_KAFKA_CONFIG`` or ``KAFKA_BOOTSTRAP_SERVERS``."""
    raw = os.environ.get("KAFKA_INGEST_KAFKA_CONFIG")
    if raw:
        try:
            config = json.loads(raw)
        except ValueError:
            raise ValueError("KAFKA_INGEST_KAFKA_CONFIG is not a JSON object") from None
        if not isinstance(config, dict):
            raise ValueError("KAFKA_INGEST_KAFKA_CONFIG is not a JSON object")
        return KafkaClients(config)
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not servers:
        raise MissingSetting("KAFKA_INGEST_KAFKA_CONFIG", "KAFKA_BOOTSTRAP_SERVERS",
                             what="the Kafka cluster to use")
    return KafkaClients({"bootstrap.servers": servers})


def database() -> Database:
    """The pipelines' database from ``KAFKA_INGEST_PG_DSN``."""
    dsn = os.environ.get("KAFKA_INGEST_PG_DSN")
    if not dsn:
        raise MissingSetting("KAFKA_INGEST_PG_DSN", what="the pipelines' Postgres database, "
                             "a libpq URI or key=value string")
    return Database(dsn)


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


def _print_json(data: Any) -> int:
    print(json.dumps(data, indent=2, default=str))
    return 0


# --------------------------------------------------------------------------- commands


def admin_database(dsn: str | None = None) -> Database:
    """The schema owner's database, for migrations: ``--dsn``, else
    ``KAFKA_INGEST_PG_ADMIN_DSN``, else (a single-role setup) ``KAFKA_INGEST_PG_DSN``."""
    for name, value in (("--dsn", dsn),
                        ("KAFKA_INGEST_PG_ADMIN_DSN", os.environ.get("KAFKA_INGEST_PG_ADMIN_DSN")),
                        ("KAFKA_INGEST_PG_DSN", os.environ.get("KAFKA_INGEST_PG_DSN"))):
        if value:
            log.info("migrating as the role of %s", name)
            return Database(value)
    raise MissingSetting("KAFKA_INGEST_PG_ADMIN_DSN", "--dsn", what="the schema owner's "
                         "Postgres database, for migrations")


def cmd_migrate(args: argparse.Namespace) -> int:
    with admin_database(args.dsn).session() as conn:
        applied = migrate(conn)
        if args.grant_to:
            grant_runtime(conn, args.grant_to, [p.table for p in load_pipelines().values()])
    print(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    if args.grant_to:
        print(f"granted {args.grant_to!r} the runtime privileges on the pipelines' tables")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    return _print_json(run_ingest(get_pipeline(args.pipeline), kafka_clients(), database(),
                                  run_id=args.run_id or new_run_id("cli"),
                                  workers=args.workers))


def _offset_params(args: argparse.Namespace) -> dict[str, list[int]]:
    """``--partition P --from-offset A --to-offset B`` (each repeatable, paired in order)."""
    parts, starts, ends = args.partition or [], args.from_offset or [], args.to_offset or []
    if not (len(parts) == len(starts) == len(ends)):
        raise TriggerParamsError(
            "give --partition, --from-offset and --to-offset together, once per partition "
            f"(got {len(parts)} --partition, {len(starts)} --from-offset, "
            f"{len(ends)} --to-offset)")
    if len(set(parts)) != len(parts):
        raise TriggerParamsError("each --partition may be given once")
    return {str(p): [a, b] for p, a, b in zip(parts, starts, ends, strict=True)}


def _range_params(args: argparse.Namespace) -> dict[str, Any]:
    """The range arguments as the trigger form's fields (parsed by the same model)."""
    return {"partitions": _offset_params(args) or None, "from": args.time_from,
            "to": args.time_to}


def cmd_backfill(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    request = require_window(ingest_request(_range_params(args), now=datetime.now(tz=UTC)))
    return _print_json(run_backfill(pipeline, request, kafka_clients(), database(),
                                    run_id=args.run_id or new_run_id("cli_backfill")))


def cmd_replay(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    params = {**_range_params(args), "dry_run": args.dry_run,
              "error_classes": args.error_class or [], "source_partition": args.source_partition,
              "event_id": args.event_id}
    request = replay_request(params, now=datetime.now(tz=UTC))
    return _print_json(run_replay(pipeline, request, kafka_clients(), database(),
                                  run_id=args.run_id or new_run_id("cli_replay")))


def cmd_lag(args: argparse.Namespace) -> int:
    names = [args.pipeline] if args.pipeline else sorted(load_pipelines())
    clients, db = kafka_clients(), database()
    rows: list[dict[str, Any]] = []
    for name in names:
        try:
            rows += lag(get_pipeline(name), clients, db)
        except ValueError as exc:  # topic not created yet
            print(f"{name}: {exc}", file=sys.stderr)
    print_table(rows)  # lag: from the stored offset (the truth); group_lag: what lag tools see
    for r in rows:
        if r["stored_offset"] is not None and r["group_offset"] != r["stored_offset"]:
            print(f"{r['pipeline']} {r['topic']}[{r['partition']}]: the group offset "
                  f"{r['group_offset']} differs from the stored offset {r['stored_offset']}; "
                  "the next live run re-syncs it", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """The on-call view per pipeline (the monitor DAG's rules judged now, nothing
    recorded), then the recent chunks and the dead letters. Needs only the database: without
    Kafka settings the lag is shown as not known."""
    db = database()
    pipelines = ([get_pipeline(args.pipeline)] if args.pipeline
                 else [p for _, p in sorted(load_pipelines().items())])
    try:
        clients: KafkaClients | None = kafka_clients()
    except MissingSetting as exc:
        clients = None
        print(f"kafka-ingest: lag not shown: {exc}", file=sys.stderr)
    for pipeline in pipelines:
        print("\n".join(pipeline_status(pipeline, clients, db)), end="\n\n")
    with db.session() as conn:
        runs, dead = status_rows(conn, args.pipeline, limit=args.limit)
    print("recent chunks:")
    print_table(runs)
    print("\ndead letters:")
    print_table(dead)
    return 0


def _reset_target(to: str, low: int, high: int) -> int:
    named = {"earliest": low, "latest": high}
    if to in named:
        return named[to]
    try:
        return int(to)
    except ValueError:
        raise ValueError(f"--to must be an offset, 'earliest' or 'latest', not {to!r}") from None


def cmd_reset_offsets(args: argparse.Namespace) -> int:
    """Move a partition's stored offset by hand, under its advisory lock."""
    pipeline = get_pipeline(args.pipeline)
    consumer = kafka_clients().consumer(pipeline.group_id)
    try:
        parts = partitions_of(consumer, pipeline.topic)
        if args.partition not in parts:
            raise ValueError(f"partition {args.partition} does not exist in {pipeline.topic!r} "
                             f"(partitions: {', '.join(map(str, parts))})")
        low, high = watermarks(consumer, pipeline.topic, [args.partition])[args.partition]
    finally:
        consumer.close()
    target = _reset_target(args.to, low, high)
    if not low <= target <= high:
        raise ValueError(f"offset {target} is outside [{low}, {high}] of "
                         f"{pipeline.topic}[{args.partition}]")
    if not args.yes:
        print(f"would set {pipeline.name} {pipeline.topic}[{args.partition}] to {target}; "
              "add --yes to do it")
        return 1
    db = database()
    with db.session() as conn:
        lock_partition(conn, pipeline.name, args.partition, timeout_s=db.lock_timeout_s)
        before = OffsetsRepository(conn).reset(pipeline.name, pipeline.topic, args.partition,
                                               target)
        conn.commit()
    print(f"{pipeline.name} {pipeline.topic}[{args.partition}]: {before} -> {target}")
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    pipelines = load_pipelines()
    unknown = sorted(set(args.pipelines) - set(pipelines))
    if unknown:
        raise ValueError(f"unknown pipeline(s) {', '.join(unknown)}; defined: "
                         f"{', '.join(sorted(pipelines))}")
    chosen = [pipelines[n] for n in (args.pipelines or sorted(pipelines))]
    created, existed = create_pipeline_topics(kafka_clients(), chosen)
    for topic in created:
        print(f"created {topic}")
    for topic in existed:
        print(f"already there: {topic}")
    return 0


def cmd_pools(args: argparse.Namespace) -> int:
    """The Airflow pools the pipelines name, as ``airflow pools import <file>`` reads them."""
    return _print_json(pool_import_document(load_pipelines()))


def cmd_schema(args: argparse.Namespace) -> int:
    return _print_json(json_schema(args.event_type, args.version))


# --------------------------------------------------------------------------- parser


def _add_range_args(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_argument_group(f"range ({what}): offsets or a time window, not both")
    g.add_argument("--partition", type=int, action="append", metavar="P",
                   help="partition to read (repeatable, paired with --from/--to-offset)")
    g.add_argument("--from-offset", type=int, action="append", metavar="A",
                   help="first offset, inclusive")
    g.add_argument("--to-offset", type=int, action="append", metavar="B",
                   help="end offset, exclusive")
    g.add_argument("--from", dest="time_from", metavar="T",
                   help="window start, ISO-8601 with offset, inclusive (2026-01-01T00:00:00Z)")
    g.add_argument("--to", dest="time_to", metavar="T",
                   help="window end, exclusive; not in the future")
    p.add_argument("--run-id", help="pin the run (a rerun with the same id finishes its slice)")


def _add_operator_commands(sub: Any) -> None:
    p = sub.add_parser("run", help="run one micro-batch of a pipeline (the DAG's code path)")
    p.add_argument("pipeline")
    p.add_argument("--run-id", help="pin the run (a rerun with the same id finishes its slice)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="partitions ingested at once, one process each, as the DAG's mapped "
                        "tasks (default: the number of cores; 1: one after another)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("backfill", help="re-read a source range (offsets or time) through "
                       "the ingest DAG's code path; never moves the stored offset")
    p.add_argument("pipeline")
    _add_range_args(p, "source topic")
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser("replay-dlq", help="re-validate dead letters with the current contract "
                       "and load the ones that pass (the replay DAG's code path)")
    p.add_argument("pipeline")
    p.add_argument("--dry-run", action="store_true", help="report what would happen; write "
                   "nothing")
    p.add_argument("--error-class", action="append", metavar="C",
                   help="only dead letters of this class (repeatable)")
    p.add_argument("--source-partition", type=int, metavar="P",
                   help="only dead letters from this source partition")
    p.add_argument("--event-id", metavar="ID", help="only the dead letter with this event_id")
    _add_range_args(p, "DLQ topic; default: from the replay cursor")
    p.set_defaults(func=cmd_replay)


def _add_inspection_commands(sub: Any) -> None:
    p = sub.add_parser("lag", help="stored offset, group offset, high watermark and lag")
    p.add_argument("pipeline", nargs="?")
    p.set_defaults(func=cmd_lag)

    p = sub.add_parser("status", help="the on-call view per pipeline (last run, lag, DLQ "
                       "rate, parked, last error, alert rules breached), then recent chunks "
                       "and dead letters")
    p.add_argument("pipeline", nargs="?")
    p.add_argument("--limit", type=int, default=10)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("reset-offsets", help="set a partition's stored offset by hand")
    p.add_argument("pipeline")
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--to", required=True, help="an offset, 'earliest' or 'latest'")
    p.add_argument("--yes", action="store_true", help="do it (otherwise only say what)")
    p.set_defaults(func=cmd_reset_offsets)

    p = sub.add_parser("topics", help="create the pipelines' source and dead-letter topics")
    topics_sub = p.add_subparsers(dest="topics_command", required=True)
    p = topics_sub.add_parser("create", help="create the missing topics of the named pipelines "
                              "(all by default) with their partitions and replication factor")
    p.add_argument("pipelines", nargs="*", metavar="PIPELINE")
    p.set_defaults(func=cmd_topics_create)

    p = sub.add_parser("pools", help="print the Airflow pools the pipelines name (JSON for "
                       "`airflow pools import`)")
    p.set_defaults(func=cmd_pools)

    p = sub.add_parser("schema", help="print a contract's JSON Schema")
    p.add_argument("event_type")
    p.add_argument("version", type=int)
    p.set_defaults(func=cmd_schema)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-ingest", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("migrate", help="create or upgrade the schema (as the owner role)")
    p.add_argument("--dsn", help="the owner's DSN (default: $KAFKA_INGEST_PG_ADMIN_DSN)")
    p.add_argument("--grant-to", metavar="ROLE",
                   help="grant this runtime role the DML the pipelines need, and no more")
    p.set_defaults(func=cmd_migrate)
    _add_operator_commands(sub)
    _add_inspection_commands(sub)
    for extension in entry_points(group="kafka_ingest.commands"):
        extension.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except (IngestError, ValueError) as exc:
        print(f"kafka-ingest: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
