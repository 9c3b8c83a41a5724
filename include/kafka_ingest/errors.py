"""The errors of kafka_ingest. The class of an error decides what happens to the failure.

::

    IngestError
    ├── TransientError            raise; nothing is committed; Airflow retries with backoff
    │   ├── KafkaUnavailable      broker unreachable, metadata or fetch timed out
    │   ├── DeliveryFailed        a dead letter was not acknowledged by the DLQ topic
    │   ├── RegistryUnavailable   the schema registry down, timing out, or answering 5xx
    │   ├── RegistryLacksSchemas  the registry knows none of the schema ids a chunk's
    │   │                         records carry (restored from another backup? a lagging
    │   │                         replica?): an infrastructure fault, not poison
    │   ├── DatabaseUnavailable   Postgres down, restarted, connection lost, lock timeout
    │   ├── CommitOutcomeUnknown  the reply to COMMIT was lost; re-read the stored offset
    │   └── FencedError           the stored offset moved under this chunk (a zombie or an
    │                             overlapping run); the retry resumes from where it is now
    ├── PermanentError            fail the task now, without retries; the message says what
    │   │                         to do
    │   ├── OffsetGapError        the range starts below the low watermark (retention)
    │   ├── OffsetOutOfRange      the broker has no such offset, a stored offset is past
    │   │                         the high watermark (topic recreated?), or a cursor was
    │   │                         moved back under a slice
    │   ├── TopicRecreated        the stored offsets belong to a topic deleted and created
    │   │                         again since: reset them to read the new one
    │   ├── KafkaRefused          authentication, authorisation, TLS, or a fatal client
    │   │                         error: no retry can cure it
    │   ├── RegistryRefused       the schema registry refused the login or its TLS
    │   ├── ContractMismatch      the pipeline's contract reads none of the subject's
    │   │                         registered versions (a field it requires is missing or of
    │   │                         another type in every one)
    │   ├── DatabaseRefused       Postgres refused the login: password, certificate, TLS
    │   │                         required by pg_hba.conf, unknown role or database
    │   ├── SettingsError         a connection or setting that cannot work (no host, ...)
    │   ├── ReconciliationError   read != inserted + duplicates + stale + dead + skipped
    │   ├── TriggerParamsError    a trigger form / CLI range that cannot be honoured
    │   ├── SchemaMissing         the pipelines' tables are not there (as the role sees
    │   │                         them): run the migrations, or grant USAGE on the schema
    │   ├── PrivilegeMissing      the role may not use a table, sequence, the schema, or
    │   │                         TEMPORARY on the database: grant the runtime privileges
    │   ├── SchemaDrift           the target table does not match the contract (a column
    │   │                         missing, a type too narrow, a NOT NULL the contract may
    │   │                         leave empty): `kafka-ingest schema apply`, or the fix named
    │   └── TopicMissing          a source or dead-letter topic does not exist
    └── DataError                 dead-letter the message, the batch goes on
        ├── Undecodable           not UTF-8, not JSON, nested too deep, empty; a payload
        │                         its writer schema cannot decode
        ├── NotAnObject           JSON that is an array, a number, a string or null
        ├── ContractViolation     fails the Pydantic contract
        ├── UnknownVersion        a contract version this pipeline does not accept
        ├── TooLarge              over the pipeline's max_message_bytes
        ├── NotWireFormat         a registry-encoded pipeline's record without the
        │                         Confluent wire header (magic byte 0, a schema id)
        ├── UnknownSchema         a schema id the registry does not know (404), beside
        │                         records of the same chunk whose ids it knows
        ├── SchemaUnreadable      a writer schema the reader cannot build (a reference the
        │                         registry has no version for, an import nothing defines)
        ├── BadKey                the record key the pipeline reads a column from is
        │                         missing, not UTF-8 / JSON, or out of its bounds
        ├── BadHeader             a header mapped to a column is not UTF-8 text that fits
        │                         (or is missing, when required)
        ├── Unorderable           a key's record that log order cannot place against its
        │                         stored version (another partition or topic)
        ├── BadEnvelope           a change event that is not one (no or an unknown op)
        ├── UnavailableValue      a change event leaving a TOASTed column out, for a key
        │                         the mirror holds no row of
        └── RejectedByDatabase    passed the contract, Postgres still refused it

Retry policy is the class: the Airflow adapter fails at once on ``PermanentError`` and
lets every other error propagate for Airflow's retries. Library errors are mapped onto
this tree where the library is used: Kafka's in :mod:`kafka_ingest.kafka.clients`, psycopg's in
:mod:`kafka_ingest.db.connection`. Bad configuration is not an IngestError: it raises
``ValueError`` when it is loaded.

Every error survives pickling with its message and fields (``kafka-ingest run --workers``
and Airflow hand them between processes), whatever its ``__init__`` takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _restore(cls: type[IngestError], args: tuple[object, ...],
             fields: dict[str, object]) -> IngestError:
    """Unpickle an error without calling its ``__init__`` (whose parameters are its fields,
    not its message)."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(fields)
    return err


class IngestError(Exception):
    """Base of every error this package raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own pickling calls cls(*args) with the message alone, which fails for
        # every class whose __init__ takes fields: an error raised in a worker process
        # would then reach the parent as a broken pool instead of itself.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class TransientError(IngestError):
    """Infrastructure failed; nothing was committed. Retrying later is the cure."""


class PermanentError(IngestError):
    """A retry cannot cure this: fail now and say what to do."""


# --------------------------------------------------------------------------- transient


class KafkaUnavailable(TransientError):
    """The broker did not answer or answered with a retriable error."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"Kafka {operation} failed: {reason}")


class RegistryUnavailable(TransientError):
    """The schema registry did not answer, timed out, or answered 5xx/429."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"schema registry {operation} failed: {reason}")


class RegistryLacksSchemas(TransientError):
    """The registry answered 404 for every schema id a chunk's records carry.

    One unknown id among known ones is that record's fault (:class:`UnknownSchema`, dead
    letters); a chunk none of whose ids the registry knows says more about the registry
    than about the records: one restored from another backup, a replica that lags the
    one the producers register with, or the wrong registry. Dead-lettering the chunk would
    move a stream of readable records to the DLQ; so the chunk fails, nothing is
    dead-lettered, no offset moves, and the retry reads it again.
    """

    def __init__(self, where: str, schema_ids: list[int], url: str) -> None:
        self.where = where
        self.schema_ids = schema_ids
        self.url = url
        shown = ", ".join(map(str, schema_ids[:10])) + (", ..." if len(schema_ids) > 10 else "")
        super().__init__(
            f"{where}: the schema registry at {url} knows none of schema ids [{shown}] that "
            "this chunk's records carry: a registry restored from another backup, a lagging "
            "replica, or not the registry the producers write with? Nothing was "
            "dead-lettered and no offset moved; the chunk is read again once the registry "
            "serves these ids (a lone unknown id among known ones is dead-lettered as "
            "unknown_schema)"
        )


class DeliveryFailed(TransientError):
    """At least one dead letter was not acknowledged by the DLQ topic."""

    def __init__(self, topic: str, failures: list[str], total: int) -> None:
        self.topic = topic
        self.failures = failures
        self.total = total
        shown = "; ".join(failures[:3])
        super().__init__(
            f"{len(failures)} of {total} dead letters were not delivered to {topic!r} "
            f"(first: {shown}); nothing was committed"
        )


class DatabaseUnavailable(TransientError):
    """Postgres is down, restarted, or a lock could not be taken in time."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"Postgres {operation} failed: {reason}")


class CommitOutcomeUnknown(TransientError):
    """The COMMIT was sent but its reply was lost: it may or may not have happened."""

    def __init__(self, pipeline: str, partition: int, start: int, end: int) -> None:
        self.pipeline = pipeline
        self.partition = partition
        self.start = start
        self.end = end
        super().__init__(
            f"{pipeline}[{partition}]: the reply to COMMIT of [{start}, {end}) was lost; "
            "the stored offset must be re-read before anything else is done"
        )


class FencedError(TransientError):
    """The stored offset is not where this chunk expected it: another run moved it.

    The chunk was rolled back. A retry resumes the slice from the offset stored now, so
    nothing is read twice into the table and nothing is skipped.
    """

    def __init__(self, pipeline: str, topic: str, partition: int, expected: int,
                 found: int | None) -> None:
        self.pipeline = pipeline
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.found = found
        super().__init__(
            f"{pipeline} {topic}[{partition}]: stored offset is {found}, expected {expected}; "
            "another run advanced it, this chunk was rolled back"
        )


# --------------------------------------------------------------------------- permanent


class OffsetGapError(PermanentError):
    """The planned start is below the low watermark: retention deleted unread data."""

    def __init__(self, topic: str, partition: int, start: int, low: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.low = low
        super().__init__(
            f"{topic}[{partition}]: offsets [{start}, {low}) were deleted by retention before "
            f"they were ingested ({low - start} messages lost to this pipeline). Set "
            "on_offset_gap: skip to record the gap and go on, or restore the data."
        )


class OffsetOutOfRange(PermanentError):
    """An offset the partition cannot serve, or a cursor moved back under a slice."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        self.detail = detail
        super().__init__(
            f"{where}: {detail}; was the topic deleted and recreated, or the "
            "offset reset by hand? Check, then set the stored offset with "
            "`kafka-ingest reset-offsets`."
        )


class TopicRecreated(PermanentError):
    """The stored offsets are offsets of a topic that was deleted (and the name given to a
    new topic): reading on from them would skip the new topic's records."""

    def __init__(self, name: str, topic: str, stored_id: str, topic_id: str,
                 partitions: list[int], *, dlq: bool = False) -> None:
        self.name, self.topic = name, topic
        self.stored_id, self.topic_id, self.partitions = stored_id, topic_id, partitions
        self.dlq = dlq
        which = "--all" if len(partitions) > 1 else f"--partition {partitions[0]}"
        which += " --dlq" if dlq else ""
        super().__init__(
            f"{name}: topic {topic!r} was deleted and re-created since its offsets were "
            f"stored (topic id {stored_id}, now {topic_id}): the stored offsets of "
            f"partition(s) {', '.join(map(str, partitions))} are the old topic's. Read the "
            f"new topic from its start with `kafka-ingest reset-offsets {name} {which} --to "
            "earliest --yes` (its records count as newer than every row the old topic "
            "left), or from its end with --to latest")


class KafkaRefused(PermanentError):
    """The cluster refused this client: credentials, permissions, TLS, or a fatal state."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"Kafka {operation} refused: {reason}; fix the Kafka connection's "
                         "settings (a retry cannot cure this)")


class RegistryRefused(PermanentError):
    """The schema registry refused this client: credentials or TLS."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"schema registry {operation} refused: {reason}; fix the registry "
                         "connection's settings (a retry cannot cure this)")


class ContractMismatch(PermanentError):
    """The pipeline's contract reads none of the subject's registered versions: no record
    written under the subject can load, so the run fails before any data moves.
    ``problems``: why it cannot read the latest version.

    A contract that reads some version but not the latest is not this error: records are
    judged by the schema they carry, those written with an unreadable one dead-lettered
    (``contract_violation``, naming the schema id and the field)."""

    def __init__(self, pipeline: str, subject: str, problems: list[str], *,
                 versions: int = 1) -> None:
        self.pipeline, self.subject, self.problems = pipeline, subject, problems
        self.versions = versions
        which = "its only version" if versions == 1 else f"any of its {versions} versions"
        super().__init__(f"pipeline {pipeline}: its contract cannot read {which} of subject "
                         f"{subject!r} (the latest: {'; '.join(problems)}); fix the "
                         "contract or the subject")


class DatabaseRefused(PermanentError):
    """Postgres refused the connection: credentials, certificate, or TLS required."""

    def __init__(self, kind: str, reason: str) -> None:
        self.kind = kind
        self.reason = reason
        super().__init__(f"Postgres refused the connection ({kind}): {reason}; fix the "
                         "connection's settings (a retry cannot cure this)")


class SettingsError(PermanentError, ValueError):
    """A connection or setting that cannot work, named with what to set."""


class ReconciliationError(PermanentError):
    """The counts of a chunk do not add up, or valid rows are not in the table after the
    upsert: something was lost or counted twice."""

    def __init__(self, partition: int, read: int, accounted: Mapping[str, int],
                 *, missing: int = 0) -> None:
        self.partition = partition
        self.read = read
        self.accounted = dict(accounted)
        self.missing = missing
        parts = " + ".join(f"{k} {v}" for k, v in accounted.items())
        lost = f"; {missing} valid rows are not in the table after the upsert" if missing else ""
        super().__init__(
            f"partition {partition}: read {read} but {parts} = {sum(accounted.values())}{lost}"
        )


class SchemaMissing(PermanentError):
    """A table the pipelines need does not exist, as this role sees it: the migrations
    never ran, or the role may not use the schema (without USAGE on it, Postgres says
    "relation ... does not exist", not "permission denied"). ``role``: the role the request
    ran as, if known."""

    def __init__(self, detail: str, *, role: str | None = None) -> None:
        self.detail = detail
        self.role = role
        who = f"role {role!r}" if role else "this connection's role"
        super().__init__(f"{detail}; create the schema with `kafka-ingest migrate`, or, if it "
                         f"was migrated, {who} may not use the schema: the owner grants it "
                         f"with `kafka-ingest migrate --grant-to {role or '<role>'}`")


class PrivilegeMissing(PermanentError):
    """Postgres denied the role a privilege: on a table, a sequence, the schema, or
    TEMPORARY on the database (the staging tables). The schema's owner grants what the
    runtime role needs with ``kafka-ingest migrate --grant-to <role>``.

    ``detail`` is Postgres's message, which names the object ("permission denied for
    table run_plans"); ``on`` is that object as ``"<kind> <name>"`` ("table run_plans",
    "database pipelines") when the message has one of the known forms; ``role`` is the
    role the request ran as (``None`` if not known). ``fix`` replaces the usual advice
    where it does not apply (a migration run as a role that is not the owner).
    """

    def __init__(self, role: str | None, detail: str, *, on: str | None = None,
                 fix: str | None = None) -> None:
        self.role = role
        self.detail = detail
        self.on = on
        who = f"role {role!r}" if role else "this connection's role"
        self.fix = fix or ("the schema's owner grants the runtime privileges with "
                           f"`kafka-ingest migrate --grant-to {role or '<role>'}`")
        super().__init__(f"Postgres denied {who} a privilege: {detail}; {self.fix}")


class SourceChanged(PermanentError):
    """A mirror's change events carry a row the contract no longer follows (a column added,
    dropped or retyped at the source): the run stops before the chunk is written, rather
    than mirror part of the row; a new contract version that follows it, applied, lets it
    go on from the same offset."""

    def __init__(self, pipeline: str, where: str, changes: list[str]) -> None:
        self.pipeline, self.where, self.changes = pipeline, where, changes
        super().__init__(f"pipeline {pipeline}: the source table changed ({where}): "
                         f"{'; '.join(changes)}; declare it in a new contract version, then "
                         f"`kafka-ingest schema plan {pipeline}` (and apply)")


class ReplicaIdentityNotFull(PermanentError):
    """A mirror set to ``replica_identity: full`` met an update without the old row, which
    a source table with ``REPLICA IDENTITY FULL`` always sends: the source is not ``FULL``,
    so a value the update left unchanged may have come as a null (an array stored out of
    line) that the mirror would write. The run stops before the chunk is written."""

    def __init__(self, pipeline: str, where: str) -> None:
        self.pipeline, self.where = pipeline, where
        super().__init__(
            f"pipeline {pipeline}: a change event of op 'u' ({where}) carries no old row "
            "('before' is null): its source table is not REPLICA IDENTITY FULL, as "
            "replica_identity: full says. Give the source table REPLICA IDENTITY FULL, let "
            "Debezium snapshot it again, and `kafka-ingest reset-offsets` the partition to "
            "the snapshot's first record; or go back to replica_identity: default (arrays "
            "of most types then cannot be mirrored)")


class SchemaDrift(PermanentError):
    """The pipeline's table cannot take its rows as it is; found before any data moves."""

    def __init__(self, pipeline: str, drift: list[str], missing: list[str]) -> None:
        self.pipeline, self.drift, self.missing = pipeline, drift, missing
        parts = list(drift)
        if missing:
            parts.append("needs " + "; ".join(missing) + ": run `kafka-ingest schema apply "
                         f"{pipeline}` as the migrating role (or set auto_create/auto_evolve)")
        super().__init__(f"pipeline {pipeline}: the target table does not match the "
                         f"contract: {' | '.join(parts)}")


class TopicMissing(PermanentError, ValueError):
    """A topic the pipeline reads or writes does not exist (topics are not auto-created)."""

    def __init__(self, topic: str, role: str = "topic") -> None:
        self.topic = topic
        super().__init__(f"{role} {topic!r} does not exist on the cluster; create it "
                         "(`kafka-ingest topics create`, or kafka-topics.sh --create) or fix "
                         "the pipeline's config")


class TriggerParamsError(PermanentError, ValueError):
    """A run's parameters cannot be honoured; the message names the field and the fix."""


# --------------------------------------------------------------------------- data


class DataError(IngestError):
    """A message that cannot be loaded. It is dead-lettered; the batch goes on."""

    error_class = "data_error"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class Undecodable(DataError):
    error_class = "undecodable"


class NotAnObject(DataError):
    error_class = "not_an_object"


class ContractViolation(DataError):
    error_class = "contract_violation"


class UnknownVersion(DataError):
    error_class = "unknown_version"


class TooLarge(DataError):
    error_class = "too_large"


class NotWireFormat(DataError):
    error_class = "not_wire_format"


class UnknownSchema(DataError):
    error_class = "unknown_schema"


class SchemaUnreadable(DataError):
    """A record whose writer schema the reader cannot build (a reference the registry has
    no version for, a Protobuf import that no reference and no well-known type defines).

    Only the records of that schema id are dead-lettered, the others of the chunk load and
    the offsets move on: a schema nobody can read must not stop a pipeline at its first
    record until someone moves the offsets by hand. Once the schema or the reader is fixed
    its letters load with the DLQ replay (``--error-class schema_unreadable``). The
    registry unreachable while the schema or its references are fetched is not this
    error: that is :class:`RegistryUnavailable`, which dead-letters nothing."""

    error_class = "schema_unreadable"

    def __init__(self, schema_id: int, reason: str) -> None:
        self.schema_id, self.reason = schema_id, reason
        super().__init__(f"schema id {schema_id} cannot be read: {reason}")


class BadKey(DataError):
    error_class = "bad_key"


class BadHeader(DataError):
    error_class = "bad_header"


class Unorderable(DataError):
    """A ``latest`` pipeline ordered by the log met a key whose stored version (row or
    deletion marker) came from another partition or topic: offsets cannot say which one
    is newer, so neither is guessed. Replayable once the stored version is removed (the
    key's records then order within the one partition they come from)."""

    error_class = "unorderable"


class BadEnvelope(DataError):
    """A change event (``envelope: debezium``) that is not one: no object, no or an unknown
    ``op``, no ``after`` row for an insert or update, or a truncate the pipeline refuses."""

    error_class = "bad_envelope"


class UnavailableValue(DataError):
    """A change event (``envelope: debezium``) that leaves a column out (Debezium's
    placeholder for a TOASTed value the change did not touch) while the mirror holds no
    row of its key to keep the column's value from (the row's insert was dead-lettered, or
    came before the offsets the mirror began at): writing it would store the placeholder.
    Replayable once the row's insert is (the update then keeps the value it wrote)."""

    error_class = "unavailable_value"


class RejectedByDatabase(DataError):
    error_class = "rejected_by_database"


#: The data errors a dead letter can name, in the order they are defined above: every
#: subclass of :class:`DataError` (a new one is a reason of its own without being listed).
DATA_ERROR_CLASSES: tuple[type[DataError], ...] = tuple(DataError.__subclasses__())
#: Error classes a dead letter can carry (``data_error`` is a dead-lettered tombstone).
KNOWN_ERROR_CLASSES: tuple[str, ...] = (
    *(c.error_class for c in DATA_ERROR_CLASSES), DataError.error_class,
)
