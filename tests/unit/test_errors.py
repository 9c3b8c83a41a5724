"""The error tree decides retries, and each library's errors are mapped onto it in one place.

The mappings are checked case by case against a named table (what each library error
means to an operator), not by a sweep that restates the mapping: a sweep that copies the
rule it tests cannot fail where the rule is wrong.
"""

from __future__ import annotations

import inspect
import pickle

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException
from psycopg.conninfo import conninfo_to_dict

from kafka_ingest import errors
from kafka_ingest.db import Database, map_psycopg_error
from kafka_ingest.db.connection import connection_defaults
from kafka_ingest.errors import (
    DATA_ERROR_CLASSES,
    BadEnvelope,
    BadHeader,
    BadKey,
    CommitOutcomeUnknown,
    ContractMismatch,
    ContractViolation,
    DatabaseRefused,
    DatabaseUnavailable,
    DataError,
    DeliveryFailed,
    FencedError,
    IngestError,
    KafkaRefused,
    KafkaUnavailable,
    NotAnObject,
    NotWireFormat,
    OffsetGapError,
    OffsetOutOfRange,
    PermanentError,
    PrivilegeMissing,
    ReconciliationError,
    RegistryLacksSchemas,
    RegistryRefused,
    RegistryUnavailable,
    RejectedByDatabase,
    ReplicaIdentityNotFull,
    SchemaDrift,
    SchemaMissing,
    SchemaUnreadable,
    SettingsError,
    SourceChanged,
    TooLarge,
    TopicMissing,
    TopicRecreated,
    TransientError,
    TriggerParamsError,
    UnavailableValue,
    Undecodable,
    UnknownSchema,
    UnknownVersion,
    Unorderable,
)
from kafka_ingest.kafka.clients import map_kafka_error

# --------------------------------------------------------------------------- the tree


@pytest.mark.parametrize(("cls", "branch"), [
    # infrastructure: a retry later is the cure
    (KafkaUnavailable, TransientError),
    (DeliveryFailed, TransientError),
    (DatabaseUnavailable, TransientError),
    (CommitOutcomeUnknown, TransientError),  # the retry re-reads the stored offset
    (FencedError, TransientError),  # the retry resumes from where the cursor is now
    # no retry can cure these: fail now and say what to do
    (OffsetGapError, PermanentError),
    (OffsetOutOfRange, PermanentError),
    (KafkaRefused, PermanentError),
    (ReconciliationError, PermanentError),
    (TriggerParamsError, PermanentError),
    (SchemaMissing, PermanentError),
    (PrivilegeMissing, PermanentError),  # a grant is missing: retrying will not grant it
    (TopicMissing, PermanentError),
    # a bad message: dead-lettered, the batch goes on
    (RejectedByDatabase, DataError),
    (UnavailableValue, DataError),
])
def test_each_error_is_on_the_branch_that_decides_its_fate(cls: type, branch: type) -> None:
    assert issubclass(cls, branch)
    others = {TransientError, PermanentError, DataError} - {branch}
    assert not any(issubclass(cls, other) for other in others)


def test_every_error_of_the_package_is_on_exactly_one_branch() -> None:
    ours = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, IngestError) and cls.__module__ == errors.__name__
            and cls not in (IngestError, TransientError, PermanentError, DataError)]
    assert len(ours) >= 18
    for cls in ours:
        branches = [b for b in (TransientError, PermanentError, DataError) if issubclass(cls, b)]
        assert len(branches) == 1, (cls, branches)


def test_every_data_error_has_a_distinct_class_name() -> None:
    names = [c.error_class for c in DATA_ERROR_CLASSES]
    assert names == ["undecodable", "not_an_object", "contract_violation", "unknown_version",
                     "too_large", "not_wire_format", "unknown_schema", "schema_unreadable",
                     "bad_key", "bad_header", "unorderable", "bad_envelope",
                     "unavailable_value", "rejected_by_database"]
    assert DataError.error_class == "data_error"  # the generic class (tombstones) stays apart
    assert DATA_ERROR_CLASSES[0]("why").detail == "why"


def test_the_tree_is_drawn_in_the_module_docstring() -> None:
    doc = errors.__doc__ or ""
    for cls in (TransientError, PermanentError, DataError, FencedError, KafkaRefused,
                OffsetOutOfRange, TriggerParamsError, PrivilegeMissing):
        assert cls.__name__ in doc


def test_errors_carry_fields_and_build_their_message() -> None:
    fenced = FencedError("p", "t", 2, expected=10, found=15)
    assert (fenced.partition, fenced.expected, fenced.found) == (2, 10, 15)
    assert "stored offset is 15, expected 10" in str(fenced)
    assert "[5, 9)" in str(CommitOutcomeUnknown("p", 1, 5, 9))
    failed = DeliveryFailed("dlq", ["a", "b", "c", "d"], 10)
    assert "4 of 10 dead letters were not delivered to 'dlq' (first: a; b; c)" in str(failed)
    gap = OffsetGapError("t", 1, 5, 25)
    assert "offsets [5, 25) were deleted by retention" in str(gap) and "20 messages" in str(gap)


#: One of each error of the tree, with fields: `kafka-ingest run --workers` and Airflow hand
#: errors between processes, and Exception's own pickling calls cls(message), which fails
#: for every __init__ that takes fields (the parent saw a broken process pool instead).
ONE_OF_EACH: list[IngestError] = [
    KafkaUnavailable("metadata", "down"),
    DeliveryFailed("dlq", ["a"], 2),
    DatabaseUnavailable("connect", "refused"),
    CommitOutcomeUnknown("p", 1, 5, 9),
    FencedError("p", "t", 2, expected=10, found=15),
    OffsetGapError("t", 1, 5, 25),
    OffsetOutOfRange("t[0]", "past the end"),
    KafkaRefused("metadata", "SASL authentication failed"),
    DatabaseRefused("authentication", "password authentication failed"),
    SettingsError("set X"),
    ReconciliationError(0, 10, {"inserted": 9}, missing=1),
    TriggerParamsError("end before start"),
    SchemaMissing('relation "ingest_runs" does not exist'),
    PrivilegeMissing("app", "permission denied for table run_plans", on="table run_plans"),
    TopicMissing("t", "source topic"),
    RegistryUnavailable("get schema 3", "ConnectError: refused"),
    RegistryLacksSchemas("t[0] offsets [0, 3)", [3, 4], "http://registry:8081"),
    RegistryRefused("get schema 3", "HTTP 401: unauthorized"),
    ContractMismatch("p", "t-value", ["field 'x' is missing"], versions=2),
    SchemaUnreadable(7, "named references are not supported"),
    SchemaDrift("p", ["p.x is integer, but the contract needs bigint"], ["column y is missing"]),
    SourceChanged("p", "change events of schema 'pg.public.t.Envelope'", ["column 'x' added"]),
    ReplicaIdentityNotFull("p", "topic 'pg.public.t' partition 0"),
    DataError("tombstone"),
    Undecodable("not UTF-8"),
    NotAnObject("an array"),
    ContractViolation("metric_value: finite"),
    UnknownVersion("version 9"),
    TooLarge("300000 bytes"),
    NotWireFormat("no magic byte"),
    UnknownSchema("schema id 99 is not registered"),
    BadKey("the record has no key"),
    BadHeader("header 'trace-id' is not UTF-8"),
    BadEnvelope("op 'x' is not one of Debezium's"),
    UnavailableValue("key 1 at offset 3: the change leaves notes out"),
    RejectedByDatabase("NUL"),
    Unorderable("key 'a' at partition 1: stored from partition 0"),
    TopicRecreated("p", "t", "old-id", "new-id", [0, 2], dlq=True),
]


@pytest.mark.parametrize("err", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_every_error_crosses_a_process_boundary_intact(err: IngestError) -> None:
    back = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes, just made
    assert type(back) is type(err)
    assert (str(back), back.args, vars(back)) == (str(err), err.args, vars(err))


def test_the_pickling_cases_cover_every_error_class() -> None:
    ours = {cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, IngestError) and cls.__module__ == errors.__name__
            and cls not in (IngestError, TransientError, PermanentError)}
    assert ours == {type(e) for e in ONE_OF_EACH}


# --------------------------------------------------------------------------- Kafka


@pytest.mark.parametrize(("code", "expected"), [
    # the broker is down or restarting, a request timed out: retry later
    (KafkaError._TRANSPORT, KafkaUnavailable),
    (KafkaError._ALL_BROKERS_DOWN, KafkaUnavailable),
    (KafkaError._MSG_TIMED_OUT, KafkaUnavailable),
    (KafkaError._TIMED_OUT, KafkaUnavailable),
    (KafkaError.REQUEST_TIMED_OUT, KafkaUnavailable),
    # leadership moved (a broker restarted, a reassignment): retry later
    (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaUnavailable),
    (KafkaError.LEADER_NOT_AVAILABLE, KafkaUnavailable),
    (KafkaError.NOT_ENOUGH_REPLICAS, KafkaUnavailable),
    # metadata not yet propagated after a topic was created
    (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaUnavailable),
    # with auto.offset.reset=error: retention deleted the range, or the topic was recreated
    (KafkaError.OFFSET_OUT_OF_RANGE, OffsetOutOfRange),
    (KafkaError._AUTO_OFFSET_RESET, OffsetOutOfRange),
    # wrong password, wrong mechanism, no ACL, a TLS handshake that fails: fix the settings
    (KafkaError.SASL_AUTHENTICATION_FAILED, KafkaRefused),
    (KafkaError._AUTHENTICATION, KafkaRefused),
    (KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaRefused),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaRefused),
    (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaRefused),
    (KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaRefused),
    (KafkaError._SSL, KafkaRefused),
    (KafkaError._INVALID_ARG, KafkaRefused),  # a librdkafka setting it cannot use
])
def test_named_kafka_errors(code: int, expected: type[IngestError]) -> None:
    err = KafkaError(code)
    mapped = map_kafka_error("read t[0]", err)
    assert type(mapped) is expected
    assert err.str() in str(mapped)
    wrapped = map_kafka_error("read t[0]", KafkaException(err))  # how the client raises them
    assert (type(wrapped), str(wrapped)) == (expected, str(mapped))


def test_a_fatal_error_is_refused_whatever_its_code() -> None:
    # An idempotent producer fenced by the broker: librdkafka says fatal, no retry helps.
    fatal = map_kafka_error("produce", KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    retriable = map_kafka_error("produce", KafkaError(KafkaError._TRANSPORT, "down",
                                                      retriable=True))
    assert type(fatal) is KafkaRefused and "_FATAL [fatal]: fenced" in str(fatal)
    assert type(retriable) is KafkaUnavailable and "_TRANSPORT [retriable]: down" in str(retriable)


def test_anything_else_from_kafka_is_transient() -> None:
    mapped = map_kafka_error("metadata", TimeoutError("no answer"))
    assert type(mapped) is KafkaUnavailable
    assert "TimeoutError('no answer')" in str(mapped)


def test_the_kafka_mapping_never_raises_and_always_decides() -> None:
    # Not the mapping restated: only that no code falls through to a non-decision.
    codes = {v for k, v in vars(KafkaError).items() if isinstance(v, int) and k.isupper()}
    for code in codes:
        mapped = map_kafka_error("op", KafkaError(code))
        assert isinstance(mapped, TransientError | PermanentError), code


# --------------------------------------------------------------------------- psycopg


@pytest.mark.parametrize(("cls", "expected"), [
    (psycopg.OperationalError, DatabaseUnavailable),  # connection refused, lost
    (psycopg.errors.AdminShutdown, DatabaseUnavailable),  # server restarted
    (psycopg.errors.CannotConnectNow, DatabaseUnavailable),  # server starting up
    (psycopg.errors.DiskFull, DatabaseUnavailable),  # out of space: heals when space is back
    (psycopg.errors.TooManyConnections, DatabaseUnavailable),
    (psycopg.errors.LockNotAvailable, DatabaseUnavailable),  # lock_timeout
    (psycopg.errors.QueryCanceled, DatabaseUnavailable),  # statement_timeout
    (psycopg.errors.IdleInTransactionSessionTimeout, DatabaseUnavailable),  # 25P03
    (psycopg.errors.TransactionTimeout, DatabaseUnavailable),  # 25P04
    (psycopg.InterfaceError, DatabaseUnavailable),  # the connection is closed
    (psycopg.DataError, RejectedByDatabase),  # a value Postgres refuses
    (psycopg.errors.NumericValueOutOfRange, RejectedByDatabase),  # out-of-range number
    (psycopg.errors.UntranslatableCharacter, RejectedByDatabase),  # bad text
    (psycopg.IntegrityError, RejectedByDatabase),  # a constraint on the row
    (psycopg.errors.CheckViolation, RejectedByDatabase),  # a CHECK on the row
    (psycopg.errors.UndefinedTable, SchemaMissing),  # migration missing: say what to run
    (psycopg.errors.InsufficientPrivilege, PrivilegeMissing),  # a grant missing: say which
    (psycopg.ProgrammingError, type(None)),  # our SQL is wrong: not data, not transient
    (psycopg.errors.InFailedSqlTransaction, type(None)),  # a bug in our error handling
])
def test_named_psycopg_errors(cls: type[psycopg.Error], expected: type) -> None:
    mapped = map_psycopg_error("upsert", cls("server said no\n"))
    assert type(mapped) is expected
    if isinstance(mapped, DatabaseUnavailable):
        assert mapped.operation == "upsert"
        assert str(mapped) == f"Postgres upsert failed: {cls.__name__}: server said no"
    if isinstance(mapped, RejectedByDatabase):
        assert mapped.detail == f"{cls.__name__}: server said no"  # stripped
    if isinstance(mapped, SchemaMissing):
        assert "kafka-ingest migrate" in str(mapped)


def test_a_missing_table_may_be_a_schema_the_role_may_not_use() -> None:
    # Without USAGE on the schema, Postgres hides its tables: "does not exist", not
    # "permission denied". From the error alone both causes are possible: name both.
    mapped = map_psycopg_error("session", psycopg.errors.UndefinedTable(
        'relation "run_plans" does not exist\nLINE 1: ...'), role="kafka_ingest_app")
    assert str(mapped) == (
        'relation "run_plans" does not exist; create the schema with `kafka-ingest migrate`, '
        "or, if it was migrated, role 'kafka_ingest_app' may not use the schema: the owner "
        "grants it with `kafka-ingest migrate --grant-to kafka_ingest_app`")


def test_the_psycopg_mapping_never_raises() -> None:
    classes = [cls for cls in vars(psycopg.errors).values()
               if inspect.isclass(cls) and issubclass(cls, psycopg.Error)]
    assert len(classes) > 200
    for cls in classes:
        mapped = map_psycopg_error("op", cls("x"))
        assert mapped is None or isinstance(mapped, IngestError), cls


@pytest.mark.parametrize(("message", "on"), [
    # what the planner reads and the slices write: a table's privilege not granted
    ("permission denied for table run_plans", "table run_plans"),
    # USAGE on the schema (a role that may see none of its objects)
    ("permission denied for schema public\nLINE 1: SELECT ...\n", "schema public"),
    # the audit rows' ids
    ("permission denied for sequence ingest_runs_id_seq", "sequence ingest_runs_id_seq"),
    # TEMPORARY on the database, which the staging tables need: worded differently
    ('permission denied to create temporary tables in database "pipelines"',
     "database pipelines"),
    # a form Postgres words otherwise still names the role and the fix, without an object
    ("must be owner of table run_plans", None),
])
def test_a_missing_privilege_names_the_object_the_role_and_the_fix(message: str,
                                                                   on: str | None) -> None:
    mapped = map_psycopg_error("session", psycopg.errors.InsufficientPrivilege(message),
                               role="kafka_ingest_app")
    assert isinstance(mapped, PrivilegeMissing)
    assert (mapped.role, mapped.on) == ("kafka_ingest_app", on)
    first_line = message.splitlines()[0]
    assert str(mapped) == (
        f"Postgres denied role 'kafka_ingest_app' a privilege: {first_line}; the schema's "
        "owner grants the runtime privileges with `kafka-ingest migrate --grant-to "
        "kafka_ingest_app`")


def test_a_missing_privilege_of_an_unknown_role_still_says_what_to_run() -> None:
    mapped = map_psycopg_error("session", psycopg.errors.InsufficientPrivilege(
        "permission denied for table run_plans"))
    assert isinstance(mapped, PrivilegeMissing) and mapped.role is None
    assert "this connection's role" in str(mapped)
    assert "`kafka-ingest migrate --grant-to <role>`" in str(mapped)


@pytest.mark.parametrize(("dsn", "said", "unsaid"), [
    # libpq quotes the text around the mistake, here part of a password: never repeated
    ("host=db password=hunter two", "key=value pairs or a postgresql:// URI", "two"),
    # an unknown keyword (the usual typo) is named: it holds no secret
    ("hots=db dbname=pipelines", 'invalid connection option "hots"', "pipelines"),
])
def test_a_dsn_libpq_cannot_parse_is_a_settings_error(dsn: str, said: str,
                                                      unsaid: str) -> None:
    with pytest.raises(SettingsError) as info:
        Database(dsn)  # at construction: before any connection is tried
    assert said in str(info.value) and unsaid not in str(info.value)


def test_a_session_that_takes_no_writes_is_transient_and_says_how_to_reach_the_primary(
        ) -> None:
    # SQLSTATE 25006: a standby (reached by a DSN that names it, or being promoted right
    # now: the retry finds it writable) or a session made read-only on purpose.
    exc = psycopg.errors.ReadOnlySqlTransaction(
        "cannot execute INSERT in a read-only transaction\n")
    mapped = map_psycopg_error("upsert", exc)
    assert isinstance(mapped, DatabaseUnavailable) and isinstance(mapped, TransientError)
    assert str(mapped).startswith(
        "Postgres upsert failed: ReadOnlySqlTransaction: cannot execute INSERT in a "
        "read-only transaction; the server is a standby, or the session is read-only")
    assert "point the DSN at the primary" in str(mapped)
    assert "target_session_attrs=read-write" in str(mapped)


@pytest.mark.parametrize(("dsn", "said"), [
    # a typo in the port: libpq would fail every connect, retried as if Postgres were down
    ("host=db port=54x2 dbname=p", "port in the Postgres DSN is not a number"),
    ("postgresql://u:pw@db:5432x/p", "port in the Postgres DSN is not a number"),
    ("host=db port=70000 dbname=p", "from 1 to 65535"),
    ("host=db port=0 dbname=p", "from 1 to 65535"),
    # one element of a multi-host list
    ("host=a,b port=5432,x dbname=p", "not a number"),
    # libpq needs one port per host, or one for all
    ("host=a,b port=5432,5433,5434 dbname=p", "names 3 ports for 2 host(s)"),
    ("host=a port=5432,5433 dbname=p", "names 2 ports for 1 host(s)"),
    ("hostaddr=10.0.0.1,10.0.0.2,10.0.0.3 port=1,2 dbname=p", "names 2 ports for 3 host(s)"),
])
def test_a_port_libpq_cannot_use_is_a_settings_error(dsn: str, said: str) -> None:
    with pytest.raises(SettingsError, match="port") as info:
        Database(dsn)  # at construction: before any connection is tried
    assert said in str(info.value)


def test_the_port_error_never_repeats_what_may_be_a_password() -> None:
    # An unescaped "/" in a URI's password: libpq reads "u" as the host and "xq7z" (part
    # of the password) as the port.
    assert conninfo_to_dict("postgresql://u:xq7z/ss@db/p")["port"] == "xq7z"
    with pytest.raises(SettingsError) as info:
        Database("postgresql://u:xq7z/ss@db/p")
    assert "not a number" in str(info.value) and "xq7z" not in str(info.value)


def test_a_port_from_pgport_is_checked_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shell left with `stack env --replica`'s PGPORT and a DSN for one server: libpq
    # takes the DSN's host and the variable's two ports, which it cannot match.
    monkeypatch.setenv("PGPORT", "15432,15434")
    with pytest.raises(SettingsError, match=r"PGPORT names 2 ports for 1 host\(s\)"):
        Database("host=127.0.0.1 dbname=p")
    Database("host=127.0.0.1 port=15432 dbname=p")  # the DSN's port wins


@pytest.mark.parametrize("dsn", [
    "host=db dbname=p",  # no port: libpq's default
    "host=db port=5432 dbname=p",
    "host=a,b port=5432,5433 dbname=p",  # one per host
    "host=a,b port=5432 dbname=p",  # one for all
    "host=a,b,c port=5432,,5434 dbname=p",  # an empty one: the default port
    "postgresql://u:pw@a:5432,b:5433/p",  # the URI's multi-host form
])
def test_ports_libpq_can_use_pass(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPORT", raising=False)
    assert Database(dsn).dsn == dsn


@pytest.mark.parametrize(("dsn", "env", "expected"), [
    # one server: libpq's own default (any) stays
    ("host=db dbname=p", {}, None),
    # several: the one that takes writes, not the first that answers (maybe a standby)
    ("host=a,b port=5432,5433 dbname=p", {}, "read-write"),
    ("hostaddr=10.0.0.1,10.0.0.2 dbname=p", {}, "read-write"),
    ("postgresql://u@a:5432,b:5433/p", {}, "read-write"),
    # the hosts from PGHOST, as libpq takes them when the DSN names none
    ("dbname=p", {"PGHOST": "a,b"}, "read-write"),
    # the DSN, or the variable, says otherwise: it wins
    ("host=a,b dbname=p target_session_attrs=any", {}, None),
    ("host=a,b dbname=p", {"PGTARGETSESSIONATTRS": "prefer-standby"}, None),
])
def test_several_hosts_connect_to_the_primary_unless_told_otherwise(
        dsn: str, env: dict[str, str], expected: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGHOST", "PGHOSTADDR", "PGTARGETSESSIONATTRS", "PGPORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    given = conninfo_to_dict(dsn)
    defaults = connection_defaults(given, connect_timeout=7)
    assert defaults.get("target_session_attrs") == expected
    assert defaults["connect_timeout"] == 7 and defaults["keepalives"] == 1
