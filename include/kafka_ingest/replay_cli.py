"""``kafka-ingest replay-dlq`` and ``kafka-ingest backfill``: the DAGs' code paths, by hand.

Arguments become the same params dict a trigger form gives the DAG, and go through the
same checks (:func:`kafka_ingest.service.request_from_params`,
:func:`kafka_ingest.replay.replay_request`), so the CLI and the UI reject the same forms
with the same messages. Partitions run one after another in this process.
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from kafka_ingest.config import Pipeline, get_pipeline
from kafka_ingest.errors import TriggerParamsError


def _run_id(kind: str) -> str:
    return f"cli_{kind}__{datetime.now(tz=UTC):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"


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
    return {"partitions": _offset_params(args), "from": args.time_from, "to": args.time_to}


# --------------------------------------------------------------------------- replay


def replay_once(pipeline: Pipeline, params: dict[str, Any], *,
                run_id: str | None = None) -> dict[str, Any]:
    """Plan and replay one DLQ run with the DAG's code path, partitions in turn."""
    from kafka_ingest.cli import database, kafka_clients
    from kafka_ingest.replay import (
        ReplayFilters,
        plan_replay,
        replay_range,
        replay_request,
        summarize_replay,
    )

    request = replay_request(params, now=datetime.now(tz=UTC))
    filters = ReplayFilters.from_params(params)
    dry_run = bool(params.get("dry_run"))
    clients, db = kafka_clients(), database()
    run_id = run_id or _run_id("replay")
    ranges = plan_replay(pipeline, clients, db, run_id=run_id, request=request, dry_run=dry_run)
    reports = [replay_range(pipeline, r, clients, db, run_id=run_id, dry_run=dry_run,
                            filters=filters).to_dict() for r in ranges]
    return {"run_id": run_id, "filters": filters.to_dict(),
            **summarize_replay(reports, dry_run=dry_run)}


def cmd_replay(args: argparse.Namespace) -> int:
    params = {**_range_params(args), "dry_run": args.dry_run,
              "error_classes": args.error_class or [], "source_partition": args.source_partition,
              "event_id": args.event_id}
    summary = replay_once(get_pipeline(args.pipeline), params, run_id=args.run_id)
    print(json.dumps(summary, indent=2, default=str))
    return 0


# --------------------------------------------------------------------------- backfill


def backfill_once(pipeline: Pipeline, params: dict[str, Any], *,
                  run_id: str | None = None) -> dict[str, Any]:
    """A manual backfill (offsets or time) through the ingest DAG's code path."""
    from kafka_ingest.cli import run_once
    from kafka_ingest.service import request_from_params

    request = request_from_params(params, run_type="manual", interval=None,
                                  now=datetime.now(tz=UTC))
    if not request:
        raise TriggerParamsError("a backfill needs --partition P --from-offset A --to-offset B "
                                 "or --from T --to T")
    return run_once(pipeline, run_id=run_id or _run_id("backfill"), request=request)


def cmd_backfill(args: argparse.Namespace) -> int:
    summary = backfill_once(get_pipeline(args.pipeline), _range_params(args),
                            run_id=args.run_id)
    print(json.dumps(summary, indent=2, default=str))
    return 0


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


def register(sub: Any) -> None:
    """Add ``replay-dlq`` and ``backfill`` to the ``kafka-ingest`` parser."""
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

    p = sub.add_parser("backfill", help="re-read a source range (offsets or time) through "
                       "the ingest DAG's code path; never moves the stored offset")
    p.add_argument("pipeline")
    _add_range_args(p, "source topic")
    p.set_defaults(func=cmd_backfill)
