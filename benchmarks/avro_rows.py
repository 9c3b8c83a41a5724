"""The Avro rows of ``bench_ingest.py``, beside the JSON one: the same events, Avro-encoded.

The sample ``bench_ingest`` produced (``samples.sample_stream``: same tag, seed, keys and
partitions, so the same event ids in the same order) goes to a topic of its own,
``<source>-avro``, each loadable event written by confluent-kafka's ``AvroSerializer`` in
the Confluent wire format (magic byte, schema id, Avro binary) with the same field values,
under a schema registered in the stack's registry (``<source>-avro-value``,
:data:`SCHEMA`: the ``metric_event`` v2 contract's fields). Rows:

- ``kafka-ingest (avro)``: ``project_rows.child_project``, the JSON row's child, on that
  topic with a pipeline of ``format: avro`` and the registry's settings: the DAG's path,
  the registry decoder in front of the same contract. Checked like the JSON row (counts,
  table rows, each a valid sample event) and by dead-letter class. Like the JSON row's
  child, which imports the engine before its clock, it imports the registry client library
  first (0.13 s, once per process): a run that imports it while timed is refused, and the
  report names what the Avro row alone imported while timed;
- ``validate only, avro``: ``validate_chunk`` with the registry decoder, by stage: the
  decode (header + the Avro codec's reader) as ``validate_chunk`` meets it (its
  time less its time with every value decoded beforehand) and alone, pydantic's
  ``validate_python`` alone, the rest of ``validate_chunk``; beside the JSON path's on the
  JSON topic, chunk by chunk in the same process, the two alternating (one thread's CPU):
  :func:`report` prints where the time goes.

Poison pills: an Avro topic holds what Avro producers send, so a pill that the record
schema can carry (NaN, a NUL in text, version 99, ...) is Avro-encoded and must fail the
contract as in JSON; one it cannot (not an object, a missing field, a string for a double)
keeps its bytes, as a producer that bypassed the serializer would send them, and must be
dead-lettered as ``not_wire_format``. :data:`AVRO_EXPECT` names each case. The counts of
rows, duplicates, tombstones and dead letters equal the JSON sample's, so the two rows do
the same work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from harness import (
    BASE_PIPELINE,
    PROJECT_PATH,
    Bench,
    Measure,
    Target,
    as_measure,
    check_rows,
    chunks,
    make_table,
    pipeline_of,
    rss_mb,
    run_child,
)
from project_rows import check_project, child_project

from kafka_ingest.decode.decoder import open_decoder
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import partitions_of, watermarks
from kafka_ingest.kafka.registry import RegistrySettings

AVRO_PATH = "kafka-ingest (avro), DAG path, same events Avro-encoded"
STAGES_PATH = "validate only, avro (validate_chunk + registry decoder)"
REGISTRY_ENV = "KAFKA_INGEST_SCHEMA_REGISTRY_URL"
#: The registry client library (0.13 s to import): imported before the Avro row's clock.
REGISTRY_CLIENT = "confluent_kafka.schema_registry"
#: The target: the Avro row within this many times the JSON row's time.
TARGET_RATIO = 1.3

#: The writer schema: the fields of the ``metric_event`` v2 contract (``MetricEventV2``).
SCHEMA: dict[str, Any] = {
    "type": "record", "name": "MetricEvent", "namespace": "kafka_ingest.bench",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "device_id", "type": "string"},
        {"name": "timestamp", "type": "double"},
        {"name": "metric_value", "type": "double"},
        {"name": "status", "type": "string"},
        {"name": "version", "type": "int"},
        {"name": "unit", "type": ["null", "string"], "default": None},
    ],
}
#: What each kind of sample must become in the Avro topic; a kind not named here keeps
#: its bytes (no magic byte) and must be dead-lettered as ``not_wire_format``.
AVRO_EXPECT: dict[str, str] = {
    "valid": "row",
    "duplicate": "duplicate",
    "tombstone": "tombstone",  # stays null
    # extra keys are not in the writer schema: the serializer leaves them out
    "extra_fields": "row",
    # values the record schema carries and the contract refuses, as in JSON
    "nan": "contract_violation",
    "infinity": "contract_violation",
    "nul_in_text": "contract_violation",
    "event_id_empty": "contract_violation",
    "event_id_too_long": "contract_violation",
    "bad_timestamp": "contract_violation",
    "unknown_version": "unknown_version",
    # kept as bytes: over the size limit, refused before any decoding
    "too_large": "too_large",
}
NOT_WIRE_FORMAT = "not_wire_format"
#: The Avro-encoded kinds (the rest keep their bytes).
_ENCODED = {k for k, v in AVRO_EXPECT.items() if v not in {"tombstone", "too_large"}}


@dataclass
class AvroData:
    """The Avro topic of one run: where it is and what it promises."""

    topic: str
    subject: str
    registry_url: str
    schema_id: int
    target: Target
    produced: int
    expect: dict[str, int]  # row, duplicate, tombstone, and dead letters by error class
    value_mb: float


# --------------------------------------------------------------------------- the topic


def avro_value(sample: Any, serialize: Callable[[dict[str, Any]], bytes]) -> bytes | None:
    """A sample's value in the Avro topic: Avro-encoded from the same JSON (same field
    values) when :data:`AVRO_EXPECT` says the schema carries it, else its own bytes."""
    if sample.value is None or sample.kind not in _ENCODED:
        return sample.value
    return serialize(json.loads(sample.value))


def produce_avro_topic(b: Bench, topic: str, url: str) -> AvroData:
    """The sample stream, Avro-encoded, to ``topic``; the schema registered by the
    serializer (``auto.register.schemas``, TopicNameStrategy: ``<topic>-value``)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ingest.kafka.topics import ensure_topics
    from kafka_ingest_dev.samples import Outgoing, produce_records, sample_stream

    ensure_topics(b.clients, {topic: b.args.partitions})
    registry = SchemaRegistryClient({"url": url})
    serializer = AvroSerializer(registry, json.dumps(SCHEMA))
    ctx = SerializationContext(topic, MessageField.VALUE)
    expect: Counter[str] = Counter()
    size = 0

    def records() -> Iterator[Outgoing]:
        nonlocal size
        doc = (BASE_PIPELINE, b.base_body)
        for s in sample_stream(pipeline_of(doc), b.args.events, 1, tag=b.tag,
                               partitions=b.args.partitions):
            value = avro_value(s, lambda event: serializer(event, ctx))
            size += len(value or b"")
            expect[AVRO_EXPECT.get(s.kind, NOT_WIRE_FORMAT)] += 1
            yield s.key, value, s.partition, None

    produce_records(b.clients.producer(), topic, records())
    subject = f"{topic}-value"
    schema_id = registry.get_latest_version(subject).schema_id
    registry.close()
    consumer = b.clients.consumer(f"bench-{b.tag}-avro-plan")
    try:
        marks = watermarks(consumer, topic, partitions_of(consumer, topic))
    finally:
        consumer.close()
    target = dataclasses.replace(b.target, topic=topic, ranges=marks,
                                 group=f"bench-{b.tag}-avro-read")
    return AvroData(topic, subject, url, int(schema_id or 0), target, sum(expect.values()),
                    dict(expect), size / 1e6)


def _same_work(b: Bench, data: AvroData) -> None:
    """The Avro topic must ask for the JSON sample's work: messages, rows, duplicates,
    tombstones and dead letters (their classes may differ, see :data:`AVRO_EXPECT`)."""
    def shape(expect: dict[str, int]) -> dict[str, int]:
        keep = {"row", "duplicate", "tombstone"}
        return {**{k: expect.get(k, 0) for k in keep},
                "dead": sum(v for k, v in expect.items() if k not in keep)}

    if data.produced != b.produced or shape(data.expect) != shape(b.expect):
        raise RuntimeError(f"the Avro topic differs from the sample: {data.produced} "
                           f"{data.expect} vs {b.produced} {b.expect}")


@contextlib.contextmanager
def avro_topic(b: Bench, url: str) -> Iterator[AvroData]:
    """Produce the Avro topic (deleted with the bench's topics: it is ``<source>-avro``);
    its subject is deleted from the registry on exit (soft, then for good)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = f"{b.source}-avro"
    t0 = time.perf_counter()
    try:
        data = produce_avro_topic(b, topic, url)
        _same_work(b, data)
        print(f"produced the same sample Avro-encoded to {topic} ({data.value_mb:.1f} MB of "
              f"values, schema id {data.schema_id}) in {time.perf_counter() - t0:.1f}s; "
              f"expect {data.expect}", flush=True)
        yield data
    finally:
        registry = SchemaRegistryClient({"url": url})
        try:
            for permanent in (False, True):
                registry.delete_subject(f"{topic}-value", permanent=permanent)
        except Exception as exc:  # best effort, as the topics: a leftover subject is harmless
            print(f"warning: could not delete subject {topic}-value: {exc}", flush=True)
        finally:
            registry.close()


def avro_doc(b: Bench, name: str) -> tuple[str, dict[str, Any]]:
    """The JSON row's pipeline on the Avro topic, ``format: avro``, table ``name``."""
    doc_name, body = b.pipeline_doc(name)
    return doc_name, {**body, "topic": b.avro.topic, "format": "avro", "schema_registry": {}}


# --------------------------------------------------------------------------- the rows


def check_dead_letters(b: Bench, pipeline: str) -> dict[str, int]:
    """The run's ``dead_letters`` rows by class must be what :data:`AVRO_EXPECT` says."""
    want = {k: v for k, v in b.avro.expect.items() if k not in {"row", "duplicate", "tombstone"}}
    with psycopg.connect(b.dsn) as conn:
        rows = conn.execute("SELECT error_class, count(*) FROM dead_letters WHERE "
                            "pipeline = %s GROUP BY 1", (pipeline,)).fetchall()
    got: dict[str, int] = dict(rows)
    if got != want:
        raise RuntimeError(f"dead letters of {pipeline} by class: {got}; expected {want}")
    return got


def measure_avro(b: Bench, rep: int) -> Measure:
    """The JSON row's child (plan + ingest_range) on the Avro topic, registry settings
    given to the engine as ``KafkaClients(config, registry=...)``."""
    name = f"bench_avro_{rep}"
    make_table(b.dsn, name)
    raw = run_child(child_project, b.avro.target, avro_doc(b, name),
                       f"bench__{b.tag}_avro{rep}", b.avro.registry_url)
    check_project(b, raw["detail"], name, expect=b.avro.expect, produced=b.avro.produced)
    late = [m for m in raw["detail"]["imported_while_timed"] if m.startswith(REGISTRY_CLIENT)]
    if late:  # the basis the figures are quoted on: imports before the clock, as JSON's
        raise RuntimeError(f"the Avro row imported {late} while timed: import the registry "
                           "client before the clock (project_rows.child_project)")
    check_rows(b, name, b.avro.expect.get("row", 0))
    raw["detail"]["dead_by_class"] = check_dead_letters(b, name)
    raw["detail"]["topic_value_mb"] = round(b.avro.value_mb, 1)
    return as_measure(AVRO_PATH, raw)


#: The stages, in the order printed: (key, label).
STAGES: list[tuple[str, str]] = [
    ("avro_decode", "decode: header + the Avro codec's reader (RegistryDecoder.checking; in "
                    "validate_chunk)"),
    ("avro_decode_alone", "the same, alone over the chunk's valid values"),
    ("avro_validate", "validate: validate_json (parse + validate) / validate_python, alone"),
    ("avro_rest", "the rest of validate_chunk (loop, row tuple, provenance, frames)"),
    ("avro_total", "validate_chunk, total"),
]


def _passing(chunk: Any, pipeline: Any, check: Callable[[bytes], Any]) -> list[bytes]:
    """The values of ``chunk`` that are within the size limit and that ``check`` accepts
    (untimed: the stages are timed on these alone)."""
    out = []
    for msg in chunk.messages:
        value = msg.value()
        if value is None or len(value) > pipeline.max_message_bytes:
            continue
        with contextlib.suppress(Exception):
            check(value)
            out.append(value)
    return out


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(this thread's CPU seconds, result): librdkafka's threads fetching meanwhile are not
    counted, nor are other processes on a shared machine."""
    c0 = time.thread_time()
    result = fn()
    return time.thread_time() - c0, result


def _drain(fn: Callable[[Any], Any], items: Iterable[Any]) -> None:
    """``fn`` over ``items``, keeping nothing (as validate_chunk keeps only the rows)."""
    deque(map(fn, items), maxlen=0)


class _Decoded(dict[bytes, Any]):
    """Values decoded beforehand, by value; one not decoded is decoded now (the pills)."""

    def __init__(self, read: Callable[[bytes], Any], values: list[bytes]) -> None:
        super().__init__((v, read(v)) for v in values)
        self._read = read

    def __missing__(self, value: bytes) -> Any:
        return self._read(value)


class _Predecoded:
    """``decoder`` with its ``read`` replaced (by a lookup of values decoded beforehand),
    and its ``checking`` reading that way: whatever else ``validate_chunk`` asks of a
    decoder is the real one's."""

    def __init__(self, decoder: Any, read: Callable[[bytes], Any]) -> None:
        self._decoder = decoder
        self.read = read

    def checking(self, check: Callable[[Any], Any]) -> Callable[[bytes], Any]:
        read = self.read
        return lambda value: check(read(value))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)


def _avro_stages(chunk: Any, pipeline: Any, decoder: Any, spent: dict[str, float]) -> int:
    """The decode as validate_chunk meets it: its time on the chunk, less its time on the
    same chunk with each valid value decoded beforehand (a dict lookup left in its place)."""
    validate = pipeline.model.__pydantic_validator__.validate_python
    read = decoder.read
    good = _passing(chunk, pipeline, lambda v: validate(read(v)))
    spent["avro_decode_alone"] += _cpu(lambda: _drain(read, good))[0]
    decoded = _Decoded(read, good)
    dicts = [decoded[v] for v in good]
    spent["avro_validate"] += _cpu(lambda: _drain(validate, dicts))[0]
    predecoded = _Predecoded(decoder, decoded.__getitem__)
    spent["avro_predecoded"] += _cpu(
        lambda: validate_chunk(chunk.messages, pipeline, predecoded))[0]  # type: ignore[arg-type]
    spent["avro_total"] += _cpu(lambda: validate_chunk(chunk.messages, pipeline, decoder))[0]
    return len(good)


def _json_stages(chunk: Any, pipeline: Any, spent: dict[str, float]) -> int:
    validate = pipeline.model.__pydantic_validator__.validate_json
    good = _passing(chunk, pipeline, validate)
    spent["json_validate"] += _cpu(lambda: _drain(validate, good))[0]
    spent["json_total"] += _cpu(lambda: validate_chunk(chunk.messages, pipeline))[0]
    return len(good)


def child_stages(json_t: Target, avro_t: Target, json_doc: tuple[str, dict[str, Any]],
                 avro_doc_: tuple[str, dict[str, Any]], url: str) -> dict[str, Any]:
    """Per-stage CPU of ``validate_chunk`` on both topics, chunk k of each in turn (which
    goes first alternates); the reads are not timed. Stages are timed on the messages that
    pass (the same sample's valid events), the totals on whole chunks."""
    start_rss = rss_mb()
    pj, pa = pipeline_of(json_doc), pipeline_of(avro_doc_)
    clients = KafkaClients(json_t.kafka, registry=RegistrySettings({"url": url}))
    spent = dict.fromkeys(("avro_decode_alone", "avro_validate", "avro_predecoded",
                           "avro_total", "json_validate", "json_total", "wall"), 0.0)
    n_avro = n_json = messages = 0
    with open_decoder(pa, clients.registry) as decoder:
        cj, ca = clients.consumer(json_t.group), clients.consumer(avro_t.group)
        try:
            pairs = zip(chunks(json_t, cj), chunks(avro_t, ca), strict=True)
            for k, (jchunk, achunk) in enumerate(pairs):
                t0 = time.perf_counter()
                if k % 2:
                    n_json += _json_stages(jchunk, pj, spent)
                    n_avro += _avro_stages(achunk, pa, decoder, spent)
                else:
                    n_avro += _avro_stages(achunk, pa, decoder, spent)
                    n_json += _json_stages(jchunk, pj, spent)
                spent["wall"] += time.perf_counter() - t0
                messages += len(achunk.messages)
        finally:
            cj.close()
            ca.close()
    us = {"avro_decode": (spent["avro_total"] - spent["avro_predecoded"]) / messages,
          "avro_decode_alone": spent["avro_decode_alone"] / n_avro,
          "avro_validate": spent["avro_validate"] / n_avro,
          "avro_total": spent["avro_total"] / messages,
          "json_validate": spent["json_validate"] / n_json,
          "json_total": spent["json_total"] / messages}
    us["avro_rest"] = us["avro_total"] - us["avro_decode"] - us["avro_validate"]
    us["json_rest"] = us["json_total"] - us["json_validate"]
    return {"events": messages, "seconds": spent["avro_total"], "cpu_s": spent["avro_total"],
            "start_rss_mb": start_rss, "peak_rss_mb": rss_mb(),
            "detail": {"stages_us": {k: round(v * 1e6, 3) for k, v in us.items()},
                       "timed_messages": {"avro": n_avro, "json": n_json},
                       "both_wall_s": round(spent["wall"], 3)}}


def measure_stages(b: Bench, _rep: int) -> Measure:
    raw = run_child(child_stages, b.target, b.avro.target, b.pipeline_doc(BASE_PIPELINE),
                       avro_doc(b, BASE_PIPELINE), b.avro.registry_url)
    if raw["events"] != b.avro.produced:
        raise RuntimeError(f"avro stages read {raw['events']} of {b.avro.produced} messages")
    timed = raw["detail"]["timed_messages"]
    want = b.avro.expect.get("row", 0) + b.avro.expect.get("duplicate", 0)
    if timed != {"avro": want, "json": want}:
        raise RuntimeError(f"avro stages timed {timed} valid messages; expected {want} each")
    return as_measure(STAGES_PATH, raw)


PATHS: list[tuple[str, Callable[[Bench, int], Measure]]] = [
    ("avro", measure_avro),
    ("avro_stages", measure_stages),
]
KEYS = {k for k, _ in PATHS}


def wanted(only: list[str] | None) -> bool:
    """Whether this run measures an Avro row (so it needs the registry)."""
    return only is None or bool(KEYS & set(only))


# --------------------------------------------------------------------------- the report


def _per_event_us(m: Measure) -> float:
    return m.cpu_s / m.events * 1e6 if m.events else 0.0


def compare(results: list[Measure]) -> dict[str, Any]:
    """The Avro row against the JSON row: events/s, CPU per event, the time ratio (of the
    median runs, and the median of the runs paired by repeat), and the stages."""
    by_path = {m.path: m for m in results}
    json_m, avro_m = by_path.get(PROJECT_PATH), by_path.get(AVRO_PATH)
    out: dict[str, Any] = {}
    if json_m and avro_m:
        pairs = [a / j for a, j in zip(avro_m.detail.get("all_seconds", []),
                                       json_m.detail.get("all_seconds", []), strict=False)]
        ratio = json_m.rate / avro_m.rate if avro_m.rate else float("inf")
        out = {"json_events_per_s": round(json_m.rate), "avro_events_per_s": round(avro_m.rate),
               "json_cpu_us_per_event": round(_per_event_us(json_m), 2),
               "avro_cpu_us_per_event": round(_per_event_us(avro_m), 2),
               "time_ratio_of_medians": round(ratio, 3),
               "time_ratio_paired": [round(p, 3) for p in pairs],
               "time_ratio_paired_median": round(statistics.median(pairs), 3) if pairs
               else None,
               "cpu_ratio": round(_per_event_us(avro_m) / _per_event_us(json_m), 3)
               if _per_event_us(json_m) else None,
               "target": TARGET_RATIO, "within_target": ratio <= TARGET_RATIO,
               "imported_while_timed_by_avro_only": sorted(
                   {m.split(".")[0] for m in avro_m.detail.get("imported_while_timed", ())}
                   - {m.split(".")[0] for m in json_m.detail.get("imported_while_timed", ())})}
    stages = by_path.get(STAGES_PATH)
    if stages:
        out["stages_us"] = stages.detail["stages_us"]
    return out


def report(cmp: dict[str, Any], *, smoke: bool = False) -> str:
    """The comparison as text, after the table."""
    lines = ["(--smoke: a check that the rows run, not a measurement: at this size the fixed "
             "costs, the registry's client and plan-time check among them, dominate)"] \
        if smoke else []
    if "avro_events_per_s" in cmp:
        pairs = ", ".join(f"{p:.2f}" for p in cmp["time_ratio_paired"])
        verdict = "within" if cmp["within_target"] else "NOT within"
        lines += [
            "Avro vs JSON, the same events through the same engine path (median runs):",
            f"  JSON {cmp['json_events_per_s']:,} events/s, "
            f"{cmp['json_cpu_us_per_event']:.2f} CPU µs/event (the process)",
            f"  Avro {cmp['avro_events_per_s']:,} events/s, "
            f"{cmp['avro_cpu_us_per_event']:.2f} CPU µs/event",
            f"  Avro takes {cmp['time_ratio_of_medians']:.2f}x the JSON time (paired by run: "
            f"{pairs}; median {cmp['time_ratio_paired_median']:.2f}x), "
            f"{cmp['cpu_ratio']:.2f}x the CPU per event: {verdict} the "
            f"{cmp['target']:.1f}x target",
            "  imported while timed by the Avro row only: "
            f"{', '.join(cmp['imported_while_timed_by_avro_only']) or 'nothing'} (the "
            "registry client library is imported before the clock, as the engine is; what "
            "its first client and request load is timed)",
        ]
    st = cmp.get("stages_us")
    if st:
        label = dict(STAGES)
        cells = [("avro_decode", "-", st["avro_decode"]),
                 ("avro_decode_alone", "-", st["avro_decode_alone"]),
                 ("avro_validate", st["json_validate"], st["avro_validate"]),
                 ("avro_rest", st["json_rest"], st["avro_rest"]),
                 ("avro_total", st["json_total"], st["avro_total"])]
        lines += ["", "Where validate_chunk's time goes (this thread's CPU µs per message, "
                      "the median run):", "| stage | JSON | Avro |", "|---|--:|--:|"]
        lines += [f"| {label[key]} | {_cell(j)} | {_cell(a)} |" for key, j, a in cells]
        lines.append(f"Avro - JSON: {st['avro_total'] - st['json_total']:+.2f} µs per message "
                     "in validate_chunk, on the reading thread that also reads and encodes "
                     "the COPY rows")
    return "\n".join(lines)


def _cell(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.2f}"
