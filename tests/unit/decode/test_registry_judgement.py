"""What a chunk's schema ids say, without a registry (a fake of the registry port): a chunk
none of whose ids the registry knows is the registry's fault, not the records'; records
are judged by the writer schema they carry, not by the subject's latest. The integration
tests (``tests/integration/test_registry_formats.py``) show both on the real registry.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import fastavro
import pytest

from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.decode.schemas import check_subject
from kafka_ingest.engine.ingest import IngestWriter
from kafka_ingest.errors import ContractMismatch, RegistryLacksSchemas
from kafka_ingest.kafka.reader import Chunk
from kafka_ingest.kafka.registry import WriterSchema
from kafka_ingest.records import row_values
from tests.support.fakes import PARTITION, TOPIC, Msg
from tests.unit.decode.test_formats import AVRO, GOOD, OneSchema, avro_value, pipeline

#: AVRO without the ``value`` field the contract requires.
WITHOUT_VALUE: dict[str, Any] = {**AVRO, "fields": [f for f in AVRO["fields"]
                                                    if f["name"] != "value"]}
#: AVRO with the optional ``amount`` (a numeric column) sent as text: the check flags it,
#: and a record that leaves it null is still one the contract reads.
TEXT_AMOUNT: dict[str, Any] = {**AVRO, "fields": [
    {"name": "amount", "type": ["null", "string"], "default": None}
    if f["name"] == "amount" else f for f in AVRO["fields"]]}


def avro(schema_id: int, record: dict[str, Any], schema: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


class _NoEncoder:
    """The COPY encoder's port: these tests look at the rows, not their bytes."""

    def encode(self, rows: list[Any]) -> bytes:
        return b""


def prepare(writer: IngestWriter, values: list[bytes], *, start: int = 10) -> Any:
    """Validate one chunk of ``values`` at offsets ``start``... as ingest does."""
    chunk = Chunk(TOPIC, PARTITION, start, start + len(values),
                  [Msg(start + i, value_=v) for i, v in enumerate(values)])
    return writer.prepare(chunk, _NoEncoder())  # type: ignore[arg-type]


def writer_over(*schemas: WriterSchema) -> tuple[IngestWriter, OneSchema]:
    registry = OneSchema(*schemas)
    p = pipeline()
    return IngestWriter(p, decoder=RegistryDecoder(p, registry)), registry  # type: ignore[arg-type]


def with_id(value: bytes, schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + value[5:]


# --------------------------------------------------------------------------- unknown ids

GOOD_5 = avro_value(5, GOOD)


@pytest.mark.parametrize("values", [
    # every record carries an id the registry answers 404 for (a restored registry)
    [with_id(GOOD_5, 8), with_id(GOOD_5, 9), with_id(GOOD_5, 8)],
    # a chunk of one record: the same rule
    [with_id(GOOD_5, 9)],
    # a record without the wire header carries no id: it counts for nothing either way
    [b'{"event_id": "json"}', with_id(GOOD_5, 9)],
], ids=["all_unknown", "one_record", "beside_no_header"])
def test_a_chunk_none_of_whose_ids_the_registry_knows_fails_and_dead_letters_nothing(
        values: list[bytes]) -> None:
    writer, _ = writer_over(WriterSchema(5, "AVRO", json.dumps(AVRO)))
    with pytest.raises(RegistryLacksSchemas) as raised:
        prepare(writer, values)
    ids = sorted({int.from_bytes(v[1:5], "big") for v in values if v[0] == 0})
    assert raised.value.schema_ids == ids
    assert f"{TOPIC}[{PARTITION}] offsets [10, {10 + len(values)})" in str(raised.value)
    assert "knows none of schema ids" in str(raised.value)


def test_an_unknown_id_among_known_ones_is_that_record_s_dead_letter() -> None:
    writer, _ = writer_over(WriterSchema(5, "AVRO", json.dumps(AVRO)))
    result = prepare(writer, [GOOD_5, with_id(GOOD_5, 9)])
    assert [row_values(r)[0] for r in result.rows] == ["e1"]
    assert [(d.source_offset, d.error_class, d.schema_id) for d in result.dead] == [
        (11, "unknown_schema", 9)]


def test_an_id_of_another_type_is_known_so_an_unknown_one_beside_it_is_poison() -> None:
    writer, _ = writer_over(WriterSchema(6, "JSON", "{}"))
    result = prepare(writer, [with_id(GOOD_5, 6), with_id(GOOD_5, 9)])
    assert [(d.source_offset, d.error_class) for d in result.dead] == [
        (10, "unknown_schema"), (11, "unknown_schema")]


def test_ids_known_in_an_earlier_chunk_do_not_vouch_for_a_later_one() -> None:
    # a lagging replica knows the old ids and misses the new: the chunk of new ones fails
    writer, _ = writer_over(WriterSchema(5, "AVRO", json.dumps(AVRO)))
    assert len(prepare(writer, [GOOD_5], start=0).rows) == 1
    with pytest.raises(RegistryLacksSchemas):
        prepare(writer, [with_id(GOOD_5, 9), with_id(GOOD_5, 9)], start=1)


# --------------------------------------------------------------------------- judged by version


def test_records_are_judged_by_the_writer_schema_they_carry() -> None:
    writer, _ = writer_over(WriterSchema(5, "AVRO", json.dumps(AVRO)),
                            WriterSchema(6, "AVRO", json.dumps(WITHOUT_VALUE)),
                            WriterSchema(7, "AVRO", json.dumps(TEXT_AMOUNT)))
    without_value = {k: v for k, v in GOOD.items() if k != "value"}
    result = prepare(writer, [
        GOOD_5,  # a readable version: loads
        avro(6, {**without_value, "event_id": "e6"}, WITHOUT_VALUE),  # cannot: dead letter
        avro(7, {**GOOD, "event_id": "e7", "amount": None}, TEXT_AMOUNT),  # flagged, but read
        avro(7, {**GOOD, "event_id": "e8", "amount": "1.25"}, TEXT_AMOUNT),  # flagged, refused
        avro_value(5, {**GOOD, "event_id": "e9", "device": "x" * 9}),  # readable, refused
    ])
    assert [row_values(r)[0] for r in result.rows] == ["e1", "e7"]
    details = {d.source_offset: (d.error_class, d.error_detail) for d in result.dead}
    assert details[11] == ("contract_violation", (
        "written with schema id 6, which the contract cannot read (field 'value': required "
        "by the contract, absent from the writer schema): value: Field required [missing]"))
    assert details[13][1].startswith(
        "written with schema id 7, which the contract cannot read (field 'amount': the writer "
        "sends string, the contract's numeric(10,2) column takes decimal): amount: ")
    # a readable schema's refusal is the record's own: nothing about its schema
    assert details[14][0] == "contract_violation"
    assert not details[14][1].startswith("written with schema id")


class Subject:
    """The registry port at plan time: one subject's versions, the last one the latest."""

    def __init__(self, *texts: dict[str, Any]) -> None:
        self.versions_ = [WriterSchema(20 + n, "AVRO", json.dumps(t), subject="t-value",
                                       version=n) for n, t in enumerate(texts, 1)]

    def latest(self, subject: str, *, serialized: bool = False) -> WriterSchema:
        return self.versions_[-1]

    def versions(self, subject: str) -> list[int]:
        return [s.version or 0 for s in self.versions_]

    def version(self, subject: str, number: int, *, serialized: bool = False) -> WriterSchema:
        return self.versions_[number - 1]


def test_an_unreadable_latest_version_beside_a_readable_one_is_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    # registered, nobody produced with it yet: the records of version 1 must still load
    subject = Subject(AVRO, WITHOUT_VALUE)
    with caplog.at_level(logging.WARNING):
        latest = check_subject(pipeline(), subject)  # type: ignore[arg-type]
    assert latest is not None and latest.version == 2
    assert ("the contract cannot read version 2 (schema id 22) of subject 't-value', the "
            "latest: field 'value': required by the contract, absent from the writer "
            "schema. Version 1 (schema id 21) it reads") in caplog.text


@pytest.mark.parametrize(("texts", "which"), [
    ([WITHOUT_VALUE], "its only version"),
    ([WITHOUT_VALUE, WITHOUT_VALUE], "any of its 2 versions"),
])
def test_a_contract_that_reads_no_version_of_the_subject_fails_the_plan(
        texts: list[dict[str, Any]], which: str) -> None:
    with pytest.raises(ContractMismatch) as raised:
        check_subject(pipeline(), Subject(*texts))  # type: ignore[arg-type]
    assert raised.value.problems == [
        "field 'value': required by the contract, absent from the writer schema"]
    assert f"its contract cannot read {which} of subject 't-value'" in str(raised.value)
