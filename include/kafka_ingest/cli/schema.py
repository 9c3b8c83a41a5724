"""The commands that make what the pipelines need: the bookkeeping schema and the tables
(``migrate``, ``schema plan|apply``), the grants, the topics, the Airflow pools, and the
contracts (``schema show``, ``schema from-registry``, ``schema from-topic``)."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import yaml

from kafka_ingest.cli.settings import (
    GRANT_TO_ENV,
    MissingSetting,
    admin_database,
    grant_target,
    kafka_clients,
    print_json,
    registry_settings,
)
from kafka_ingest.config import (
    Format,
    Pipeline,
    load_declared_contracts,
    load_pipelines,
    parse_pipelines,
    pool_import_document,
)
from kafka_ingest.contracts import json_schema
from kafka_ingest.db import grant_runtime, migrate
from kafka_ingest.db.tables import TablePlan, apply_pipelines, plan_tables, runtime_tables
from kafka_ingest.decode.codecs import codec_for
from kafka_ingest.decode.envelopes import (
    primary_key_declaration,
    rows_declaration,
    source_changes,
)
from kafka_ingest.decode.infer import (
    ProposedIdentity,
    column_name,
    declaration,
    infer_fields,
    sample_identity,
)
from kafka_ingest.decode.schemas import (
    contract_from_schema,
    key_identity,
    schema_identity,
    schema_problems,
)
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.errors import PrivilegeMissing, SchemaUnreadable, SettingsError, SourceChanged
from kafka_ingest.kafka.reader import sample
from kafka_ingest.kafka.registry import SchemaRegistry, WriterSchema
from kafka_ingest.kafka.topics import create_pipeline_topics


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


def cmd_topics_create(args: argparse.Namespace) -> int:
    created, existed = create_pipeline_topics(kafka_clients(), _chosen(args.pipelines))
    for topic in created:
        print(f"created {topic}")
    for topic in existed:
        print(f"already there: {topic}")
    return 0


def cmd_pools(args: argparse.Namespace) -> int:
    """The Airflow pools the pipelines name, as ``airflow pools import <file>`` reads them."""
    return print_json(pool_import_document(load_pipelines()))


def cmd_schema_from_registry(args: argparse.Namespace) -> int:
    """A pipelines-file document from a subject's latest schema: a declared contract, and
    a pipeline with the identity its key subject or its fields suggest."""
    settings = registry_settings()
    if settings is None:
        raise MissingSetting("KAFKA_INGEST_SCHEMA_REGISTRY_URL",
                             "KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", what="the schema registry")
    codec = codec_for(args.format)
    topic = args.topic or args.subject.removesuffix("-value")
    registry = SchemaRegistry(settings)
    if any(c in args.subject for c in "*?["):
        try:
            return _from_subjects(args, codec, registry)
        finally:
            registry.close()
    try:
        schema = codec.latest(registry, args.subject)
        key = codec.latest(registry, f"{topic}-key") if schema is not None else None
        if schema is None:
            raise SettingsError(f"subject {args.subject!r} is not registered at "
                                f"{settings.url}")
        if not codec.reads(schema):
            raise SettingsError(f"subject {args.subject!r} holds a {schema.schema_type} "
                                f"schema, not {codec.format.value}")
        envelopes = _envelope_versions(codec, registry, args.subject, schema)
    finally:
        registry.close()
    pipeline = args.pipeline or _pipeline(topic)
    event_type = args.event_type or pipeline
    if envelopes:  # Debezium's change events, through a Connect converter
        document, comments = _registry_mirror(codec, topic, args.subject, envelopes, key,
                                              pipeline=pipeline, event_type=event_type,
                                              table=column_name(pipeline))
        _print_comments([f"kafka-ingest schema from-registry {args.subject} --format "
                         f"{codec.format.value}: subject version {schema.version}, schema id "
                         f"{schema.schema_id}", *comments])
        print(yaml.safe_dump(document, sort_keys=False), end="")
        return 0
    body, skipped = contract_from_schema(codec.format, schema,
                                         text_max_length=args.text_max_length,
                                         record=args.record)
    by_key = key_identity(codec.format, key, topic=topic, text_max_length=args.text_max_length,
                          fields=body["fields"]) if key is not None and codec.reads(key) else None
    identity = schema_identity(codec.format, schema, topic=topic, key=by_key,
                               record=args.record)
    registry_keys: dict[str, Any] = {}
    if args.subject != f"{topic}-value":
        skipped.append(f"the subject is not {topic}-value: set schema_registry's "
                       "subject_strategy and record")
    document = declaration(
        event_type=event_type, contract=body, pipeline=pipeline,
        topic=topic, identity=identity,
        extra={"format": codec.format.value, "schema_registry": registry_keys})
    _refused_by_schema(document, schema)
    _print_comments([
        f"kafka-ingest schema from-registry {args.subject} --format {codec.format.value}: "
        f"subject version {schema.version}, schema id {schema.schema_id}",
        f"text fields without a bound got max_length {args.text_max_length}: adjust them "
        "to your data (each is its column's width)",
        *(f"left out: {line}" for line in skipped),
        _identity_comment(identity)])
    print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def _pipeline(topic: str) -> str:
    name = column_name(topic)
    return name if name[:1].isalpha() else f"p_{name}"[:63]


def _identity_comment(identity: ProposedIdentity) -> str:
    chosen = identity.value or "event_id"
    return f"identity: {chosen}, because {identity.why}"


def _print_comments(lines: Iterable[str]) -> None:
    for line in lines:
        for part in textwrap.wrap(line, 96, subsequent_indent="  ") or [""]:
            print(f"# {part}")


def _short(text: str, limit: int = 400) -> str:
    """An error's detail, bounded (a schema of many fields explains each)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _loaded(document: dict[str, Any]) -> Pipeline:
    try:
        (pipeline,) = parse_pipelines(document).values()
    except ValueError as exc:
        raise SettingsError(f"the declaration made does not load: {exc}") from exc
    return pipeline


def _refused_by_schema(document: dict[str, Any], schema: WriterSchema) -> None:
    """The check that what is printed reads what it was made from."""
    problems = schema_problems(_loaded(document), schema)
    if problems:
        raise SettingsError("the contract made would refuse records of the schema it was "
                            f"made from: {_short('; '.join(problems))}")


def cmd_schema_from_topic(args: argparse.Namespace) -> int:
    """A pipelines-file document guessed from a sample of a schemaless JSON topic, or a
    mirror's from Debezium's change events (one topic, or every topic a pattern names)."""
    if args.sample < 1:
        raise SettingsError("--sample must be at least 1")
    clients = kafka_clients()
    if any(c in args.topic for c in "*?["):
        return _from_topics(args, clients)
    values, records = _sampled(clients, args.topic, args.sample)
    pipeline = args.pipeline or _pipeline(args.topic)
    event_type = args.event_type or pipeline
    if _is_change_event(records[0]):
        document, comments = _sampled_mirror(args.topic, values, records, pipeline=pipeline,
                                             event_type=event_type,
                                             table=column_name(pipeline))
        _print_checked(document, values, comments)
        return 0
    inferred = infer_fields(records)
    if not inferred.fields:
        raise SettingsError(f"topic {args.topic!r}: no field of the {len(records)} sampled "
                            f"records has a type to guess ({_short('; '.join(inferred.left_out))})")
    identity = sample_identity(inferred, [m.key() for m in values], topic=args.topic)
    document = declaration(
        event_type=event_type, pipeline=pipeline, topic=args.topic, identity=identity,
        contract={"version": 1, "doc": f"Guessed from {len(records)} records of topic "
                  f"{args.topic!r}.", "fields": inferred.fields})
    _print_checked(document, values, [
        f"kafka-ingest schema from-topic {args.topic} --sample {args.sample}: guessed from "
        f"{len(records)} records (the oldest of each partition); check each guess against "
        "what the topic may hold",
        *(f"{line}" for line in inferred.guesses),
        *(f"left out: {line}" for line in inferred.left_out),
        _identity_comment(identity)])
    return 0


def _sampled(clients: Any, topic: str, n: int) -> tuple[list[Any], list[dict[str, Any]]]:
    """The sampled records of ``topic`` that have a value, and their values (JSON objects)."""
    consumer = clients.consumer("kafka-ingest.schema-from-topic")
    try:
        messages = sample(consumer, topic, n, idle_timeout_s=clients.request_timeout_s)
    finally:
        consumer.close()
    values = [m for m in messages if m.value() is not None]
    if not values:
        raise SettingsError(f"topic {topic!r} holds no records to sample"
                            + (" (only tombstones)" if messages else ""))
    return values, [_json_object(m, topic) for m in values]


#: What declares one topic's mirror for :func:`_print_mirrors`: (topic, pipeline, table)
#: -> (its document, what it says); raises :class:`SettingsError` (or
#: :class:`SourceChanged`) to leave that topic out, saying why.
DeclareMirror = Callable[[str, str, str], tuple[dict[str, Any], list[str]]]


def _print_mirrors(command: str, pattern: str, topics: list[str],
                   declare: DeclareMirror) -> int:
    """One document mirroring each of ``topics`` (those the pattern matches: Debezium
    writes a topic per table) that ``declare`` declares: a pipeline and a contract each,
    named after the topic, each table after its source table (the topic's name when two
    source tables share a name); the topics left out are named, with why."""
    if not topics:
        raise SettingsError(f"nothing matches {pattern!r}")
    tables = [column_name(t.rsplit(".", 1)[-1]) for t in topics]
    document: dict[str, Any] = {"contracts": {}, "pipelines": {}}
    comments = [f"kafka-ingest schema {command} {pattern!r}: {len(topics)} topics"]
    for topic, table in zip(topics, tables, strict=True):
        pipeline = _pipeline(topic)
        try:
            one, said = declare(topic, pipeline,
                                table if tables.count(table) == 1 else pipeline)
        except (SettingsError, SourceChanged) as exc:  # this table only (a key of two
            # columns, a column retyped within the sample, ...)
            comments.append(f"left out: {topic}: "
                            f"{str(exc).removeprefix(f'topic {topic!r}: ')}")
            continue
        for section in ("contracts", "pipelines"):
            document[section].update(one[section])
        comments += said
    if not document["pipelines"]:
        raise SettingsError(f"none of the topics {pattern!r} matches holds change events "
                            "with their schema")
    _print_comments(comments)
    print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def _no_names(args: argparse.Namespace) -> None:
    if args.event_type or args.pipeline:
        raise SettingsError("--event-type and --pipeline name one topic's contract and "
                            "pipeline; with a pattern each is named after its topic")


def _from_topics(args: argparse.Namespace, clients: Any) -> int:
    """:func:`_print_mirrors` of every topic of change events with their schema that the
    pattern ``args.topic`` matches, each declared from a sample."""
    _no_names(args)
    names = sorted(t for t in clients.admin().list_topics(
        timeout=clients.request_timeout_s).topics
        if fnmatch.fnmatchcase(t, args.topic) and not t.startswith("__")
        and not t.endswith("-dlq"))

    def declare(topic: str, pipeline: str, table: str) -> tuple[dict[str, Any], list[str]]:
        values, records = _sampled(clients, topic, args.sample)
        if not _is_change_event(records[0]):
            raise SettingsError("not Debezium change events with their schema")
        one, said = _sampled_mirror(topic, values, records, pipeline=pipeline,
                                    event_type=pipeline, table=table)
        _check(one, values)
        return one, said

    return _print_mirrors("from-topic", args.topic, names, declare)


def _from_subjects(args: argparse.Namespace, codec: Any, registry: SchemaRegistry) -> int:
    """:func:`_print_mirrors` of every topic whose value subject the pattern
    ``args.subject`` matches (``pg.public.*-value``) and holds Debezium's change events,
    each declared from its subject's versions (:func:`_envelope_versions`)."""
    _no_names(args)
    if args.topic:
        raise SettingsError("--topic names one subject's topic; with a pattern each topic "
                            "is its subject's name without '-value'")
    names = sorted(s.removesuffix("-value") for s in registry.subjects()
                   if fnmatch.fnmatchcase(s, args.subject) and s.endswith("-value"))

    def declare(topic: str, pipeline: str, table: str) -> tuple[dict[str, Any], list[str]]:
        subject = f"{topic}-value"
        schema = codec.latest(registry, subject)
        envelopes = (_envelope_versions(codec, registry, subject, schema)
                     if schema is not None and codec.reads(schema) else [])
        if not envelopes:
            raise SettingsError(f"not Debezium change events in {codec.format.value}")
        return _registry_mirror(codec, topic, subject, envelopes,
                                codec.latest(registry, f"{topic}-key"), pipeline=pipeline,
                                event_type=pipeline, table=table)

    return _print_mirrors("from-registry", args.subject, names, declare)


def _registry_mirror(codec: Any, topic: str, subject: str,
                     envelopes: list[tuple[int | None, Any]], key: WriterSchema | None, *,
                     pipeline: str, event_type: str, table: str
                     ) -> tuple[dict[str, Any], list[str]]:
    """:func:`_mirror` of the change events of the value subject ``subject`` in a registry
    format (``envelopes``: its versions' Connect schemas, :func:`_envelope_versions`), keyed
    by the key schema ``key``; refused when a version's records would stop its run."""
    if key is None or not codec.reads(key):
        raise SettingsError(f"topic {topic!r}: no {codec.format.value} key subject "
                            f"{topic}-key: a mirror deletes and orders rows by the primary "
                            "key its record keys carry (the table has none, or the keys are "
                            "written by another converter than the values)")
    document, said = _mirror(
        topic, [connect for _, connect in envelopes], codec.connect_schema(key),
        pipeline=pipeline, event_type=event_type, table=table,
        extra={"format": codec.format.value, "schema_registry": {}})
    _loaded(document)
    _reads_every_version(document, subject, envelopes)
    return document, said


def _print_checked(document: dict[str, Any], sampled: list[Any], comments: list[str]) -> None:
    """Print ``document`` after its comments, once :func:`_check` passes."""
    _check(document, sampled)
    _print_comments(comments)
    print(yaml.safe_dump(document, sort_keys=False), end="")


def _check(document: dict[str, Any], sampled: list[Any]) -> None:
    """Refuse a declaration whose pipeline refuses a record it was made from (it is never
    printed)."""
    refused = validate_chunk(sampled, _loaded(document)).dead
    if refused:
        raise SettingsError(f"the contract guessed would refuse {len(refused)} of the sampled "
                            f"records, e.g. offset {refused[0].source_offset}: "
                            f"{refused[0].error_class}: {_short(refused[0].error_detail)}")


def _is_change_event(record: dict[str, Any]) -> bool:
    """Whether a sampled value is a Debezium change event with its schema (Kafka Connect's
    JsonConverter with ``schemas.enable``)."""
    payload = record.get("payload")
    return record.keys() == {"schema", "payload"} and isinstance(payload, dict) \
        and "op" in payload and isinstance(record["schema"], dict)


def _mirror(topic: str, envelopes: list[Any], key_schema: Any, *, pipeline: str,
            event_type: str, table: str, extra: dict[str, Any] | None = None
            ) -> tuple[dict[str, Any], list[str]]:
    """A mirror's declaration (``envelope: debezium``) from the change events' own schema
    (``envelopes``, Connect schemas oldest first: the newest one's row), its primary key
    from the record key's Connect schema ``key_schema``; ``extra``: the format's keys (a
    registry format's keys are in that format too), and what it says of it."""
    registry = extra is not None
    try:
        fields, guesses, left_out = rows_declaration(envelopes)
        key = primary_key_declaration(key_schema, fields,
                                      key_format="registry" if registry else "json")
    except (ValueError, AttributeError) as exc:
        raise SettingsError(f"topic {topic!r}: {exc}") from None
    document = declaration(
        event_type=event_type, pipeline=pipeline, topic=topic,
        identity=ProposedIdentity(None, ""), extra={"envelope": "debezium", **(extra or {}),
                                                    **key},
        contract={"version": 1, "doc": f"The rows of the change events of topic {topic!r}.",
                  "fields": fields})
    document["pipelines"][pipeline]["table"] = table
    what = (f"the record key's {key['record_key']['column']!r}" if "record_key" in key
            else f"the record key's fields {', '.join(key['identity'])} (a composite key)")
    schema = "the registry's schema" if registry else "their schema"
    return document, [
        f"{topic}: Debezium change events; the contract is {schema}'s row (the newest "
        f"{'version' if registry else 'sampled'}), the table's key {what}",
        *(f"  {line}" for line in guesses), *(f"  left out: {line}" for line in left_out)]


def _sampled_mirror(topic: str, values: list[Any], records: list[dict[str, Any]], *,
                    pipeline: str, event_type: str, table: str
                    ) -> tuple[dict[str, Any], list[str]]:
    """:func:`_mirror` of sampled change events with their schema (JsonConverter's)."""
    keyed = next((m for m in reversed(values) if m.key()), None)
    try:
        key_schema = json.loads(keyed.key()).get("schema") if keyed is not None else None
    except (ValueError, AttributeError):
        raise SettingsError(f"topic {topic!r}: the record key is not JSON with its "
                            "schema") from None
    return _mirror(topic, [r["schema"] for r in records if _is_change_event(r)], key_schema,
                   pipeline=pipeline, event_type=event_type, table=table)


def _envelope_versions(codec: Any, registry: SchemaRegistry, subject: str,
                       latest: WriterSchema) -> list[tuple[int | None, Any]]:
    """(version, Connect schema) of each version of ``subject`` that is Debezium's change
    events', oldest first, when its ``latest`` is (else none): the topic holds records of
    the older versions too (a snapshot written before a column was added or dropped)."""
    try:
        connect = codec.connect_schema(latest)
    except SchemaUnreadable:  # no Connect schema to read (a plain schema nested deeper)
        return []
    if not _is_envelope(connect):
        return []
    older = [codec.version(registry, subject, n) for n in registry.versions(subject)
             if n != latest.version]
    return [*((s.version, c) for s in older if s is not None and codec.reads(s)
              and _is_envelope(c := codec.connect_schema(s))), (latest.version, connect)]


def _reads_every_version(document: dict[str, Any], subject: str,
                         envelopes: list[tuple[int | None, Any]]) -> None:
    """Refuse a mirror's declaration whose run would stop at records of one of the
    subject's versions (a column retyped since: the drift check's
    :class:`~kafka_ingest.errors.SourceChanged`); it is never printed."""
    (contract,) = document["contracts"].values()
    for version, connect in envelopes:
        changes = source_changes(connect, contract["fields"])
        if changes:
            raise SettingsError(f"the declaration made would stop at the records of subject "
                                f"{subject!r} version {version}: {_short('; '.join(changes))}")


def _is_envelope(connect: Any) -> bool:
    """Whether a Connect schema is that of Debezium's change events."""
    names = {f.get("field") for f in (connect or {}).get("fields") or ()
             if isinstance(f, dict)}
    return {"op", "after"} <= names


def _json_object(message: Any, topic: str) -> dict[str, Any]:
    where = f"topic {topic!r} partition {message.partition()} offset {message.offset()}"
    try:
        value = json.loads(message.value())
    except ValueError:
        raise SettingsError(f"{where}: the value is not JSON (a registry format? use "
                            "`schema from-registry`)") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{where}: the value is a JSON {type(value).__name__}, not an "
                            "object") from None
    return value


def cmd_schema_show(args: argparse.Namespace) -> int:
    return print_json(json_schema(args.event_type, args.version, load_declared_contracts()))


def add_commands(sub: Any) -> None:
    """``migrate``, ``schema`` (plan, apply, show, from-registry, from-topic), ``topics create``,
    ``pools``."""
    p = sub.add_parser("migrate", help="create or upgrade the schema and every pipeline's "
                       "tables (as the owner role), then grant the runtime role")
    p.add_argument("--dsn", help="the owner's DSN (default: $KAFKA_INGEST_PG_ADMIN_DSN)")
    p.add_argument("--grant-to", metavar="ROLE",
                   help="grant this runtime role the DML the pipelines need, and no more "
                        f"(default: ${GRANT_TO_ENV}, which `stack env --secure` sets; an "
                        "empty value grants nothing)")
    p.set_defaults(func=cmd_migrate)

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
                              "the pipelines file) made from a subject's latest schema, or a "
                              "mirror's from Debezium's change events")
    p.add_argument("subject")
    p.add_argument("--format", choices=[f.value for f in Format if f.registry],
                   default=Format.AVRO.value)
    p.add_argument("--event-type", help="the contract's name (default: the pipeline's)")
    p.add_argument("--text-max-length", type=int, default=256,
                   help="the bound of text fields whose schema gives none")
    p.add_argument("--record", help="Protobuf: the message of the file to read (its full "
                   "name; default: the first)")
    p.add_argument("--topic", help="the topic (default: the subject without '-value')")
    p.add_argument("--pipeline", help="the pipeline's name (default: the topic's)")
    p.set_defaults(func=cmd_schema_from_registry)
    p = schema_sub.add_parser("from-topic", help="print a declared contract and a pipeline "
                              "guessed from a sample of a schemaless JSON topic, or a mirror's "
                              "from Debezium's change events")
    p.add_argument("topic", help="a topic, or (change events) a pattern such as "
                   "'pg.public.*': a pipeline per matching topic")
    p.add_argument("--sample", type=int, default=1000, metavar="N",
                   help="how many records to read (the oldest, spread over the partitions)")
    p.add_argument("--event-type", help="the contract's name (default: the pipeline's)")
    p.add_argument("--pipeline", help="the pipeline's name (default: the topic's)")
    p.set_defaults(func=cmd_schema_from_topic)
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
