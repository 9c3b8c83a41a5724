"""The commands that look: ``lag``, ``status`` (the on-call view), the Prometheus
``exporter`` and the ``alert-rules`` file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kafka_ingest.cli.settings import MissingSetting, database, kafka_clients, print_table
from kafka_ingest.config import get_pipeline, load_pipelines
from kafka_ingest.errors import TopicMissing
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.ops import alert_rules
from kafka_ingest.ops.lag import LagRow, lag
from kafka_ingest.ops.observe import SnapshotCache, Sources, snapshot
from kafka_ingest.ops.status import pipeline_status, status_rows


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


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve every pipeline's Prometheus metrics on ``/metrics`` until stopped."""
    # prometheus_client only here: importing it is a tenth of every other command's start
    from kafka_ingest.ops.metrics import serve

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


def add_commands(sub: Any) -> None:
    """``lag``, ``status``, ``exporter``, ``alert-rules``."""
    p = sub.add_parser("lag", help="stored offset, group offset, high watermark and lag")
    p.add_argument("pipeline", nargs="?")
    p.set_defaults(func=cmd_lag)

    p = sub.add_parser("status", help="the on-call view per pipeline (last run, lag, DLQ "
                       "rate, parked, last error, alert rules breached), then recent chunks "
                       "and dead letters")
    p.add_argument("pipeline", nargs="?")
    p.add_argument("--limit", type=int, default=10)
    p.set_defaults(func=cmd_status)

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
