"""``kafka-ingest``: the operator's command line and the local stack's front door.

Kafka and Postgres come from the environment: ``KAFKA_INGEST_KAFKA_CONFIG`` (a JSON
librdkafka dict) or ``KAFKA_BOOTSTRAP_SERVERS``, and ``KAFKA_INGEST_PG_DSN``; when they are
unset, the local stack's addresses are used (``kafka-ingest stack env`` prints them).
``run``, ``backfill`` and ``replay-dlq`` call exactly the functions the DAG tasks call.
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
from typing import Any

from kafka_ingest.config import Pipeline, get_pipeline, load_pipelines
from kafka_ingest.errors import IngestError
from kafka_ingest.reader import KafkaClients
from kafka_ingest.sink import Database, migrate

log = logging.getLogger("kafka_ingest")


def kafka_clients() -> KafkaClients:
    raw = os.environ.get("KAFKA_INGEST_KAFKA_CONFIG")
    if raw:
        return KafkaClients(json.loads(raw))
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or _stack_env()["KAFKA_BOOTSTRAP_SERVERS"]
    return KafkaClients({"bootstrap.servers": servers})


def database() -> Database:
    return Database(os.environ.get("KAFKA_INGEST_PG_DSN") or _stack_env()["KAFKA_INGEST_PG_DSN"])


def _stack_env() -> dict[str, str]:
    from kafka_ingest import stack

    return stack.env()


def _print_table(rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        print("(nothing)")
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c)).ljust(widths[c]) for c in cols))


# --------------------------------------------------------------------------- commands


def cmd_migrate(_: argparse.Namespace) -> int:
    with database().session() as conn:
        applied = migrate(conn)
    print(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    return 0


def run_once(pipeline: Pipeline, *, run_id: str | None = None,
             request: dict[str, Any] | None = None) -> dict[str, Any]:
    """Plan and ingest one micro-batch with the DAG's code path, partitions in turn."""
    from kafka_ingest.service import ingest_range, plan_run, summarize

    clients, db = kafka_clients(), database()
    run_id = run_id or f"cli__{datetime.now(tz=UTC):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"
    ranges = plan_run(pipeline, clients, db, run_id=run_id, request=request)
    reports = [ingest_range(pipeline, r, clients, db, run_id=run_id).to_dict() for r in ranges]
    return {"run_id": run_id, **summarize(reports)}


def cmd_run(args: argparse.Namespace) -> int:
    summary = run_once(get_pipeline(args.pipeline), run_id=args.run_id)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def cmd_produce_sample(args: argparse.Namespace) -> int:
    from kafka_ingest.samples import produce_sample

    result = produce_sample(kafka_clients(), get_pipeline(args.pipeline), count=args.count,
                            poison=args.poison, partitions=args.partitions)
    print(json.dumps(result, indent=2))
    return 0


def cmd_lag(args: argparse.Namespace) -> int:
    from kafka_ingest.service import lag

    names = [args.pipeline] if args.pipeline else sorted(load_pipelines())
    rows: list[dict[str, Any]] = []
    for name in names:
        try:
            rows += lag(get_pipeline(name), kafka_clients(), database())
        except ValueError as exc:  # topic not created yet
            print(f"{name}: {exc}", file=sys.stderr)
    _print_table(rows)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from kafka_ingest.status import status_rows

    with database().session() as conn:
        runs, dead = status_rows(conn, args.pipeline, limit=args.limit)
    print("recent chunks:")
    _print_table(runs)
    print("\ndead letters:")
    _print_table(dead)
    return 0


def cmd_reset_offsets(args: argparse.Namespace) -> int:
    """Move a partition's stored offset by hand, under its advisory lock."""
    from kafka_ingest.reader import partitions_of, watermarks
    from kafka_ingest.sink import OffsetsRepository, lock_partition

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
    target = {"earliest": low, "latest": high}.get(args.to)
    target = int(args.to) if target is None else target
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


def cmd_schema(args: argparse.Namespace) -> int:
    from kafka_ingest.contracts import json_schema

    print(json.dumps(json_schema(args.event_type, args.version), indent=2))
    return 0


def cmd_stack(args: argparse.Namespace) -> int:
    from kafka_ingest import stack

    return stack.main(args.rest)


def cmd_demo(args: argparse.Namespace) -> int:
    from kafka_ingest.demo import main as demo_main

    return demo_main(args)


def _extra_commands(sub: Any) -> None:
    """Commands defined next to their capability (backfill, replay), if present."""
    try:
        from kafka_ingest.replay_cli import register
    except ImportError:
        return
    register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-ingest", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stack", help="the local stack: up | down | status | env")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_stack)

    sub.add_parser("migrate", help="create or upgrade the schema").set_defaults(func=cmd_migrate)

    p = sub.add_parser("run", help="run one micro-batch of a pipeline (the DAG's code path)")
    p.add_argument("pipeline")
    p.add_argument("--run-id", help="pin the run (a rerun with the same id finishes its slice)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("produce-sample", help="produce sample events and poison pills")
    p.add_argument("pipeline")
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--poison", type=int, default=1, help="rounds of every poison-pill kind")
    p.add_argument("--partitions", type=int, default=3, help="partitions of a new topic")
    p.set_defaults(func=cmd_produce_sample)

    p = sub.add_parser("lag", help="stored offset, group offset, high watermark and lag")
    p.add_argument("pipeline", nargs="?")
    p.set_defaults(func=cmd_lag)

    p = sub.add_parser("status", help="recent chunks and dead letters")
    p.add_argument("pipeline", nargs="?")
    p.add_argument("--limit", type=int, default=10)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("reset-offsets", help="set a partition's stored offset by hand")
    p.add_argument("pipeline")
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--to", required=True, help="an offset, 'earliest' or 'latest'")
    p.add_argument("--yes", action="store_true", help="do it (otherwise only say what)")
    p.set_defaults(func=cmd_reset_offsets)

    p = sub.add_parser("schema", help="print a contract's JSON Schema")
    p.add_argument("event_type")
    p.add_argument("version", type=int)
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("demo", help="the main job end to end on the local stack")
    p.add_argument("--pipeline", default="telemetry_metrics")
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--poison", type=int, default=1)
    p.add_argument("--cli", action="store_true", help="run with the CLI instead of Airflow")
    p.set_defaults(func=cmd_demo)

    _extra_commands(sub)
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
