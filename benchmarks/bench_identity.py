"""Per-event cost of the identities and of flattening against the ``event_id`` path.

Usage::

    python benchmarks/bench_identity.py [--events 20000] [--rounds 7]       # validate_chunk
    python benchmarks/bench_identity.py --engine [--events 200000] [--rounds 3]

The same readings (device, epoch-seconds time, value, status, unit) in eight shapes, each
with its own declared contract and pipeline (:data:`VARIANTS`): ``event_id`` (today's
path, the default identity; ids rising with the log), ``event_id_unordered`` (the same
path, ids in no order with the log, as uuid4s are: a chunk is written in key order, so
this is the cost of the data's order, not of an identity), ``event_id_like_several``
(the same path, a text id made of the device and the reading's number,
``device-0042-0000000017``: keys in the order of ``several``'s, so the two differ only by
the identity), ``nested`` (the device's id and
status in a ``type: record`` field, flattened to ``device_id``/``device_status``
columns), ``other_name`` (the id as ``reading_id``, ``identity: reading_id``),
``several`` (``identity: [device_id, seq]``), ``record_key`` (the id in the record key,
``identity: record_key``) and ``source_position`` (no id at all). Each in JSON and in
Avro (the writer schema derived from the event: a nested object is a nested record).

Default: ``validate_chunk`` alone on chunks of in-memory ``confluent_kafka.Message``
objects (no Kafka, no registry: the Avro decoder reads its writer schema from memory),
every variant in turn within a round (the order reversed every other round), timed by
``time.thread_time()``; the median over rounds, µs per message. A variant's own cost is
its difference from ``event_id`` in the same format.

``--engine``: ``plan_run`` + ``ingest_range`` (the DAG's path, as ``bench_ingest``'s
project row) on the local stack, JSON only: a fresh database, one topic per variant with
the same readings, the table made by ``apply_tables``; each variant in its own spawned
process, in turn, ``--rounds`` times; wall seconds and the process's CPU per event, the
median, each run checked (every event a row).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

#: The declared contracts (one per payload shape) and the pipelines that read them.
CONTRACTS: dict[str, Any] = {
    "reading": {"fields": {
        "device_id": {"type": "text", "max_length": 128},
        "timestamp": {"type": "timestamptz", "encoding": "epoch_seconds"},
        "metric_value": {"type": "float"},
        "status": {"type": "text", "max_length": 32},
        "unit": {"type": "text", "max_length": 32, "required": False}}},
    "reading_nested": {"fields": {
        "device": {"type": "record", "fields": {
            "id": {"type": "text", "max_length": 128},
            "status": {"type": "text", "max_length": 32}}},
        "timestamp": {"type": "timestamptz", "encoding": "epoch_seconds"},
        "metric_value": {"type": "float"},
        "unit": {"type": "text", "max_length": 32, "required": False}}},
    "reading_named": {"fields": {
        "reading_id": {"type": "text", "max_length": 128},
        "device_id": {"type": "text", "max_length": 128},
        "timestamp": {"type": "timestamptz", "encoding": "epoch_seconds"},
        "metric_value": {"type": "float"},
        "status": {"type": "text", "max_length": 32},
        "unit": {"type": "text", "max_length": 32, "required": False}}},
    "reading_seq": {"fields": {
        "device_id": {"type": "text", "max_length": 128},
        "seq": {"type": "bigint"},
        "timestamp": {"type": "timestamptz", "encoding": "epoch_seconds"},
        "metric_value": {"type": "float"},
        "status": {"type": "text", "max_length": 32},
        "unit": {"type": "text", "max_length": 32, "required": False}}},
}
#: variant -> (contract, the pipeline's own keys).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "event_id": ("reading", {}),
    "event_id_unordered": ("reading", {}),
    "event_id_like_several": ("reading", {}),
    "nested": ("reading_nested", {}),
    "other_name": ("reading_named", {"identity": "reading_id"}),
    "several": ("reading_seq", {"identity": ["device_id", "seq"]}),
    "record_key": ("reading", {"identity": "record_key",
                               "record_key": {"column": "reading_key", "max_length": 128}}),
    "source_position": ("reading", {"identity": "source_position"}),
}


def event(variant: str, i: int, rng: random.Random, tag: str) -> tuple[bytes, dict[str, Any]]:
    """(record key, payload) of reading ``i`` in ``variant``'s shape: the same values in
    every shape."""
    device = f"device-{rng.randrange(500):04d}"
    status = rng.choice(["OK", "OK", "OK", "WARN", "ERROR"])
    ident = f"{tag}-m-{i:08d}"
    base: dict[str, Any] = {"device_id": device,
                            "timestamp": 1_767_225_600.0 + i * 0.5 + rng.random(),
                            "metric_value": round(rng.uniform(-40.0, 120.0), 3),
                            "status": status, "unit": "celsius"}
    key = device.encode()
    if variant == "event_id":
        payload = {"event_id": ident, **base}
    elif variant == "event_id_unordered":  # ids minted apart from the log's order (uuid4s)
        unordered = hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()
        payload = {"event_id": f"{tag}-{unordered}", **base}
    elif variant == "event_id_like_several":  # in the key order of [device_id, seq]
        payload = {"event_id": f"{device}-{i:010d}", **base}
    elif variant == "nested":
        payload = {"event_id": ident, "device": {"id": device, "status": status},
                   "timestamp": base["timestamp"], "metric_value": base["metric_value"],
                   "unit": "celsius"}
    elif variant == "other_name":
        payload = {"reading_id": ident, **base}
    elif variant == "several":
        payload = {"device_id": device, "seq": i, **base}
    elif variant == "record_key":
        payload, key = base, ident.encode()
    else:
        payload = base
    return key, payload


def pipelines_doc(tag: str, topic_of: Callable[[str], str]) -> dict[str, Any]:
    return {"contracts": CONTRACTS, "pipelines": {
        f"{tag}_{v}": {"topic": topic_of(v), "dlq_topic": f"{topic_of(v)}-dlq",
                       "table": f"{tag}_{v}", "consumer_group": f"bench-{tag}-{v}",
                       "contract": {"event_type": contract, "version": 1}, **extra}
        for v, (contract, extra) in VARIANTS.items()}}


def avro_schema(name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Avro record a producer would declare for ``payload`` (``unit`` optional)."""
    kinds = {str: "string", float: "double", int: "long"}
    fields: list[dict[str, Any]] = []
    for k, v in payload.items():
        if isinstance(v, dict):
            fields.append({"name": k, "type": avro_schema(f"{name}_{k}", v)})
        elif k == "unit":
            fields.append({"name": k, "type": ["null", "string"], "default": None})
        else:
            fields.append({"name": k, "type": kinds[type(v)]})
    return {"type": "record", "name": name, "fields": fields}


# --------------------------------------------------------------------------- validate_chunk


class _Schemas:
    """The registry port over schemas held in memory (no registry: this times CPU only)."""

    def __init__(self, schemas: dict[int, Any]) -> None:
        from kafka_ingest.kafka.registry import RegistrySettings

        self.known = schemas
        self.settings = RegistrySettings({"url": "http://in-memory"})

    def schema(self, schema_id: int, *, serialized: bool = False) -> Any:
        return self.known.get(schema_id)


def chunk_inputs(events: int, tag: str) -> dict[str, Any]:
    """Per variant and format: (messages, pipeline, decoder)."""
    import fastavro
    from confluent_kafka import Message

    from kafka_ingest.config import parse_pipelines
    from kafka_ingest.decode.decoder import RegistryDecoder
    from kafka_ingest.kafka.registry import WriterSchema

    out: dict[str, Any] = {}
    for n, variant in enumerate(VARIANTS):
        rng = random.Random(7)
        made = [event(variant, i, rng, tag) for i in range(events)]
        schema = avro_schema("Reading", made[0][1])
        parsed, schema_id = fastavro.parse_schema(schema), n + 1
        header = b"\x00" + schema_id.to_bytes(4, "big")

        def avro(payload: dict[str, Any], parsed: Any = parsed, header: bytes = header) -> bytes:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, payload)
            return header + buf.getvalue()

        for fmt, encode in (("json", lambda p: json.dumps(p).encode()), ("avro", avro)):
            extra = {"format": "avro", "schema_registry": {}} if fmt == "avro" else {}
            doc = pipelines_doc(tag, lambda v: f"bench-{tag}-{v}")
            for body in doc["pipelines"].values():
                body.update(extra)
            pipeline = parse_pipelines(doc)[f"{tag}_{variant}"]
            decoder = None if fmt == "json" else RegistryDecoder(pipeline, _Schemas(  # type: ignore[arg-type]
                {schema_id: WriterSchema(schema_id, "AVRO", json.dumps(schema))}))
            messages = [Message(topic=pipeline.topic, partition=0, offset=i, key=key,
                                value=encode(payload), timestamp=(1, 1_767_225_600_000 + i))
                        for i, (key, payload) in enumerate(made)]
            out[f"{variant}/{fmt}"] = (messages, pipeline, decoder)
    return out


def measure_chunks(args: argparse.Namespace) -> None:
    from kafka_ingest.decode.validate import validate_chunk

    inputs = chunk_inputs(args.events, "b")
    for name, (messages, pipeline, decoder) in inputs.items():
        result = validate_chunk(messages, pipeline, decoder)  # warm, and checked
        if len(result.rows) != args.events or result.dead:
            raise RuntimeError(f"{name}: {len(result.rows)} rows, {result.dead[:1]}")
    spent: dict[str, list[float]] = {name: [] for name in inputs}
    order = list(inputs)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            messages, pipeline, decoder = inputs[name]
            c0 = time.thread_time()
            validate_chunk(messages, pipeline, decoder)
            spent[name].append((time.thread_time() - c0) / args.events * 1e6)
    print(f"validate_chunk, this thread's CPU µs per message (median of {args.rounds} rounds "
          f"of {args.events:,} messages; vs event_id: the median of the rounds' differences "
          "from event_id in the same format, each round's pair run side by side)")
    print("| variant | JSON | vs event_id | Avro | vs event_id | Avro ÷ JSON |")
    print("|---|--:|--:|--:|--:|--:|")
    med = {name: statistics.median(v) for name, v in spent.items()}

    def paired(name: str, base: str) -> float:
        return statistics.median(x - y for x, y in zip(spent[name], spent[base], strict=True))

    for variant in VARIANTS:
        j, a = med[f"{variant}/json"], med[f"{variant}/avro"]
        dj, da = paired(f"{variant}/json", "event_id/json"), paired(f"{variant}/avro",
                                                                   "event_id/avro")
        print(f"| {variant} | {j:.2f} | {dj:+.2f} | {a:.2f} | {da:+.2f} | {a / j:.2f}x |")


# --------------------------------------------------------------------------- engine path


def child_engine(kafka: dict[str, Any], dsn: str, doc: dict[str, Any], name: str,
                 run_id: str) -> dict[str, Any]:
    """plan_run + ingest_range per range, as ``project_rows.child_project``."""
    from kafka_ingest.config import parse_pipelines
    from kafka_ingest.db import Database
    from kafka_ingest.engine.ingest import ingest_range, plan_run, summarize
    from kafka_ingest.kafka.clients import KafkaClients

    pipeline = parse_pipelines(doc)[name]
    clients, db = KafkaClients(kafka), Database(dsn)
    t0, c0 = time.perf_counter(), time.process_time()
    ranges = plan_run(pipeline, clients, db, run_id=run_id)
    reports = [ingest_range(pipeline, r, clients, db, run_id=run_id).to_dict() for r in ranges]
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": summarize(reports)["read"], "seconds": secs, "cpu_s": cpu,
            "detail": summarize(reports)}


def measure_engine(args: argparse.Namespace) -> None:
    import psycopg
    from harness import count_rows, fresh_database, run_child, up

    from kafka_ingest.config import parse_pipelines
    from kafka_ingest.db.tables import apply_tables
    from kafka_ingest.kafka.clients import KafkaClients
    from kafka_ingest.kafka.topics import ensure_topics
    from kafka_ingest_dev.samples import produce_records

    env = up()
    kafka = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    tag = uuid.uuid4().hex[:8]
    clients = KafkaClients(kafka)
    doc = pipelines_doc(f"bid{tag}", lambda v: f"bench-{tag}-{v}")
    topics = [t for body in doc["pipelines"].values() for t in (body["topic"], body["dlq_topic"])]
    print(f"load average before: {os.getloadavg()}", flush=True)
    with fresh_database(env["KAFKA_INGEST_PG_DSN"]) as dsn:
        try:
            ensure_topics(clients, {t: 1 for t in topics})
            for variant in VARIANTS:
                rng = random.Random(7)
                produce_records(clients.producer(), f"bench-{tag}-{variant}", (
                    (k, json.dumps(p).encode(), 0, None)
                    for k, p in (event(variant, i, rng, tag) for i in range(args.events))))
            spent: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
            order = list(VARIANTS)
            for r in range(args.rounds):
                for variant in order if r % 2 == 0 else order[::-1]:
                    name = f"bid{tag}_{variant}_{r}"  # a pipeline a run: offsets of its own
                    round_doc = {**doc, "pipelines": {name: {
                        **doc["pipelines"][f"bid{tag}_{variant}"], "table": name,
                        "consumer_group": f"bench-{tag}-{variant}-{r}"}}}
                    pipeline = parse_pipelines(round_doc)[name]
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        apply_tables(conn, pipeline)
                    raw = run_child(child_engine, kafka, dsn, round_doc, name, f"bid{tag}{r}")
                    rows = count_rows(dsn, name)
                    if raw["events"] != args.events or rows != args.events:
                        raise RuntimeError(f"{variant}: read {raw['events']}, {rows} rows")
                    spent[variant].append((raw["seconds"], raw["cpu_s"]))
                    print(f"  round {r + 1} {variant}: {raw['seconds']:.2f}s, CPU "
                          f"{raw['cpu_s']:.2f}s", flush=True)
        finally:
            clients.admin().delete_topics(topics)
    print(f"load average after: {os.getloadavg()}")
    print(f"plan_run + ingest_range, {args.events:,} JSON events, 1 partition (median of "
          f"{args.rounds})")
    print("| variant | seconds | events/s | vs event_id | process CPU µs/event |")
    print("|---|--:|--:|--:|--:|")
    base = statistics.median(s for s, _ in spent["event_id"])
    for variant, runs in spent.items():
        secs, cpu = statistics.median(s for s, _ in runs), statistics.median(c for _, c in runs)
        print(f"| {variant} | {secs:.2f} | {args.events / secs:,.0f} | {secs / base:.2f}x | "
              f"{cpu / args.events * 1e6:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--engine", action="store_true")
    args = parser.parse_args()
    args.events = args.events or (200_000 if args.engine else 20_000)
    args.rounds = args.rounds or (3 if args.engine else 7)
    print(f"load average: {os.getloadavg()}", flush=True)
    (measure_engine if args.engine else measure_chunks)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
