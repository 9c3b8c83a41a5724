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

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from importlib.metadata import entry_points
from typing import Any

import yaml

from kafka_ingest.config import (
    Format,
    Pipeline,
    get_pipeline,
    load_declared_contracts,
    load_pipelines,
    pool_import_document,
)
from kafka_ingest.contracts import json_schema
from kafka_ingest.db import (
    Database,
    IncarnationsRepository,
    OffsetsRepository,
    grant_runtime,
    lock_partition,
    migrate,
    unlock_partition,
)
from kafka_ingest.db.tables import TablePlan, apply_pipelines, plan_tables, runtime_tables
from kafka_ingest.decode.codecs import codec_for
from kafka_ingest.decode.schemas import contract_from_schema
from kafka_ingest.engine.backfill import require_window, run_backfill
from kafka_ingest.engine.ingest import run_ingest
from kafka_ingest.engine.replay import run_replay
from kafka_ingest.errors import (
    IngestError,
    PrivilegeMissing,
    SettingsError,
    TopicMissing,
    TriggerParamsError,
)
from kafka_ingest.kafka.clients import LIBRDKAFKA_LOG, LIBRDKAFKA_ONCE, KafkaClients
from kafka_ingest.kafka.metadata import partitions_of, watermarks
from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry
from kafka_ingest.kafka.topics import create_pipeline_topics
from kafka_ingest.ops import alert_rules
from kafka_ingest.ops.lag import LagRow, lag
from kafka_ingest.ops.metrics import serve
from kafka_ingest.ops.observe import SnapshotCache, Sources, snapshot
from kafka_ingest.ops.status import pipeline_status, status_rows
from kafka_ingest.requests import ingest_request, replay_request

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
            return _database(name, value)
    raise MissingSetting("KAFKA_INGEST_PG_ADMIN_DSN", "--dsn", what="the schema owner's "
                         "Postgres database, for migrations")


def grant_target(given: str | None) -> tuple[str | None, str]:
    """The runtime role ``migrate`` grants to, and where it was named: ``--grant-to``
    (``given``), else ``KAFKA_INGEST_PG_GRANT_TO``; an empty value means none."""
    if given is not None:
        return given or None, "--grant-to"
    return os.environ.get(GRANT_TO_ENV) or None, GRANT_TO_ENV


def cmd_migrate(args: argparse.Namespace) -> int:
    """The bookkeeping schema, every pipeline's tables, then the grants."""
    return _apply(args, load_pipelines().values(), show_migrations=True)


def _apply(args: argparse.Namespace, pipelines: Iterable[Pipeline], *,
           show_migrations: bool) -> int:
    role, source = grant_target(args.grant_to)
    chosen = list(pipelines)
    with _as_owner(), admin_database(args.dsn).session() as conn:
        applied = migrate(conn)
        plans = apply_pipelines(conn, chosen)
        granted = _grant(conn, role, chosen)
    if show_migrations:
        print(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    for plan in plans:
        for change in plan.changes:
            print(f"applied ({plan.pipeline}): {change.why}: "
                  f"{' '.join(change.statement.split())}")
        for note in plan.notes:
            print(f"note ({plan.pipeline}): {note}")
        if not plan.changes:
            print(f"{plan.pipeline}: up to date")
    _print_grants(role, source, granted)
    return 0


@contextlib.contextmanager
def _as_owner() -> Iterator[None]:
    try:
        yield
    except PrivilegeMissing as exc:  # the grant advice does not apply to the owner's job
        raise PrivilegeMissing(exc.role, exc.detail, on=exc.on, fix=(
            "migrations run as the schema's owner: point KAFKA_INGEST_PG_ADMIN_DSN (or "
            "--dsn) at that role")) from exc


def _grant(conn: Any, role: str | None, pipelines: Iterable[Pipeline]) -> list[str]:
    if not role:
        return []
    tables, deleting = runtime_tables(pipelines)
    return grant_runtime(conn, role, tables, deleting=deleting)


def _chosen(names: Sequence[str]) -> list[Pipeline]:
    pipelines = load_pipelines()
    unknown = sorted(set(names) - set(pipelines))
    if unknown:
        raise ValueError(f"unknown pipeline(s) {', '.join(unknown)}; defined: "
                         f"{', '.join(sorted(pipelines))}")
    return [pipelines[n] for n in (names or sorted(pipelines))]


def _print_plan(plan: TablePlan) -> None:
    if not plan.changes and not plan.drift:
        print(f"-- {plan.pipeline}: up to date")
        return
    for change in plan.changes:
        print(f"-- {plan.pipeline}: {change.why}\n{change.statement};")
    for note in plan.notes:
        print(f"-- note: {note}")
    for problem in plan.drift:
        print(f"-- DRIFT (not changed by the planner): {problem}")


def cmd_schema_plan(args: argparse.Namespace) -> int:
    """The DDL each pipeline's tables need, and the drift nothing may fix on its own."""
    with admin_database(args.dsn).session() as conn:
        plans = [plan_tables(conn, p) for p in _chosen(args.pipelines)]
    for plan in plans:
        _print_plan(plan)
    return 2 if any(p.drift for p in plans) else 0


def cmd_schema_apply(args: argparse.Namespace) -> int:
    """Apply the plans as the migrating role, each in a transaction, recorded."""
    return _apply(args, _chosen(args.pipelines), show_migrations=False)


def _print_grants(role: str | None, source: str, granted: list[str]) -> None:
    if role:
        print(f"granted {role!r} (from {source}) the runtime privileges:")
        for line in granted:
            print(f"    {line}")
    else:
        print(f"no runtime role granted (neither --grant-to nor {GRANT_TO_ENV} names one): "
              "the pipelines must run as this role or one granted otherwise")


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
    """The lag of one pipeline, or of all: then one whose topic is missing is named on
    stderr, the others are shown, and the exit status is 2 (as ``ls`` does)."""
    if args.pipeline:
        pipelines = [get_pipeline(args.pipeline)]
    else:
        pipelines = [p for _, p in sorted(load_pipelines().items())]
    clients, db = kafka_clients(), database()
    rows: list[LagRow] = []
    missing = 0
    for pipeline in pipelines:
        try:
            rows += lag(pipeline, clients, db)
        except TopicMissing as exc:  # topic not created yet
            if args.pipeline:
                raise
            missing += 1
            print(f"kafka-ingest: {pipeline.name}: {exc}", file=sys.stderr)
    # lag: from the stored offset (the truth); group_lag: what lag tools see
    print_table([r.to_dict() for r in rows])
    for r in rows:
        if r.stored_offset is not None and r.group_offset != r.stored_offset:
            print(f"{r.pipeline} {r.topic}[{r.partition}]: the group offset "
                  f"{r.group_offset} differs from the stored offset {r.stored_offset}; "
                  "the next live run re-syncs it", file=sys.stderr)
    return 2 if missing else 0


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
    """Move stored offsets by hand, each partition under its advisory lock. The offsets are
    stored as offsets of the topic there now: after a topic was deleted and created again,
    this is what starts reading the new one (its records then count as newer than every
    row the old topic left)."""
    pipeline = get_pipeline(args.pipeline)
    topic = pipeline.dlq_topic if args.dlq else pipeline.topic
    lock = f"{pipeline.name}:replay" if args.dlq else pipeline.name
    clients = kafka_clients()
    wait_s = clients.request_timeout_s  # a cluster out of reach fails after its time-out
    db = database()
    consumer = clients.consumer(pipeline.group_id)
    try:
        parts = partitions_of(consumer, topic, timeout_s=wait_s)
        gone = _vanished(db, pipeline.name, topic, parts, args.partition)
        chosen = parts if args.all else [p for p in [args.partition] if p not in gone]
        if args.partition is not None and args.partition not in [*parts, *gone]:
            raise ValueError(f"partition {args.partition} does not exist in {topic!r} "
                             f"(partitions: {', '.join(map(str, parts))})")
        marks = watermarks(consumer, topic, chosen, timeout_s=wait_s)
    finally:
        consumer.close()
    topic_id = clients.topic_id(topic)
    targets: dict[int, int | None] = {p: _reset_target(args.to, *marks[p]) for p in chosen}
    for partition, target in targets.items():
        low, high = marks[partition]
        if target is not None and not low <= target <= high:
            raise ValueError(f"offset {target} is outside [{low}, {high}] of "
                             f"{topic}[{partition}]")
    # a stored offset of a partition the topic no longer has (re-created with fewer) goes
    targets.update(dict.fromkeys(gone))
    if not args.yes:
        for partition, target in targets.items():
            print(f"would {'set' if target is not None else 'remove'} {pipeline.name} "
                  f"{topic}[{partition}]{f' to {target}' if target is not None else ''}"
                  f"{'' if target is not None else ' (the topic has no such partition)'}")
        print("add --yes to do it")
        return 1
    with db.session() as conn:
        for partition, target in targets.items():
            lock_partition(conn, lock, partition, timeout_s=db.lock_timeout_s)
            try:
                offsets = OffsetsRepository(conn)
                before = (offsets.reset(pipeline.name, topic, partition, target, topic_id)
                          if target is not None
                          else offsets.remove(pipeline.name, topic, partition))
                IncarnationsRepository(conn).of(topic, topic_id)
                conn.commit()
            finally:
                unlock_partition(conn, lock, partition)
            print(f"{pipeline.name} {topic}[{partition}]: {before} -> "
                  f"{target if target is not None else 'removed (no such partition now)'}")
    return 0


def _vanished(db: Any, pipeline: str, topic: str, parts: Sequence[int],
              partition: int | None) -> list[int]:
    """The partitions with a stored offset that the topic no longer has (deleted and created
    again with fewer): all of them, or ``partition`` if it is one."""
    with db.session() as conn:
        stored = OffsetsRepository(conn).topic_ids(pipeline, topic)
    return sorted(p for p in stored if p not in parts and partition in (None, p))


def cmd_topics_create(args: argparse.Namespace) -> int:
    created, existed = create_pipeline_topics(kafka_clients(), _chosen(args.pipelines))
    for topic in created:
        print(f"created {topic}")
    for topic in existed:
        print(f"already there: {topic}")
    return 0


def cmd_pools(args: argparse.Namespace) -> int:
    """The Airflow pools the pipelines name, as ``airflow pools import <file>`` reads them."""
    return _print_json(pool_import_document(load_pipelines()))


def cmd_schema_from_registry(args: argparse.Namespace) -> int:
    """A declared contract (YAML for the pipelines file) from a subject's latest schema."""
    settings = registry_settings()
    if settings is None:
        raise MissingSetting("KAFKA_INGEST_SCHEMA_REGISTRY_URL",
                             "KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", what="the schema registry")
    codec = codec_for(args.format)
    registry = SchemaRegistry(settings)
    try:
        schema = codec.latest(registry, args.subject)
    finally:
        registry.close()
    if schema is None:
        raise SettingsError(f"subject {args.subject!r} is not registered at {settings.url}")
    if not codec.reads(schema):
        raise SettingsError(f"subject {args.subject!r} holds a {schema.schema_type} schema, "
                            f"not {codec.format.value}")
    body, skipped = contract_from_schema(codec.format, schema,
                                         text_max_length=args.text_max_length,
                                         record=args.record)
    print(f"# kafka-ingest schema from-registry {args.subject} --format {codec.format.value}: "
          f"subject version {schema.version}, schema id {schema.schema_id}")
    print(f"# text fields without a bound got max_length {args.text_max_length}: adjust them "
          "to your data (each is its column's width)")
    for line in skipped:
        print(f"# left out: {line}")
    print(yaml.safe_dump({"contracts": {args.event_type: body}}, sort_keys=False), end="")
    return 0


def cmd_schema_show(args: argparse.Namespace) -> int:
    return _print_json(json_schema(args.event_type, args.version, load_declared_contracts()))


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


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve every pipeline's Prometheus metrics on ``/metrics`` until stopped."""
    clients, bounded = kafka_clients(), database().bounded(args.timeout)
    pipelines = [p for _, p in sorted(load_pipelines().items())]
    sources = Sources(clients=lambda _p: clients, database=lambda _p: bounded)
    cache = SnapshotCache(lambda: snapshot(pipelines, sources, timeout_s=args.timeout),
                          max_age_s=args.cache)
    serve(cache, host=args.host, port=args.port)
    return 0


def cmd_alert_rules(args: argparse.Namespace) -> int:
    """Print (or write) the Prometheus rules file of the pipelines' alerts."""
    text = alert_rules.render(load_pipelines().values(), hold=getattr(args, "for"),
                              interval=args.check_interval)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def _add_observability_commands(sub: Any) -> None:
    p = sub.add_parser("exporter", help="serve every pipeline's Prometheus metrics "
                       "(lag, ledger counters, DLQ, freshness) on /metrics")
    p.add_argument("--port", type=int, default=9464)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: loopback only)")
    p.add_argument("--cache", type=float, default=10.0, metavar="SECONDS",
                   help="serve one look at the pipelines for this long (default: 10)")
    p.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                   help="the bound of each request to Kafka and Postgres (default: 3)")
    p.set_defaults(func=cmd_exporter)

    p = sub.add_parser("alert-rules", help="print the Prometheus rules file of the "
                       "pipelines' alerts blocks (the monitor DAG's rules)")
    p.add_argument("--for", default="5m", metavar="DURATION",
                   help="how long a breach lasts before its alert fires (default: 5m)")
    p.add_argument("--check-interval", default=alert_rules.CHECK_INTERVAL, metavar="DURATION",
                   help="the lag-growth rule's step (default: the monitor DAG's 5m)")
    p.add_argument("-o", "--output", help="write the rules to this file")
    p.set_defaults(func=cmd_alert_rules)


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

    p = sub.add_parser("reset-offsets", help="set a partition's stored offset by hand (also "
                       "what starts reading a topic that was deleted and created again)")
    p.add_argument("pipeline")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--partition", type=int)
    which.add_argument("--all", action="store_true", help="every partition of the topic")
    p.add_argument("--dlq", action="store_true",
                   help="the replay cursor on the dead-letter topic, not the ingest one")
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

    p = sub.add_parser("schema", help="contracts and the tables made from them")
    schema_sub = p.add_subparsers(dest="schema_command", required=True)
    p = schema_sub.add_parser("show", help="print a contract's JSON Schema")
    p.add_argument("event_type")
    p.add_argument("version", type=int)
    p.set_defaults(func=cmd_schema_show)
    p = schema_sub.add_parser("from-registry", help="print a declared contract (YAML for "
                              "the pipelines file) made from a subject's latest schema")
    p.add_argument("subject")
    p.add_argument("--format", choices=[f.value for f in Format if f.registry],
                   default=Format.AVRO.value)
    p.add_argument("--event-type", required=True, help="the contract's name")
    p.add_argument("--text-max-length", type=int, default=256,
                   help="the bound of text fields whose schema gives none")
    p.add_argument("--record", help="Protobuf: the message of the file to read (its full "
                   "name; default: the first)")
    p.set_defaults(func=cmd_schema_from_registry)
    for name, func, doc in (
            ("plan", cmd_schema_plan, "print the DDL the pipelines' tables need (all by "
             "default) and any drift; exit 2 when there is drift"),
            ("apply", cmd_schema_apply, "apply that DDL as the migrating role, recorded in "
             "schema_changes, then grant the runtime role")):
        p = schema_sub.add_parser(name, help=doc)
        p.add_argument("pipelines", nargs="*", metavar="PIPELINE")
        p.add_argument("--dsn", help="the owner's DSN (default: $KAFKA_INGEST_PG_ADMIN_DSN)")
        if name == "apply":
            p.add_argument("--grant-to", metavar="ROLE", help="the runtime role to grant "
                           f"(default: ${GRANT_TO_ENV}; empty: none)")
        p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-ingest", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("migrate", help="create or upgrade the schema and every pipeline's "
                       "tables (as the owner role), then grant the runtime role")
    p.add_argument("--dsn", help="the owner's DSN (default: $KAFKA_INGEST_PG_ADMIN_DSN)")
    p.add_argument("--grant-to", metavar="ROLE",
                   help="grant this runtime role the DML the pipelines need, and no more "
                        f"(default: ${GRANT_TO_ENV}, which `stack env --secure` sets; an "
                        "empty value grants nothing)")
    p.set_defaults(func=cmd_migrate)
    _add_operator_commands(sub)
    _add_inspection_commands(sub)
    _add_observability_commands(sub)
    for extension in entry_points(group="kafka_ingest.commands"):
        extension.load()(sub)
    return parser




def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose:  # -v shows every repeat
        LIBRDKAFKA_LOG.removeFilter(LIBRDKAFKA_ONCE)
    else:
        LIBRDKAFKA_LOG.addFilter(LIBRDKAFKA_ONCE)
    try:
        return int(args.func(args))
    except (IngestError, ValueError) as exc:
        # One line, whatever the message: a server's or a parser's may span several.
        text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"kafka-ingest: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
