"""One codec per format behind one interface: each codec answers the interface's questions
for its format (a record's schema id, the registry fetches, the payload decoded, the
writer schema's fields and kinds), every format has one, and no module outside
``kafka_ingest.decode.codecs`` asks which format a pipeline reads."""

from __future__ import annotations

import ast
import base64
import io
import json
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs import CODECS, Codec, NoSuchRecord, codec_for
from kafka_ingest.decode.codecs.base import JSON_KINDS, PYTHON_KINDS
from kafka_ingest.errors import Undecodable
from kafka_ingest.kafka.registry import WriterSchema
from tests.support import ROOT

CODEC_PACKAGE = ROOT / "include" / "kafka_ingest" / "decode" / "codecs"

# --------------------------------------------------------------------------- one per format


def test_every_format_has_its_codec_and_the_codec_says_so() -> None:
    assert sorted(CODECS) == sorted(Format)
    for fmt in Format:
        codec = codec_for(fmt)
        assert codec is codec_for(fmt.value) is CODECS[fmt]  # looked up, never rebuilt
        assert isinstance(codec, Codec) and codec.format is fmt
        # a registry format names its schemas' type; plain JSON has no registry at all
        assert (codec.schema_type is not None) == fmt.registry
    with pytest.raises(ValueError, match="xml"):
        codec_for("xml")


# --------------------------------------------------------------------------- each codec

def _avro_case() -> tuple[WriterSchema, bytes, dict[str, Any]]:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "event_id", "type": "string"}, {"name": "n", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None}]}
    record = {"event_id": "e1", "n": 2**40, "at": datetime(2026, 1, 1, tzinfo=UTC),
              "note": None}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return WriterSchema(3, "AVRO", json.dumps(schema)), out.getvalue(), record


def _protobuf_case() -> tuple[WriterSchema, bytes, dict[str, Any]]:
    fd = descriptor_pb2.FileDescriptorProto(name="c.proto", package="acme", syntax="proto3")
    f = descriptor_pb2.FieldDescriptorProto
    for name in ("Other", "Reading"):  # two messages: the record's indexes say which
        msg = fd.message_type.add(name=name)
        msg.field.add(name="event_id", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
        msg.field.add(name="n", number=2, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    msg.field.add(name="tags", number=3, type=f.TYPE_STRING, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Reading"))
    body = cls(event_id="e1", n=2**40, tags=["a"]).SerializeToString()
    text = base64.b64encode(fd.SerializeToString()).decode()
    # message indexes: count 1 (zigzag 2), index 1 (zigzag 2): the file's second message
    return (WriterSchema(4, "PROTOBUF", text), b"\x02\x02" + body,
            {"event_id": "e1", "n": 2**40, "tags": ["a"]})


def _json_schema_case() -> tuple[WriterSchema, bytes, dict[str, Any]]:
    schema = {"type": "object", "required": ["event_id", "n"], "properties": {
        "event_id": {"type": "string"}, "n": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"}}}
    record = {"event_id": "e1", "n": 2**40, "at": "2026-01-01T00:00:00Z"}
    return WriterSchema(5, "JSON", json.dumps(schema)), json.dumps(record).encode(), record


@dataclass(frozen=True)
class Case:
    fmt: Format
    make: Any
    #: what a record's ``at`` field arrives as; whether the contract validates in Python mode
    at_kind: str | None
    python: bool


CASES = [Case(Format.AVRO, _avro_case, "datetime", True),
         Case(Format.PROTOBUF, _protobuf_case, None, True),
         Case(Format.JSON_SCHEMA, _json_schema_case, "datetime", False)]


class Port:
    """The registry port: records what it is asked, with which ``serialized``."""

    def __init__(self, schema: WriterSchema) -> None:
        self.held, self.asked = schema, []  # type: ignore[var-annotated]

    def schema(self, schema_id: int, *, serialized: bool = False) -> WriterSchema | None:
        self.asked.append(("schema", schema_id, serialized))
        return self.held if schema_id == self.held.schema_id else None

    def latest(self, subject: str, *, serialized: bool = False) -> WriterSchema | None:
        self.asked.append(("latest", subject, serialized))
        return self.held

    def version(self, subject: str, number: int, *,
                serialized: bool = False) -> WriterSchema | None:
        self.asked.append(("version", subject, serialized))
        return self.held


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.fmt.value)
def test_a_registry_codec_reads_its_records_and_describes_their_fields(case: Case) -> None:
    codec = codec_for(case.fmt)
    schema, payload, record = case.make()
    header = b"\x00" + schema.schema_id.to_bytes(4, "big")
    assert codec.schema_id(header + payload) == schema.schema_id
    assert codec.schema_id(b'{"event_id": "e1"}') is None and codec.schema_id(None) is None
    assert codec.reads(schema)
    assert not codec.reads(WriterSchema(9, "XML", "<x/>"))
    # the payload decoded to what the contract validates, then as a Python value
    decoded = codec.reader(schema)(payload)
    assert codec.python == case.python == isinstance(decoded, dict)
    assert codec.python_value(decoded) == record
    with pytest.raises(Undecodable):
        codec.python_value(codec.reader(schema)(b"\xff\xfe\xfd"))
    # the writer's fields, and the kinds the contract's columns take from this format
    fields = codec.record_fields(schema)[0]
    assert fields["n"].kind == "integer" and fields["event_id"].kind == "string"
    assert (fields["at"].kind if "at" in fields else None) == case.at_kind
    assert codec.kinds is (PYTHON_KINDS if case.python else JSON_KINDS)
    assert codec.kinds["timestamptz"] >= ({"datetime"} if case.python else {"string"})
    # the registry is asked as this format needs (Protobuf: as a serialized descriptor)
    port = Port(schema)
    assert codec.schema(port, schema.schema_id) is codec.latest(port, "s") is \
        codec.version(port, "s", 1) is schema  # type: ignore[arg-type]
    serialized = case.fmt is Format.PROTOBUF
    assert port.asked == [("schema", schema.schema_id, serialized),
                          ("latest", "s", serialized), ("version", "s", serialized)]


def test_the_protobuf_codec_offers_each_message_or_the_one_named() -> None:
    codec = codec_for(Format.PROTOBUF)
    schema, _, _ = _protobuf_case()
    assert [sorted(f) for f in codec.record_fields(schema)] == [
        ["event_id", "n"], ["event_id", "n", "tags"]]
    assert [sorted(f) for f in codec.record_fields(schema, "acme.Reading")] == [
        ["event_id", "n", "tags"]]
    with pytest.raises(NoSuchRecord, match=r"'acme\.Nope'.*acme\.Other, acme\.Reading"):
        codec.record_fields(schema, "acme.Nope")


def test_plain_json_has_no_schema_id_and_no_writer_schema() -> None:
    codec = codec_for(Format.JSON)
    # a JSON value that happens to start like the wire header carries no schema id
    assert codec.schema_id(b"\x00\x00\x00\x00\x07{}") is None
    assert (codec.schema_type, codec.python) == (None, False)
    with pytest.raises(NotImplementedError):
        codec.reader(WriterSchema(1, "JSON", "{}"))


# --------------------------------------------------------------------------- nobody else asks

#: The enum's own statement of which formats read a registry (the pipelines file is
#: checked against it at load time, a floor below the codecs).
ALLOWED = {("include/kafka_ingest/config/modes.py", "Format")}
SCANNED = [p for top in ("include", "plugins", "dags", "benchmarks")
           for p in sorted((ROOT / top).rglob("*.py")) if CODEC_PACKAGE not in p.parents]
FORMAT_VALUES = {f.value for f in Format}


def _names_a_format(node: ast.AST) -> bool:
    """``Format.AVRO``, or a tuple, list or set holding one."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_format(e) for e in node.elts)
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "Format" and node.attr in Format.__members__)


def _is_format_value(node: ast.AST) -> bool:
    """``"avro"`` and the other format names as string constants."""
    return isinstance(node, ast.Constant) and node.value in FORMAT_VALUES


def _branches(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        by_name = any(isinstance(o, ast.Attribute) and o.attr == "format"
                      for o in operands) and any(_is_format_value(o) for o in operands)
        return by_name or any(_names_a_format(o) for o in operands)
    if isinstance(node, ast.match_case):
        return any(isinstance(p, ast.MatchValue) and _names_a_format(p.value)
                   for p in ast.walk(node.pattern))
    if isinstance(node, ast.Dict):
        return any(k is not None and _names_a_format(k) for k in node.keys)
    return False


def format_branches(source: str, skip_classes: frozenset[str] = frozenset()) -> list[int]:
    """The lines of ``source`` that branch on a value format: a comparison with a
    ``Format`` member (``is``, ``==``, ``in`` ...), a ``.format`` compared with a format's
    name, a ``match`` case on a member, a table keyed by members; not inside the classes
    named ``skip_classes``."""
    tree = ast.parse(source)
    skipped = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
               and c.name in skip_classes for n in ast.walk(c)}
    return sorted(node.pattern.lineno if isinstance(node, ast.match_case) else node.lineno
                  for node in ast.walk(tree) if id(node) not in skipped and _branches(node))


@pytest.mark.parametrize("source", [
    "if pipeline.format is Format.PROTOBUF:\n    pass",
    "schema = registry.latest(s, serialized=fmt is Format.PROTOBUF)",
    "accepts = A if pipeline.format is not Format.JSON_SCHEMA else B",
    "SCHEMA_TYPES = {Format.AVRO: 'AVRO', Format.PROTOBUF: 'PROTOBUF'}",
    "ok = fmt in (Format.AVRO, Format.JSON_SCHEMA)",
    "match fmt:\n    case Format.AVRO:\n        pass",
    "if pipeline.format == 'avro':\n    pass",
    "choices = [f.value for f in Format if f != Format.JSON]",
])
def test_the_check_finds_each_way_of_branching_on_a_format(source: str) -> None:
    assert format_branches(source) != []


@pytest.mark.parametrize("source", [
    "schema_id = codec_for(pipeline.format).schema_id(value)",
    "if spec.format is KeyFormat.JSON:\n    pass",  # the record key's format: another enum
    "p.add_argument('--format', default=Format.AVRO.value)",
    "if not pipeline.format.registry:\n    pass",
])
def test_the_check_leaves_what_does_not_branch_on_a_format(source: str) -> None:
    assert format_branches(source) == []


def test_no_module_outside_the_codecs_branches_on_the_format() -> None:
    names = {str(p.relative_to(ROOT)) for p in SCANNED}
    # the modules that used to branch are among those read
    assert {"include/kafka_ingest/decode/validate.py", "include/kafka_ingest/decode/schemas.py",
            "include/kafka_ingest/decode/message_columns.py",
            "include/kafka_ingest/decode/decoder.py", "include/kafka_ingest/engine/planning.py",
            "include/kafka_ingest/cli/schema.py", "plugins/kafka_ingest_hook.py"} <= names
    found: dict[str, list[int]] = {}
    unexempted: dict[str, list[int]] = {}
    for path in SCANNED:
        rel = str(path.relative_to(ROOT))
        source = path.read_text(encoding="utf-8")
        skip = frozenset(c for f, c in ALLOWED if f == rel)
        if lines := format_branches(source, skip):
            found[rel] = lines
        if skip and (lines := format_branches(source)):
            unexempted[rel] = lines
    assert found == {}, f"branches on Format outside decode/codecs: {found}"
    # the one exemption is real code the check sees (it would be found without it)
    assert set(unexempted) == {f for f, _ in ALLOWED}


def test_the_check_reads_nested_code_too() -> None:
    source = textwrap.dedent("""
        def f(p):
            def g():
                return [x for x in p if x.format is Format.AVRO]
            return g
        """)
    assert format_branches(source) == [4]
