"""Ingest benchmark: events/s read -> committed in Postgres, peak memory and CPU, per path.

Usage (the local stack is started if it is not running)::

    python benchmarks/bench_ingest.py [--events 200000] [--chunk-size 20000]
                                      [--partitions 3] [--repeat 3] [--no-parallel]
                                      [--peers] [--smoke] [--only KEY,...]
                                      [--scale | --scale-only] [--scale-sizes N,...]
                                      [--scale-partitions P,...]

One run produces the sample once (telemetry events, every poison pill once, so the DLQ
path runs) to a fresh random topic, then measures every path on that same data, each in
its own freshly spawned process so peak RSS (``VmHWM``) and CPU seconds are that path's
alone:

- ``A  raw read``: ``reader.read_range`` over each partition, nothing else (Kafka's ceiling);
- ``B  naive loader`` (``peers/naive.py``): ``json.loads`` + ``executemany(INSERT ... ON
  CONFLICT DO NOTHING)`` per chunk, what a simple DAG does (no DLQ, no offsets, no audit;
  it drops what it cannot load, with a hand-written guard for values Postgres would
  reject);
- ``project``: ``ingest.plan_run`` + ``ingest.ingest_range`` per range, the DAG's path,
  ranges one after another (as ``kafka-ingest run`` does);
- ``project, parallel``: the same, one process per range started together (as mapped tasks
  on separate workers);
- ``validate only`` / ``sink only``: ``validate.validate_chunk`` and ``the table writer's upsert``
  (+ COMMIT) timed alone; reading (and validating, for the sink) is done but not timed;
- ``kafka-ingest (avro)`` (``avro_rows.py``): the project row's child on the same events
  Avro-encoded (confluent-kafka's ``AvroSerializer``, a schema in the stack's registry,
  which is started if needed), with its ratio to the JSON row, and ``validate only, avro``:
  where ``validate_chunk``'s time goes per stage, Avro beside JSON.

``--peers`` adds, on the same sample (``peers/``, one module a peer): a plain binary COPY
ceiling, Kafka
Connect + the Debezium JDBC sink (fresh JVM and warm worker), Spark Structured Streaming
(``availableNow``, ``foreachBatch`` + JDBC; fresh JVM and warm session; pyspark is
pip-installed on first use), the Airflow provider's ``ConsumeFromTopicOperator`` (per
message and per batch) and the seeds' poll/commit loop (first 2,000 messages only).
``--scale`` adds the project path at 0.1M, 1M and 3M events and at 1, 2 and 3 partitions.
``--smoke``: tiny sizes as a check of every path; the exit status is 1 if any run failed or
loaded the wrong rows (so it is for every invocation).

This script chooses the rows and runs them; what they share (the children, the CPU and
memory figures, the checks, the tables) is ``harness.py``, the project's rows
``project_rows.py``. Why spawn and not fork: the parent holds librdkafka clients
(threads); forking them is unsafe, and a forked child would inherit the parent's memory
high-water mark.
Every run is checked against what the sample promised (rows, duplicates, dead letters,
tombstones) before its figure is accepted: a fast wrong run is not a result.
The database and topics are created for the run and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

import avro_rows
import harness
import mirror_rows
import peers
from harness import BASE_PIPELINE, RESULTS, Bench, Measure, Target, pipeline_of
from peers import naive
from project_rows import (
    measure_parallel,
    measure_project,
    measure_read,
    measure_sink,
    measure_validate,
)

from kafka_ingest.config import load_pipelines
from kafka_ingest.kafka.clients import KafkaClients


def _int_list(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="valid events to produce")
    p.add_argument("--chunk-size", type=int, default=20_000)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each path; the median run is reported (default 3)")
    p.add_argument("--no-parallel", action="store_true",
                   help="skip the one-process-per-range project run")
    p.add_argument("--peers", action="store_true",
                   help="add the peers (benchmarks/peers/): COPY ceiling, Kafka Connect + "
                        "Debezium JDBC sink, Spark Structured Streaming, the Airflow provider's "
                        "operator, the seeds' loop")
    p.add_argument("--only", type=lambda text: [x.strip() for x in text.split(",")],
                   default=None, help="comma-separated path keys to run (e.g. project,"
                   "connect_warm); default all. Keys: "
                   + ", ".join(k for k, _ in [*PATHS, *avro_rows.PATHS, *peers.PATHS,
                                                *mirror_rows.PATHS]))
    p.add_argument("--skip", type=lambda text: [x.strip() for x in text.split(",")],
                   default=[], help="comma-separated path keys to leave out (the test "
                   "command's smoke leaves out the Spark rows: pyspark is a 450 MB install)")
    p.add_argument("--seeds-cap", type=int, default=peers.seeds.SEEDS_CAP,
                   help=f"messages the seeds' loop runs on (default {peers.seeds.SEEDS_CAP})")
    p.add_argument("--smoke", action="store_true",
                   help="a check, not a measurement: results go to results/smoke.json; the "
                        "exit status says whether every path ran and loaded the right rows")
    p.add_argument("--scale", action="store_true",
                   help="also run the project path at --scale-sizes events (on --partitions) "
                        "and at --scale-partitions partitions (on --events); long")
    p.add_argument("--scale-only", action="store_true", help="--scale without the comparison")
    p.add_argument("--scale-sizes", type=_int_list, default=[100_000, 1_000_000, 3_000_000],
                   help="comma-separated event counts (default 100000,1000000,3000000)")
    p.add_argument("--scale-partitions", type=_int_list, default=[1, 2, 3],
                   help="comma-separated partition counts (default 1,2,3)")
    args = p.parse_args(argv)
    args.scale = args.scale or args.scale_only
    return args


def prepare(args: argparse.Namespace, clients: KafkaClients, dsn: str, tag: str,
            topics: tuple[str, str]) -> Bench:
    """Produce the sample once; every path reads this same data."""
    from kafka_ingest.kafka.metadata import partitions_of, watermarks
    from kafka_ingest_dev.samples import produce_sample

    source, dlq = topics
    base = load_pipelines()[BASE_PIPELINE].model_dump(mode="json", exclude={"name"})
    body = {**base, "topic": source, "dlq_topic": dlq, "chunk_size": args.chunk_size,
            "max_records_per_partition": 100_000_000}
    t0 = time.perf_counter()
    sample = produce_sample(clients, pipeline_of((BASE_PIPELINE, body)), count=args.events,
                            poison=1, partitions=args.partitions, tag=tag)
    print(f"produced {sample['produced']:,} messages to {source} in "
          f"{time.perf_counter() - t0:.1f}s; expect {sample['expect']}", flush=True)
    consumer = clients.consumer(f"bench-{tag}-plan")
    try:
        marks = watermarks(consumer, source, partitions_of(consumer, source))
    finally:
        consumer.close()
    target = Target(clients.config, dsn, source, marks, args.chunk_size, f"bench-{tag}-read")
    return Bench(args, clients, dsn, tag, source, dlq, sample["expect"], sample["produced"],
                 target, body)


PATHS: list[tuple[str, Callable[[Bench, int], Measure]]] = [
    ("read", measure_read),
    ("naive", naive.measure_naive),
    ("project", measure_project),
    ("parallel", measure_parallel),
    ("validate", measure_validate),
    ("sink", measure_sink),
]


def _paths(b: Bench) -> list[tuple[str, Callable[[Bench, int], Measure]]]:
    paths: list[tuple[str, Callable[[Bench, int], Measure]]] = []
    for key, fn in PATHS:
        if not (key == "parallel" and b.args.no_parallel):
            paths.append((key, fn))
        if key == "project":  # the Avro rows beside the JSON one they are compared with
            paths += avro_rows.PATHS
    if b.args.peers:
        paths += peers.PATHS
    if b.mirror is not None:
        paths += mirror_rows.PATHS
    return [(k, f) for k, f in paths
            if (b.args.only is None or k in b.args.only) and k not in b.args.skip]


def measure_all(b: Bench) -> tuple[list[Measure], list[str]]:
    """Each path ``--repeat`` times, interleaved so drift hits every path alike. A path
    that fails (or loads the wrong rows) is reported and the others go on."""
    runs: dict[str, list[Measure]] = {}
    failures: list[str] = []
    for rep in range(1, b.args.repeat + 1):
        for key, fn in _paths(b):
            try:
                m = fn(b, rep)
            except Exception as exc:
                failures.append(f"run {rep} {key}: {type(exc).__name__}: {exc}")
                print(f"  run {rep} {key}: FAILED: {traceback.format_exc()}", flush=True)
                continue
            runs.setdefault(key, []).append(m)
            print(f"  run {rep} {m.path}: {m.events:,} in {m.seconds:.2f}s = "
                  f"{m.rate:,.0f}/s, peak RSS {m.peak_rss_mb:.0f} MB, CPU {m.cpu_s:.1f}s",
                  flush=True)
    return [harness.median_of(v) for v in runs.values()], failures


def scale_point(args: argparse.Namespace, clients: KafkaClients, admin_dsn: str, *,
                events: int, partitions: int, parallel: bool,
                sweep: str) -> list[dict[str, Any]]:
    """The project path (and, if asked, the parallel one) on a fresh sample of ``events``
    on ``partitions`` partitions: median of ``--repeat`` runs, each checked."""
    point = argparse.Namespace(**{**vars(args), "events": events, "partitions": partitions})
    tag = uuid.uuid4().hex[:8]
    measures: dict[str, list[Measure]] = {}
    with harness.fresh_database(admin_dsn) as dsn, \
            harness.fresh_topics(clients, tag, partitions) as topics:
        b = prepare(point, clients, dsn, tag, topics)
        for rep in range(1, args.repeat + 1):
            for key, fn in [("project", measure_project),
                            *([("parallel", measure_parallel)] if parallel else [])]:
                m = fn(b, rep)
                harness.drop_tables(dsn, f"bench_{key}_")  # a 3M-row table per run adds up
                measures.setdefault(key, []).append(m)
                print(f"  scale {events:,} events / {partitions} partitions, run {rep} "
                      f"{m.path}: {m.seconds:.2f}s = {m.rate:,.0f}/s, "
                      f"{m.seconds / m.events * 1e5:.2f} s per 100k", flush=True)
    return [{"sweep": sweep, "events": events, "partitions": partitions,
             "measure": harness.median_of(runs)} for runs in measures.values()]


def run_scale(args: argparse.Namespace, clients: KafkaClients,
              admin_dsn: str) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    for n in args.scale_sizes:
        points += scale_point(args, clients, admin_dsn, events=n, partitions=args.partitions,
                              parallel=False, sweep="events")
    for parts in args.scale_partitions:
        points += scale_point(args, clients, admin_dsn, events=args.events, partitions=parts,
                              parallel=not args.no_parallel, sweep="partitions")
    return points


def prepare_extras(b: Bench, later: ExitStack, registry_url: str | None) -> None:
    """The data of the rows beside the sample's: the Avro topic, the peers' topics and jars,
    the mirror's change events (each removed when ``later`` closes)."""
    if registry_url is not None:
        b.avro = later.enter_context(avro_rows.avro_topic(b, registry_url))
    if b.args.peers:
        b.peers = peers.prepare(b)
    if mirror_rows.wanted(b):
        b.mirror = later.enter_context(mirror_rows.mirror_topic(b))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    avro = not args.scale_only and avro_rows.wanted(args.only)
    env = harness.up(registry=avro)  # into os.environ too: the children see the stack
    clients = KafkaClients({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]})
    admin_dsn = env["KAFKA_INGEST_PG_DSN"]
    tag = uuid.uuid4().hex[:8]
    load_before = [round(x, 2) for x in os.getloadavg()]  # other work on the box skews figures
    command = "python benchmarks/bench_ingest.py " + " ".join(sys.argv[1:] if argv is None
                                                              else argv)
    started = time.monotonic()
    results: list[Measure] = []
    failures: list[str] = []
    info: dict[str, Any] = {}
    if not args.scale_only:
        with harness.fresh_database(admin_dsn) as dsn, \
                harness.fresh_topics(clients, tag, args.partitions) as topics, \
                ExitStack() as later:
            b = prepare(args, clients, dsn, tag, topics)
            prepare_extras(b, later, env[avro_rows.REGISTRY_ENV] if avro else None)
            results, failures = measure_all(b)
            info = {"produced": b.produced, "expect": b.expect}
            if b.avro is not None:
                info["avro_expect"] = b.avro.expect
            if b.mirror is not None:
                info["mirror"] = b.mirror.info()
    scale = run_scale(args, clients, admin_dsn) if args.scale else []
    info = {"command": command.strip(), "when": datetime.now(tz=UTC).isoformat(),
            "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
            "machine": {**harness.machine(), **harness.server_versions(admin_dsn)}, **info,
            "args": vars(args), "wall_s": round(time.monotonic() - started, 1),
            "failures": failures}
    baseline = next((m for m in results if m.path.startswith("B ")), None)
    avro_vs_json, mirror_vs_sink = avro_rows.compare(results), mirror_rows.compare(results)
    info.update({k: v for k, v in (("avro_vs_json", avro_vs_json),
                                   ("mirror_vs_jdbc_sink", mirror_vs_sink)) if v})
    print(f"\n{info['command']}\nmachine: {json.dumps(info['machine'])}\n"
          f"load average (1, 5, 15 min) before {load_before}, after {info['load_after']}\n")
    if results:
        print(harness.table(results, baseline))
    if avro_vs_json:
        print("\n" + avro_rows.report(avro_vs_json, smoke=args.smoke))
    if mirror_vs_sink:
        print("\n" + mirror_rows.report(mirror_vs_sink, smoke=args.smoke))
    if scale:
        print("\n" + harness.scale_table(scale))
    out = RESULTS.with_name("smoke.json" if args.smoke else
                            "scale.json" if args.scale_only else RESULTS.name)
    harness.write_json(out, results, info, scale)
    print(f"\nwritten: {out} (wall {info['wall_s']:.0f}s)")
    if failures:
        print(f"\n{len(failures)} run(s) FAILED:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
