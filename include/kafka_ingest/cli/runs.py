"""The commands that read a topic: ``run``, ``backfill`` and ``replay-dlq`` call exactly the
functions the DAG tasks call, their arguments parsed by the trigger forms' typed requests
(so the CLI and the UI refuse the same forms with the same messages); ``reset-offsets``
moves stored offsets by hand."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka_ingest.cli.settings import database, kafka_clients, new_run_id, print_json
from kafka_ingest.config import get_pipeline
from kafka_ingest.db import (
    IncarnationsRepository,
    OffsetsRepository,
    lock_partition,
    unlock_partition,
)
from kafka_ingest.engine.backfill import require_window, run_backfill
from kafka_ingest.engine.ingest import run_ingest
from kafka_ingest.engine.replay import run_replay
from kafka_ingest.errors import TriggerParamsError
from kafka_ingest.kafka.metadata import partitions_of, watermarks
from kafka_ingest.requests import ingest_request, replay_request


def cmd_run(args: argparse.Namespace) -> int:
    return print_json(run_ingest(get_pipeline(args.pipeline), kafka_clients(), database(),
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
    return print_json(run_backfill(pipeline, request, kafka_clients(), database(),
                                    run_id=args.run_id or new_run_id("cli_backfill")))


def cmd_replay(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    params = {**_range_params(args), "dry_run": args.dry_run,
              "error_classes": args.error_class or [], "source_partition": args.source_partition,
              "event_id": args.event_id, "identity": args.identity}
    request = replay_request(params, now=datetime.now(tz=UTC))
    return print_json(run_replay(pipeline, request, kafka_clients(), database(),
                                  run_id=args.run_id or new_run_id("cli_replay")))


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


def add_commands(sub: Any) -> None:
    """``run``, ``backfill``, ``replay-dlq``, ``reset-offsets``."""
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
    p.add_argument("--identity", metavar="ID",
                   help="only the dead letters of this identity of the pipeline's (a field's "
                        "value, several as a JSON array, the record key, or partition:offset)")
    _add_range_args(p, "DLQ topic; default: from the replay cursor")
    p.set_defaults(func=cmd_replay)

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
