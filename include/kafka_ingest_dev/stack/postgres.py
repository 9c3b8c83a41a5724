"""PostgreSQL in the local stack: its server (the primary) and what a standby shares.

Debian's server binaries, a cluster under ``<state>/postgres/data`` on
``127.0.0.1:15432``; role and password ``kafka_ingest``, databases ``kafka_ingest`` (the
pipelines) and ``airflow`` (Airflow's metadata). Durable settings (``fsync`` stays on),
loopback only; trust on the private unix socket, SCRAM on loopback, TLS for the runtime
role on the secure stack. As root, its tools run as the ``postgres`` user.

A node is :class:`PgNode`; which node is the primary is :func:`primary_node` (``stack
failover`` moves it: :mod:`kafka_ingest_dev.stack.standby`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_ingest_dev import tls
from kafka_ingest_dev.procs import (
    PartStatus,
    StackError,
    child_env,
    own_libpq,
    read_or_none,
    require_free,
    tail,
    terminate,
)
from kafka_ingest_dev.service import LocalService

if TYPE_CHECKING:
    from kafka_ingest_dev.stack.settings import Settings

PG_ROLE = "kafka_ingest"
# The plaintext development stack's owner password: loopback only, documented, and the
# same as docker-compose.yml's. The secure stack's runtime role gets a random one.
PG_PASSWORD = "kafka_ingest"  # noqa: S105
PG_DATABASE = "kafka_ingest"
#: The secure stack's runtime role (least privilege); PG_ROLE owns the schema.
PG_APP_ROLE = "kafka_ingest_app"
AIRFLOW_DATABASE = "airflow"
#: The standby's ``application_name`` (what ``synchronous_standby_names`` names) and its
#: replication slot on the primary.
STANDBY_NAME = "kafka_ingest_standby"
TIMEOUT_S = 60


@dataclass(frozen=True)
class PgNode(LocalService):
    """One Postgres server of the stack: its directory (``data``, ``run`` for the unix
    socket, ``postgres.log``) and its loopback port. ``pg_ctl`` starts it; its pid file is
    the server's own ``postmaster.pid``."""

    name: str
    home: Path
    port: int
    stop_timeout_s = TIMEOUT_S

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def socket_dir(self) -> Path:
        return self.home / "run"

    @property
    def logfile(self) -> Path:
        return self.home / "postgres.log"

    @property
    def pidfile(self) -> Path:
        return self.data / "postmaster.pid"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def standby(self) -> bool:
        """A standby (it has ``standby.signal``; promotion removes it)."""
        return (self.data / "standby.signal").is_file()

    @property
    def exists(self) -> bool:
        return (self.data / "PG_VERSION").is_file()

    @property
    def paused_marker(self) -> Path:
        """Present while ``pause_replication`` holds this standby's WAL receiver off."""
        return self.home / "replication-paused"

    def markers(self) -> tuple[str, ...]:
        return (str(self.data),)

    def answers(self) -> bool:
        """Health: the pipelines' role logs in over loopback, as a client would."""
        import psycopg

        try:
            connect(dsn(self, PG_DATABASE)).close()
        except psycopg.Error:
            return False
        return True

    def stop(self, *, mode: str = "fast") -> str:
        """``pg_ctl stop -m mode`` (``fast``: connections are cut; ``immediate``: no
        shutdown checkpoint), then SIGTERM and SIGKILL if it is still there."""
        pid = self.pid()
        if pid is None:
            return f"{self.name}: not running"
        cmd = [str(bindir() / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]
        subprocess.run(as_postgres(cmd), capture_output=True, check=False, env=child_env())
        terminate(pid, self.stop_timeout_s)  # a no-op when pg_ctl already stopped it
        return f"{self.name}: stopped (pid {pid})"


def primary_node(s: Settings) -> PgNode:
    """The node that takes writes: the first unless ``stack failover`` moved it."""
    first, second = s.pg_nodes
    return second if read_or_none(s.primary_marker) == f"{second.name}\n" else first


def other_node(s: Settings, node: PgNode) -> PgNode:
    first, second = s.pg_nodes
    return second if node.name == first.name else first


# --------------------------------------------------------------------------- tools


def bindir() -> Path:
    """The newest Debian PostgreSQL server under /usr/lib/postgresql/<major>/bin."""
    candidates = [
        path.parent
        for path in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")
        if path.parent.parent.name.isdigit()
    ]
    if not candidates:
        raise StackError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: run the "
            "setup step (apt-get install postgresql)"
        )
    return max(candidates, key=lambda path: int(path.parent.name))


def as_postgres(cmd: list[str]) -> list[str]:
    """Postgres refuses to run as root; as root run its tools as the ``postgres`` user."""
    if os.geteuid() != 0:
        return cmd
    # runuser lives in sbin, which a non-login root shell may not have on PATH.
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        raise StackError("runuser not found: install util-linux, or run the stack as non-root")
    return [runuser, "-u", "postgres", "--", *cmd]


def run(cmd: list[str], what: str, timeout_s: float = 600.0) -> None:
    """Run a Postgres tool (as ``postgres`` when root), bounded: a tool still running after
    ``timeout_s`` is killed with its process group (``runuser`` does not pass a kill on)."""
    with subprocess.Popen(as_postgres(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True, env=child_env()) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise StackError(f"{what} did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        detail = out.strip().replace("\n", " | ")
        raise StackError(f"{what} failed: {detail[-300:]}")


def chown_postgres(path: Path, *, recursive: bool = False) -> None:
    if os.geteuid() != 0:
        return
    paths = [path, *path.rglob("*")] if recursive else [path]
    for each in paths:
        shutil.chown(each, "postgres", "postgres")


def _check_traversable(s: Settings) -> None:
    """As root, the ``postgres`` user must reach the data dirs through every parent."""
    if os.geteuid() != 0:
        return
    for parent in s.pg_home.parents:
        if parent.is_relative_to(s.state) and parent.exists():
            parent.chmod(parent.stat().st_mode | 0o111)
            continue
        if not parent.stat().st_mode & 0o001:
            raise StackError(
                f"the postgres OS user cannot enter {parent}: run `chmod o+x {parent}` or "
                "set KAFKA_INGEST_STATE_DIR to a directory it can reach"
            )


# --------------------------------------------------------------------------- configuration


def config(s: Settings, node: PgNode) -> str:
    """Settings for tests: durable (fsync stays on), loopback only, room for workers; a
    standby streams from the primary through its slot (``primary_conninfo`` empty while
    ``pause_replication`` holds it); a primary with a running standby under
    ``--replica --sync`` acknowledges a commit only once the standby applied it (a standby
    not running makes no commit wait forever: ``up`` turns it on once the standby
    streams)."""
    other = other_node(s, node)
    if node.standby:
        conninfo = "" if node.paused_marker.is_file() else (
            f"host={other.socket_dir} port={other.port} user=postgres "
            f"application_name={STANDBY_NAME}")
        replication = (f"primary_conninfo = '{conninfo}'\n"
                       f"primary_slot_name = '{STANDBY_NAME}'\n")
    elif s.replica == "sync" and other.standby and other.pid() is not None:
        replication = (f"synchronous_standby_names = '{STANDBY_NAME}'\n"
                       "synchronous_commit = remote_apply\n")
    else:
        replication = ""
    # The header is compared with the file on every start: a change reloads the server.
    return (
        "# Written by kafka-ingest stack up on every start; edit stack.py instead.\n"
        "listen_addresses = '127.0.0.1'\n"
        f"port = {node.port}\n"
        f"unix_socket_directories = '{node.socket_dir}'\n"
        "max_connections = 200\n"
        "shared_buffers = 128MB\n"
        "fsync = on\n"
        # Debezium's Postgres source connector (the mirror's tests) decodes the WAL.
        "wal_level = logical\n"
        "password_encryption = 'scram-sha-256'\n"
        "log_min_messages = warning\n"
        "log_line_prefix = '%m [%p] %q%u@%d '\n"
        + replication
        + ("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
           "ssl_min_protocol_version = 'TLSv1.2'\n" if s.secure else "")
    )


def _hba(s: Settings) -> str:
    """Trust on the private unix socket, SCRAM on loopback; on the secure stack the
    pipelines' runtime role may connect only over TLS (``hostssl``), never in plain text."""
    secure = (
        f"hostssl all {PG_APP_ROLE} 127.0.0.1/32 scram-sha-256\n"
        f"host    all {PG_APP_ROLE} 127.0.0.1/32 reject\n" if s.secure else "")
    return (
        "# Written by kafka-ingest stack up on every start; edit stack.py instead.\n"
        "local   all         all                 trust\n"
        "local   replication all                 trust\n"
        f"{secure}"
        "host    all         all  127.0.0.1/32   scram-sha-256\n"
        "host    all         all  ::1/128        scram-sha-256\n"
    )


def _configure(s: Settings, node: PgNode) -> bool:
    """Write the settings, pg_hba.conf and (secure) the server's certificate into the data
    directory; return whether anything changed."""
    wanted = {"kafka_ingest.conf": config(s, node), "pg_hba.conf": _hba(s)}
    if s.secure:
        files = tls.TlsFiles(s.tls_dir)
        wanted["server.crt"] = files.server_cert.read_text()
        wanted["server.key"] = files.server_key.read_text()
    changed = False
    for name, text in wanted.items():
        path = node.data / name
        if read_or_none(path) == text:
            continue
        path.write_text(text)
        path.chmod(0o600)
        chown_postgres(path)
        changed = True
    return changed


def reconfigure(s: Settings, node: PgNode) -> None:
    """Rewrite a running node's settings and reload them if they changed."""
    if _configure(s, node) and node.pid() is not None:
        run([str(bindir() / "pg_ctl"), "-D", str(node.data), "reload"], "pg_ctl reload")


# --------------------------------------------------------------------------- start


def _init(node: PgNode, bindir_: Path) -> None:
    """initdb once: trust on the private unix socket, SCRAM on 127.0.0.1."""
    if node.exists:
        return
    node.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    chown_postgres(node.home, recursive=True)
    run(
        [
            str(bindir_ / "initdb"), "-D", str(node.data), "--username=postgres",
            "--encoding=UTF8", "--no-locale", "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ],
        "initdb",
    )  # fmt: skip
    with (node.data / "postgresql.conf").open("a") as conf:
        conf.write("\ninclude = 'kafka_ingest.conf'\n")


def start(s: Settings, node: PgNode | None = None) -> tuple[int, bool]:
    """Start the node (the primary unless told) unless it runs; pg_ctl -w polls until it
    accepts connections (a standby: until it is consistent)."""
    node = node or primary_node(s)
    pid = node.pid()
    if pid is not None:
        reconfigure(s, node)  # ssl, pg_hba.conf, replication: all take effect on a reload
        return pid, False
    tools = bindir()
    first = node.home == s.pg_home
    require_free(node.port, f"PostgreSQL ({node.name})",
                 "KAFKA_INGEST_PG_PORT" if first else "KAFKA_INGEST_PG_STANDBY_PORT")
    node.home.mkdir(parents=True, exist_ok=True)
    _check_traversable(s)
    if first:
        _init(node, tools)
    elif not node.exists:
        raise StackError(f"{node.name} has no data directory: `kafka-ingest stack up "
                         "--replica` makes it from the primary")
    node.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    chown_postgres(node.socket_dir)
    _configure(s, node)
    node.logfile.touch()
    chown_postgres(node.logfile)
    cmd = [
        str(tools / "pg_ctl"), "-D", str(node.data), "-l", str(node.logfile), "-w",
        "-t", str(TIMEOUT_S), "start",
    ]  # fmt: skip
    done = subprocess.run(
        as_postgres(cmd), capture_output=True, text=True, check=False, start_new_session=True,
        env=child_env(),
    )
    if done.returncode != 0:
        raise StackError(f"PostgreSQL ({node.name}) did not start: {tail(node.logfile, 3)}")
    pid = node.pid()
    if pid is None:
        raise StackError(f"PostgreSQL started but left no postmaster.pid in {node.data}")
    return pid, True


def admin(node: PgNode, dbname: str = "postgres") -> Any:
    """A superuser connection over the node's private unix socket (autocommit)."""
    import psycopg

    return psycopg.connect(autocommit=True, **own_libpq(
        host=str(node.socket_dir), port=node.port, user="postgres", dbname=dbname,
        connect_timeout=10))


def bootstrap(s: Settings) -> None:
    """Create the role and both databases if missing (cheap, so done on every ``up``)."""
    from psycopg import sql

    with admin(primary_node(s)) as conn:
        role = conn.execute("SELECT rolcreatedb FROM pg_roles WHERE rolname = %s", (PG_ROLE,))
        found_role = role.fetchone()
        if found_role is None:
            # CREATEDB: the test fixtures make a fresh database per test as this role.
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                    sql.Identifier(PG_ROLE), sql.Literal(PG_PASSWORD)
                )
            )
        elif not found_role[0]:
            conn.execute(sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(PG_ROLE)))
        # DROP DATABASE ... WITH (FORCE) of a per-test database must also end the autovacuum
        # worker that a fresh, just-filled database attracts; without this it fails with
        # "must be a member of the role whose process is being terminated".
        conn.execute(sql.SQL("GRANT pg_signal_backend TO {}").format(sql.Identifier(PG_ROLE)))
        if s.secure:
            _ensure_app_role(conn, tls.credentials(tls.TlsFiles(s.tls_dir))["pg_app_password"])
        for database in (PG_DATABASE, AIRFLOW_DATABASE):
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if found.fetchone() is None:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(database), sql.Identifier(PG_ROLE)
                    )
                )


def _ensure_app_role(conn: Any, password: str) -> None:
    """The pipelines' runtime role: it logs in (over TLS only, see pg_hba.conf) and gets
    only the DML its tables need, granted by ``kafka-ingest migrate`` under ``stack env
    --secure`` (which names it in ``KAFKA_INGEST_PG_GRANT_TO``)."""
    from psycopg import sql

    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PG_APP_ROLE,))
    verb = "ALTER" if exists.fetchone() else "CREATE"
    conn.execute(sql.SQL(verb + " ROLE {} LOGIN NOCREATEDB NOCREATEROLE PASSWORD {}").format(
        sql.Identifier(PG_APP_ROLE), sql.Literal(password)))


def drop_standby_slot(node: PgNode, *, inactive_only: bool = False) -> None:
    """Drop the standby's replication slot on ``node`` (one left by a standby that is
    gone would keep its WAL forever)."""
    with admin(node) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     " WHERE slot_name = %s AND NOT (active AND %s)",
                     (STANDBY_NAME, inactive_only))


# --------------------------------------------------------------------------- clients, health


def dsn(node: PgNode, database: str) -> str:
    """The owner role's URL of ``database`` on ``node``."""
    return f"postgresql://{PG_ROLE}:{PG_PASSWORD}@127.0.0.1:{node.port}/{database}"


def connect(url: str) -> Any:
    """A short health probe's connection to ``url``, whatever PG* variables are set here."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    return psycopg.connect(**own_libpq(**conninfo_to_dict(url), connect_timeout=3))


def replication(primary: PgNode) -> tuple[str, int] | None:
    """(state, bytes the standby has yet to apply) as the primary sees its standby."""
    with admin(primary) as conn:
        row = conn.execute(
            "SELECT state, pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint"
            " FROM pg_stat_replication WHERE application_name = %s", (STANDBY_NAME,)
        ).fetchone()
    return None if row is None else (str(row[0]), int(row[1] or 0))


def status(s: Settings) -> list[PartStatus]:
    """The primary's line, and (``--replica``) the standby's: streaming, how far behind."""
    primary = primary_node(s)
    part = primary.status()
    if s.replica is None:
        return [PartStatus("postgres", part.address, part.up, part.pid, part.detail)]
    standby = other_node(s, primary)
    spid = standby.pid()
    seen = None
    if part.up:
        with contextlib.suppress(Exception):
            seen = replication(primary)
    streaming = spid is not None and seen is not None and seen[0] == "streaming"
    return [
        PartStatus(primary.name, part.address, part.up, part.pid,
                   f"primary{', ' + part.detail if part.detail else ''}"),
        PartStatus(standby.name, standby.address, streaming, spid,
                   f"{s.replica} standby, " + ("not running" if spid is None else
                                               "not streaming" if seen is None else
                                               f"{seen[0]}, {seen[1]} bytes behind")),
    ]


def params(s: Settings, *, secure: bool, owner: bool = False,
           faults: bool = False, replica: bool = False) -> dict[str, Any]:
    """libpq parameters: the owner role in plain text, or (secure) TLS verified against the
    stack's CA, as the runtime role unless ``owner``; ``faults``: through the proxy;
    ``replica``: both nodes, the one that takes writes chosen at each connect (libpq's
    multi-host string with ``target_session_attrs=read-write``); else the primary."""
    found: dict[str, Any] = {"host": "127.0.0.1", "port": primary_node(s).port,
                             "dbname": PG_DATABASE, "user": PG_ROLE, "password": PG_PASSWORD}
    if faults:
        found["port"] = s.pg_proxy_port
    if replica:
        found.update(host=",".join("127.0.0.1" for _ in s.pg_nodes),
                     port=",".join(str(node.port) for node in s.pg_nodes),
                     target_session_attrs="read-write")
    if secure:
        files = tls.TlsFiles(s.tls_dir)
        if not owner:
            found.update(user=PG_APP_ROLE,
                         password=tls.credentials(files)["pg_app_password"])
        found.update(sslmode="verify-full", sslrootcert=str(files.ca_cert))
    return found
