"""``Spark Structured Streaming``: a Kafka source read with ``trigger(availableNow=True)``,
``foreachBatch`` parsing with ``from_json`` and the contract's rules as Spark SQL, a JDBC
write to a staging table per batch, then ``INSERT ... SELECT DISTINCT ON ... ON CONFLICT
DO NOTHING`` into the target; in a fresh JVM (the time includes starting the session) and
in a warm session (a first query on a throwaway topic, then the measured one). pyspark is
a benchmark extra (``spark/requirements.txt``), pip-installed on first use; the Kafka
connector and the JDBC driver are fetched once by Maven (``spark/pom.xml``). No DLQ: what
the contract rejects is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    BASE_PIPELINE,
    EPOCH_END,
    RESULTS,
    Bench,
    Measure,
    as_measure,
    check_rows,
    collect,
    count_rows,
    cpu_spent,
    make_table,
    proc_cpu_s,
    proc_rss_mb,
    range_ends,
    rss_mb,
    server_cpu,
    start_child,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from peers.common import (
    COLUMNS,
    PeerData,
    fetch_once,
    produce_topic,
    run_mvn,
    sink_timeout,
    size_limit,
    warm_count,
)

SPARK_DIR = Path(__file__).resolve().parents[1] / "spark"
SPARK_POM = SPARK_DIR / "pom.xml"
SPARK_REQUIREMENTS = SPARK_DIR / "requirements.txt"
KEYS = {"spark_fresh", "spark_warm"}


# --------------------------------------------------------------------------- the extra, the jars


def pinned(requirements: Path) -> dict[str, str]:
    """The ``name==version`` lines of a requirements file (comments and blank lines skipped)."""
    pins: dict[str, str] = {}
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip():
            raise ValueError(f"{requirements}: {raw!r} is not pinned (name==version)")
        pins[name.strip().lower()] = version.strip()
    return pins


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_pyspark() -> Path:
    """The Spark peer's benchmark extra (``spark/requirements.txt``: pyspark and py4j, pinned)
    in this interpreter's environment (the project's ``.venv``), pip-installed on first use
    or when the pins change; returns pyspark's ``jars/`` directory."""
    pins = pinned(SPARK_REQUIREMENTS)
    if any(_installed(name) != version for name, version in pins.items()):
        cmd = [sys.executable, "-m", "pip", "install", "-q", "-r", str(SPARK_REQUIREMENTS)]
        print(f"the Spark peer needs {', '.join(f'{n}=={v}' for n, v in pins.items())} "
              f"(a benchmark extra, not a runtime dependency); installing: {' '.join(cmd)}",
              flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"pip could not install {SPARK_REQUIREMENTS}: {tail}")
        importlib.invalidate_caches()
        print(f"installed the Spark peer's extra in {time.perf_counter() - t0:.0f}s", flush=True)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"pyspark is not importable by {sys.executable}")
    return Path(spec.origin).parent / "jars"


def spark_cache() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/spark-<sha256 of spark/pom.xml and
    spark/requirements.txt, 12 hex>``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(SPARK_POM.read_bytes() + SPARK_REQUIREMENTS.read_bytes())
    return Path(xdg) / "kafka-ingest" / f"spark-{digest.hexdigest()[:12]}"


def shipped_by_pyspark(artifact: str, pyspark_jars: Iterable[str]) -> bool:
    """Whether pyspark's ``jars/`` has ``artifact`` (any version): ``slf4j-api`` is in
    ``slf4j-api-2.0.17.jar``, ``commons-pool2`` is not in ``commons-pool-1.5.4.jar``."""
    pattern = re.compile(re.escape(artifact) + r"-\d[^/]*\.jar")
    return any(pattern.fullmatch(name) for name in pyspark_jars)


def fetch_spark_jars(pyspark_jars: Path) -> tuple[str, ...]:
    """The jars the Spark peer adds to pyspark's (the Kafka source, its Kafka client, the
    JDBC driver) in ``<cache>/jars``, fetched by Maven once: ``spark/pom.xml``'s runtime
    dependencies less what pyspark ships (its Hadoop client, Scala, slf4j, compression
    codecs). The marker file lists them."""

    def fetch(mvn: str, cache: Path) -> str:
        every, jars = cache / "all", cache / "jars"
        for d in (every, jars):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        # stripVersion: <artifactId>.jar, so that pyspark's copy is recognised by name
        run_mvn([mvn, "-q", "-B", "-f", str(SPARK_POM), "dependency:copy-dependencies",
                 f"-DoutputDirectory={every}", "-Dmdep.includeScope=runtime",
                 "-Dmdep.stripVersion=true"], "the Spark peer's jars")
        theirs = [j.name for j in pyspark_jars.glob("*.jar")]
        kept = sorted(j.name for j in every.glob("*.jar")
                      if not shipped_by_pyspark(j.stem, theirs))
        for name in kept:
            (every / name).rename(jars / name)
        shutil.rmtree(every, ignore_errors=True)
        print(f"the Spark peer's jars: {', '.join(kept)} (the rest of spark/pom.xml's "
              "dependencies pyspark ships)", flush=True)
        return "\n".join(kept) + "\n"

    cache = spark_cache()
    return tuple(str(cache / "jars" / n) for n in fetch_once(cache, "Spark", fetch).split())


# --------------------------------------------------------------------------- the job


#: Offsets per micro-batch (the Kafka source's ``maxOffsetsPerTrigger``). availableNow reads
#: up to the end offsets seen when the query starts, in batches of at most this many. A
#: batch has a fixed cost, about 1 s here whatever its size (planning the batch's query,
#: the JDBC writer's connections, the checkpoint's offset and commit files, the staging
#: table, the merge): 20,061 messages took 2.5-3.3 s in one batch, 5.9-8.7 s in five (four
#: of 5,000). So batches are large; what bounds them is that a batch is what runs again after a
#: failure and what Postgres sorts in one statement (100,000 rows of ~150 bytes). Memory
#: does not: the tasks stream a batch's records, never hold it. The 200k-event sample is 3
#: batches (100,000, 100,000, 421), the smoke's 3,000 one.
SPARK_MAX_OFFSETS = 100_000


#: Rows per JDBC ``executeBatch`` (Spark's ``batchsize``; its default is 1,000, which
#: measured the same within the noise here: pgjdbc's reWriteBatchedInserts sends either as
#: INSERTs of up to 128 rows; 10,000 is fewer round trips per task).
SPARK_JDBC_BATCH = 10_000


#: metric_event v2's fields as Spark types (``from_json``'s explicit schema), and the column
#: where Jackson leaves a record it could not read whole.
SPARK_SCHEMA = ("event_id STRING, device_id STRING, `timestamp` DOUBLE, metric_value DOUBLE, "
                "status STRING, version INT, unit STRING, _corrupt_record STRING")


#: ``from_json``'s options (Spark's JSON defaults are lenient where the contract is not).
SPARK_JSON_OPTIONS = {
    # PERMISSIVE (the default, stated): a record Jackson cannot read, or a value of the
    # wrong type for its field ("12" for a double, 2.0 for an int, a number too large for an
    # int), is kept whole in this column instead of being read in part; it is then dropped.
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": "_corrupt_record",
    # NaN and Infinity literals: not JSON, and the contract refuses them (Spark accepts them
    # by default).
    "allowNonNumericNumbers": "false",
    # 'single-quoted' names and strings: not JSON (Spark accepts them by default).
    "allowSingleQuotes": "false",
}


def _text_ok(col: str, limit: int) -> str:
    """The contract's ``short_text``: 1 to ``limit`` characters, no NUL."""
    return f"char_length({col}) BETWEEN 1 AND {limit} AND NOT contains({col}, chr(0))"


def spark_rules(max_bytes: int) -> list[str]:
    """metric_event v2 (strict: no NaN or infinity, bounded texts without NUL, the version
    1-2, the timestamp an epoch in range) as Spark SQL over the Kafka record (``value``, its
    text ``json``) and the parsed fields; a row is loaded when every rule holds. The rules on
    ``value`` and ``json`` alone are applied before the parse."""
    absent = "{0} IS NULL AND NOT array_contains(json_object_keys(json), '{0}')"
    return [
        # a value (not a tombstone), within the pipeline's size limit (as the project's and
        # the other peers'), and UTF-8
        "value IS NOT NULL", f"octet_length(value) <= {max_bytes}", "is_valid_utf8(json)",
        # a JSON object that Jackson read whole, each field of its declared type
        "_corrupt_record IS NULL",
        _text_ok("event_id", 128), _text_ok("device_id", 128),
        # absent: the default ("OK", version 1); an explicit null is refused, as pydantic
        # does (Spark reads it as absent). The keys are only looked up when the field is null.
        f"({absent.format('status')} OR {_text_ok('status', 32)})",
        f"({absent.format('version')} OR version BETWEEN 1 AND 2)",
        f"(unit IS NULL OR {_text_ok('unit', 32)})",  # optional, null allowed
        # false for NaN too (Spark orders NaN above every number) and for null
        f"`timestamp` >= 0 AND `timestamp` < {EPOCH_END}",
        "metric_value IS NOT NULL AND NOT isnan(metric_value)"
        " AND abs(metric_value) != double('Infinity')",  # a 400-digit number reads as inf
    ]


#: What the foreachBatch writes to the staging table: the event's fields and the record's
#: provenance; ``timestamp`` (epoch seconds) and the Kafka timestamp (epoch ms) travel as
#: numbers and Postgres converts them, as the project does (no time zone in the job).
SPARK_STAGED: tuple[str, ...] = (
    "event_id", "device_id", "`timestamp`", "metric_value",
    "coalesce(status, 'OK') AS status", "unit", "topic AS source_topic",
    "`partition` AS source_partition", "`offset` AS source_offset", "key AS kafka_key",
    "IF(unix_millis(kafka_ts) >= 0, unix_millis(kafka_ts), NULL) AS kafka_timestamp_ms",
)


#: The staging table's columns (``COLUMNS`` with the two timestamps as numbers), and how
#: each becomes the target's column.
STAGE_COLUMNS: tuple[tuple[str, str, str], ...] = tuple(
    ("timestamp", "float8", 'to_timestamp("timestamp")') if name == "timestamp" else
    ("kafka_timestamp_ms", "int8", "to_timestamp(kafka_timestamp_ms / 1000.0)")
    if name == "kafka_timestamp" else (name, pg, f'"{name}"')
    for name, pg in COLUMNS)


def stage_ddl(stage: str) -> sql.Composed:
    """An UNLOGGED staging table (no WAL: it lives for one batch) for one batch's rows."""
    columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(pg))
                                 for n, pg, _ in STAGE_COLUMNS)
    return sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(sql.Identifier(stage), columns)


def merge_sql(table: str, stage: str) -> sql.Composed:
    """The batch's rows into the target: one row per event id (the first by partition and
    offset), and nothing for an id already there (a duplicate from an earlier batch, or a
    batch run again)."""
    return sql.SQL(
        "INSERT INTO {} ({}) SELECT DISTINCT ON (event_id) {} FROM {}"
        " ORDER BY event_id, source_partition, source_offset ON CONFLICT (event_id) DO NOTHING"
    ).format(sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(n) for n, _ in COLUMNS),
             sql.SQL(", ").join(sql.SQL(expr) for _, _, expr in STAGE_COLUMNS),
             sql.Identifier(stage))


def spark_conf(jars: Iterable[str], work: Path) -> dict[str, str]:
    """The session's settings for this job, as a careful Spark user sets them."""
    return {
        # Spark in one JVM on the same two cores the other peers have (local mode: the
        # driver runs the tasks; there is no cluster to start or to ship data to).
        "spark.master": "local[2]",
        "spark.app.name": "kafka-ingest-bench",
        # The Kafka source, its client and the JDBC driver, fetched once by Maven: nothing
        # resolved (Ivy) or fetched at start.
        "spark.jars": ",".join(jars),
        # The default heap (1g), stated because it must be set before the JVM starts: a
        # batch is streamed through the tasks row by row, never held whole.
        "spark.driver.memory": "1g",
        # No web UI and no console progress bar: nobody looks at them.
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # The job has no shuffle; should one appear, 2 partitions for 2 cores, not 200.
        "spark.sql.shuffle.partitions": "2",
        # The driver's RPC and block manager on the loopback interface only.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # Scratch space and the (unused) warehouse in the run's temp dir, not the repo.
        "spark.local.dir": str(work / "local"),
        "spark.sql.warehouse.dir": str(work / "warehouse"),
        # Adaptive query execution is off in streaming queries anyway (said once, it is not
        # logged as a warning at each start).
        "spark.sql.adaptive.enabled": "false",
        # No instant is turned into wall-clock time in the job; UTC all the same.
        "spark.sql.session.timeZone": "UTC",
        # pyspark's console level (WARN), to a file (spark/log4j2.properties).
        "spark.driver.extraJavaOptions":
            f"-Dlog4j2.configurationFile=file:{SPARK_DIR / 'log4j2.properties'}"
            f" -Dkafka_ingest.spark.log={work / 'spark.log'}",
    }


def kafka_source_options(bootstrap: str, topic: str, group_prefix: str) -> dict[str, str]:
    """``readStream.format("kafka")``'s options."""
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        # The whole topic from its first record (the checkpoint is new: no offsets yet).
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": str(SPARK_MAX_OFFSETS),
        # At least two tasks per batch, so that both cores parse and write even when the
        # topic has one partition (Spark splits the partition's offset range; on this
        # 2-core box, shared with Kafka and Postgres: 2.5-3.3 s against 2.6-3.9 s without,
        # 20,061 messages on one partition, within the noise).
        "minPartitions": "2",
        # failOnDataLoss (default true): offsets gone from the topic fail the query rather
        # than being skipped.
        "failOnDataLoss": "true",
        # The consumers' group ids carry the run's tag (the benchmark deletes its groups).
        "groupIdPrefix": group_prefix,
    }


def jdbc_options(dsn: str, table: str) -> dict[str, str]:
    """The JDBC writer's options for one batch's staging table."""
    pg = conninfo_to_dict(dsn)
    opts = {
        # reWriteBatchedInserts: pgjdbc sends each JDBC batch as multi-row INSERTs (as the
        # Connect sink's URL does)
        "url": f"jdbc:postgresql://{pg.get('host', '127.0.0.1')}:{pg.get('port', 5432)}/"
               f"{pg['dbname']}?reWriteBatchedInserts=true",
        "driver": "org.postgresql.Driver",
        "dbtable": table,
        "batchsize": str(SPARK_JDBC_BATCH),
        # At most one connection per core (Spark coalesces a batch with more partitions).
        "numPartitions": "2",
    }
    for key in ("user", "password"):
        if pg.get(key):
            opts[key] = str(pg[key])
    return opts


@dataclass(frozen=True)
class SparkJob:
    """One availableNow query: what it reads and where it loads it (picklable)."""

    bootstrap: str
    topic: str
    dsn: str
    table: str
    max_bytes: int
    group_prefix: str
    timeout_s: float


def valid_rows(batch: Any, max_bytes: int) -> Any:
    """A micro-batch's Kafka records -> the valid events' staging rows (Spark SQL only).

    The parse is ``inline(array(from_json(...)))``, a generator: with a plain
    ``select(from_json(...))`` Spark's optimizer pushes the filter below the projection and
    substitutes ``from_json`` into each reference, so every record is parsed twice or more
    (``explain()`` shows it; ``avoidDoubleFilterEval`` only covers UDFs); a filter on a
    generator's output stays above it."""
    from pyspark.sql import functions as F

    parsed = F.inline(F.array(F.from_json(F.col("json"), SPARK_SCHEMA, SPARK_JSON_OPTIONS)))
    return (batch.selectExpr("topic", "`partition`", "`offset`", "key", "timestamp AS kafka_ts",
                             "value", "CAST(value AS STRING) AS json")
            .select("*", parsed)
            .where(" AND ".join(f"({rule})" for rule in spark_rules(max_bytes)))
            .selectExpr(*SPARK_STAGED))


class _SparkBatchLoader:
    """``foreachBatch``: the batch's valid rows into a staging table of its own (JDBC
    write), then :func:`merge_sql` and the staging table dropped, in one transaction. A batch
    that runs again (after a failure, from the checkpoint) starts from a new staging table
    and loads nothing twice."""

    def __init__(self, job: SparkJob) -> None:
        self.job = job
        self.conn = psycopg.connect(job.dsn, autocommit=True)
        self.batches = self.inserted = 0
        self.write_s = self.merge_s = 0.0

    def __call__(self, batch: Any, batch_id: int) -> None:
        stage = f"{self.job.table}_stage_{batch_id}"
        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(stage)))
        self.conn.execute(stage_ddl(stage))
        t0 = time.perf_counter()
        (valid_rows(batch, self.job.max_bytes).write.format("jdbc")
         .options(**jdbc_options(self.job.dsn, stage)).mode("append").save())
        t1 = time.perf_counter()
        with self.conn.transaction():
            inserted = self.conn.execute(merge_sql(self.job.table, stage)).rowcount
            self.conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(stage)))
        self.write_s += t1 - t0
        self.merge_s += time.perf_counter() - t1
        self.batches += 1
        self.inserted += inserted

    def close(self) -> None:
        self.conn.close()


def _progress(query: Any, topic: str) -> dict[str, Any]:
    """Messages read and the end offsets reached, from the query's progress reports."""
    batches = {p.batchId: p for p in query.recentProgress}
    if sorted(batches) != list(range(len(batches))):
        raise RuntimeError(f"progress of batches {sorted(batches)}: some are missing "
                           "(spark.sql.streaming.numRecentProgressUpdates)")
    last = batches[max(batches)] if batches else None
    ends = json.loads(last.sources[0].endOffset)[topic] if last else {}
    return {"events": sum(p.numInputRows for p in batches.values()),
            "end_offsets": {int(k): int(v) for k, v in ends.items()},
            "batch_s": [round(p.batchDuration / 1000, 2) for _, p in sorted(batches.items())]}


def run_spark_query(spark: Any, job: SparkJob, checkpoint: Path) -> dict[str, Any]:
    """``job``'s query, ``trigger(availableNow=True)``, until it ends; what it did."""
    loader = _SparkBatchLoader(job)
    stream = (spark.readStream.format("kafka")
              .options(**kafka_source_options(job.bootstrap, job.topic, job.group_prefix))
              .load())
    query = (stream.writeStream.foreachBatch(loader).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).queryName(job.table).start())
    try:
        if not query.awaitTermination(job.timeout_s):  # raises if the query failed
            query.stop()
            raise RuntimeError(f"the query on {job.topic} is not done after {job.timeout_s}s")
    finally:
        loader.close()
    return {**_progress(query, job.topic), "batches": loader.batches, "inserted": loader.inserted,
            "jdbc_write_s": round(loader.write_s, 2), "merge_s": round(loader.merge_s, 2)}


def _jvm_cpu_s(pid: int) -> float:
    """utime + stime of the JVM (every thread), and of what it waited for (the launcher
    ``spark-submit`` ran in that process before it became the JVM)."""
    cpu = proc_cpu_s(pid, children=True)
    if cpu is None:
        raise RuntimeError(f"cannot read /proc/{pid}/stat")
    return cpu


@contextlib.contextmanager
def spark_session(jars: tuple[str, ...], log_name: str) -> Iterator[tuple[Any, Path]]:
    """A Spark session with :func:`spark_conf` (its JVM started by pyspark) and its work dir
    (scratch space, checkpoints, log), removed at the end, the log copied to
    ``results/<log_name>.log``."""
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the JVM's own address: loopback only
    spark: Any = None
    try:
        builder: Any = SparkSession.builder
        spark = builder.config(map=spark_conf(jars, work)).getOrCreate()
        yield spark, work
    finally:
        if spark is not None:
            spark.stop()
        with contextlib.suppress(OSError):
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "spark.log", RESULTS.parent / f"{log_name}.log")
        shutil.rmtree(work, ignore_errors=True)


def child_spark(jars: tuple[str, ...], job: SparkJob, warmup: SparkJob | None,
                log_name: str) -> dict[str, Any]:
    """A Spark session (a JVM of its own, started here), ``warmup``'s query if any, then
    ``job``'s. Timed from creating the session (fresh) or from starting the measured query
    (warm) to its end; CPU is the JVM's (``/proc``) and this driver's, RSS the JVM's."""
    start_rss, jvm0 = 0.0, 0.0
    t0, c0, servers = time.perf_counter(), time.process_time(), server_cpu()
    with spark_session(jars, log_name) as (spark, work):
        jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        detail: dict[str, Any] = {
            "session_start_s": round(time.perf_counter() - t0, 2), "spark": spark.version,
            "java": str(spark._jvm.java.lang.System.getProperty("java.version")),
            "max_offsets_per_trigger": SPARK_MAX_OFFSETS}
        if warmup is not None:
            detail["warmup"] = run_spark_query(spark, warmup, work / "checkpoint-warmup")
            start_rss, jvm0 = proc_rss_mb(jvm, "VmRSS") or 0.0, _jvm_cpu_s(jvm)
            t0, c0, servers = time.perf_counter(), time.process_time(), server_cpu()
        detail.update(run_spark_query(spark, job, work / "checkpoint"))
        secs, py_cpu = time.perf_counter() - t0, time.process_time() - c0
        jvm_cpu, spent, peak = _jvm_cpu_s(jvm) - jvm0, cpu_spent(servers), proc_rss_mb(jvm) or 0.0
    detail.update(jvm_cpu_s=round(jvm_cpu, 2), driver_cpu_s=round(py_cpu, 2),
                  driver_rss_mb=round(rss_mb(), 1))
    return {"events": detail.pop("events"), "seconds": secs, "cpu_s": jvm_cpu + py_cpu,
            "start_rss_mb": start_rss, "peak_rss_mb": peak, "server_cpu_s": spent,
            "detail": detail}


# --------------------------------------------------------------------------- the runs


def prepare(b: Bench, data: PeerData) -> None:
    """pyspark (installed on first use), the jars (fetched once), and a throwaway topic of
    other events (same generator, another tag; plain JSON) for warming the session."""
    data.spark_jars = fetch_spark_jars(ensure_pyspark())
    topic = f"bench-{b.tag}-spark-warmup"
    t0 = time.perf_counter()
    made = produce_topic(b.clients, (BASE_PIPELINE, b.base_body), topic,
                         count=warm_count(b), partitions=b.args.partitions,
                         tag=f"{b.tag}s", value_of=lambda sample: sample.value)
    print(f"produced {made['produced']:,} messages to {topic} (Spark's warm-up) in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    data.spark_warm_topic, data.spark_warm_produced = topic, made["produced"]
    data.spark_warm_rows = made["expect"].get("row", 0)


def _spark_job(b: Bench, topic: str, table: str) -> SparkJob:
    make_table(b.dsn, table)
    return SparkJob(b.clients.config["bootstrap.servers"], topic, b.dsn, table, size_limit(b),
                    f"bench-{b.tag}-spark", sink_timeout(b))


def _check_spark(b: Bench, raw: dict[str, Any], table: str) -> None:
    """Every message read, the query at the end of the topic, the valid events once in the
    table and nothing else."""
    got, detail = raw["events"], raw["detail"]
    if got != b.produced or detail["end_offsets"] != range_ends(b.target):
        raise RuntimeError(f"Spark read {got} of {b.produced} messages, up to "
                           f"{detail['end_offsets']}; expected {range_ends(b.target)}")
    detail["rows"] = check_rows(b, table, b.expect.get("row", 0))
    if detail["inserted"] != detail["rows"]:
        raise RuntimeError(f"{table}: the batches inserted {detail['inserted']} rows; the "
                           f"table has {detail['rows']}")


SPARK_LABEL = "Spark Structured Streaming (foreachBatch: from_json, JDBC staging, INSERT)"


def measure_spark_fresh(b: Bench, rep: int) -> Measure:
    """A new Python process starts a Spark session (its JVM) and runs the query; timed from
    creating the session."""
    table = f"bench_spark_fresh_{rep}"
    job = _spark_job(b, b.source, table)
    raw = collect(*start_child(child_spark, b.peers.spark_jars, job, None,
                                     "spark-fresh"))
    _check_spark(b, raw, table)
    return as_measure(f"{SPARK_LABEL}, fresh JVM", raw)


def measure_spark_warm(b: Bench, rep: int) -> Measure:
    """One session: a first query on the throwaway topic (JIT, class loading, the Kafka and
    JDBC clients warm), then the measured one, timed from its start."""
    p: PeerData = b.peers
    warm_table, table = f"bench_spark_warmup_{rep}", f"bench_spark_warm_{rep}"
    warmup = _spark_job(b, p.spark_warm_topic, warm_table)
    job = _spark_job(b, b.source, table)
    raw = collect(*start_child(child_spark, p.spark_jars, job, warmup, "spark-warm"))
    warm = raw["detail"]["warmup"]
    stored = count_rows(b.dsn, warm_table)
    if warm["events"] != p.spark_warm_produced or stored != p.spark_warm_rows:
        raise RuntimeError(f"Spark's warm-up read {warm['events']} of {p.spark_warm_produced}"
                           f" messages and stored {stored} rows of {p.spark_warm_rows}")
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(warm_table)))
    _check_spark(b, raw, table)
    return as_measure(f"{SPARK_LABEL}, warm session", raw)
