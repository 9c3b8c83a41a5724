# ruff: noqa: S101  (pytest asserts; the per-file ignore in pyproject.toml covers tests/ only)
"""Unit tests of the Spark peer's pure parts (``benchmarks/spark.py``): the pins, the jars'
cache, the SQL it generates, its options. No Spark and no stack needed: ``pytest
benchmarks/test_peer_spark.py``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from peers import connect, spark
from peers.common import COLUMNS, CONTRACT

from kafka_ingest.contracts import get_contract

MODEL = get_contract(*CONTRACT)


def _constraint(name: str, attr: str) -> Any:
    """A constraint of a contract field (``max_length``, ``ge``, ...), wherever pydantic
    keeps it (the field's metadata, or the Annotated inside an Optional)."""
    field = MODEL.model_fields[name]
    metadata = list(field.metadata)
    for arg in getattr(field.annotation, "__args__", ()):
        metadata += getattr(arg, "__metadata__", ())
    return next(getattr(m, attr) for m in metadata if getattr(m, attr, None) is not None)


def _pom_property(pom: Path, name: str) -> str:
    found = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    assert found, (pom, name)
    return found.group(1)


def test_pyspark_pin_is_the_connectors_version() -> None:
    pins = spark.pinned(spark.SPARK_REQUIREMENTS)
    assert set(pins) == {"pyspark", "py4j"}
    assert _pom_property(spark.SPARK_POM, "spark.version") == pins["pyspark"]
    # the same JDBC driver as the Kafka Connect peer's
    assert _pom_property(spark.SPARK_POM, "postgresql.version") == \
        _pom_property(connect.POM, "postgresql.version")


def test_requirements_must_be_pinned(tmp_path: Path) -> None:
    loose = tmp_path / "r.txt"
    loose.write_text("# a comment\n\npyspark>=4\n")
    with pytest.raises(ValueError, match="not pinned"):
        spark.pinned(loose)
    loose.write_text("PySpark==4.2.0  # why\n")
    assert spark.pinned(loose) == {"pyspark": "4.2.0"}


def test_cache_dir_is_named_after_the_pom_and_the_pins(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = spark.spark_cache()
    assert cache.parent == tmp_path / "kafka-ingest"
    assert re.fullmatch(r"spark-[0-9a-f]{12}", cache.name)
    assert cache != connect.connect_cache()


def test_jars_pyspark_ships_are_recognised_whatever_their_version() -> None:
    ships = ["slf4j-api-2.0.17.jar", "commons-pool-1.5.4.jar", "zstd-jni-1.5.7-7.jar",
             "spark-tags_2.13-4.2.0.jar", "spark-sql_2.13-4.2.0.jar", "lz4-java-1.11.0.jar"]
    assert spark.shipped_by_pyspark("slf4j-api", ships)
    assert spark.shipped_by_pyspark("lz4-java", ships)
    assert spark.shipped_by_pyspark("zstd-jni", ships)
    assert spark.shipped_by_pyspark("spark-tags_2.13", ships)
    assert not spark.shipped_by_pyspark("commons-pool2", ships)
    assert not spark.shipped_by_pyspark("spark-sql-kafka-0-10_2.13", ships)
    assert not spark.shipped_by_pyspark("spark-sql", ships)  # spark-sql_2.13 is another
    assert not spark.shipped_by_pyspark("kafka-clients", ships)


def test_the_parse_schema_has_the_contracts_fields() -> None:
    names = [re.sub(r"`", "", f.split()[0]) for f in spark.SPARK_SCHEMA.split(", ")]
    assert names[-1] == spark.SPARK_JSON_OPTIONS["columnNameOfCorruptRecord"]
    assert set(names[:-1]) == set(MODEL.model_fields)
    types = dict(f.replace("`", "").split() for f in spark.SPARK_SCHEMA.split(", "))
    assert types["timestamp"] == types["metric_value"] == "DOUBLE"
    assert types["version"] == "INT"
    # Spark's lenient JSON defaults are turned off where the contract is strict
    assert spark.SPARK_JSON_OPTIONS["allowNonNumericNumbers"] == "false"
    assert spark.SPARK_JSON_OPTIONS["allowSingleQuotes"] == "false"


def test_the_rules_are_the_contracts_bounds() -> None:
    rules = " AND ".join(spark.spark_rules(1234))
    assert "octet_length(value) <= 1234" in rules
    for name in ("event_id", "device_id", "status", "unit"):
        low, high = _constraint(name, "min_length"), _constraint(name, "max_length")
        assert f"char_length({name}) BETWEEN {low} AND {high}" in rules, name
        assert f"NOT contains({name}, chr(0))" in rules, name
    assert f"version BETWEEN {_constraint('version', 'ge')} AND {_constraint('version', 'le')}" \
        in rules
    ts = f"`timestamp` >= {_constraint('timestamp', 'ge')} AND " \
         f"`timestamp` < {_constraint('timestamp', 'lt')}"
    assert ts in rules
    # an explicit null is refused where the field has a default; only unit may be null
    assert "status IS NULL AND NOT array_contains(json_object_keys(json), 'status')" in rules
    assert "version IS NULL AND NOT array_contains(json_object_keys(json), 'version')" in rules
    assert MODEL.model_fields["status"].default == "OK"
    assert "coalesce(status, 'OK') AS status" in spark.SPARK_STAGED
    # no Python UDF: the rules are Spark SQL only
    assert "udf" not in rules.lower()


def test_staging_and_merge_sql() -> None:
    ddl = spark.stage_ddl("t_stage_3").as_string(None)
    assert ddl.startswith('CREATE UNLOGGED TABLE "t_stage_3" ("event_id" text, ')
    assert '"timestamp" float8' in ddl and '"kafka_timestamp_ms" int8' in ddl
    staged = [e.rsplit(" AS ", 1)[-1].strip("`") for e in spark.SPARK_STAGED]
    assert staged == [name for name, _, _ in spark.STAGE_COLUMNS]  # what Spark writes
    merge = spark.merge_sql("t", "t_stage_3").as_string(None)
    target = ", ".join(f'"{name}"' for name, _ in COLUMNS)
    assert merge.startswith(f'INSERT INTO "t" ({target}) SELECT DISTINCT ON (event_id) ')
    assert 'to_timestamp("timestamp")' in merge
    assert "to_timestamp(kafka_timestamp_ms / 1000.0)" in merge
    assert merge.endswith('FROM "t_stage_3" ORDER BY event_id, source_partition, '
                          "source_offset ON CONFLICT (event_id) DO NOTHING")


def test_session_source_and_jdbc_options(tmp_path: Path) -> None:
    conf = spark.spark_conf(["/c/a.jar", "/c/b.jar"], tmp_path)
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.jars"] == "/c/a.jar,/c/b.jar"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.local.dir"].startswith(str(tmp_path))
    assert f"-Dkafka_ingest.spark.log={tmp_path / 'spark.log'}" in \
        conf["spark.driver.extraJavaOptions"]
    source = spark.kafka_source_options("b:1", "topic-a", "bench-x-spark")
    assert source["kafka.bootstrap.servers"] == "b:1"
    assert source["subscribe"] == "topic-a"
    assert source["startingOffsets"] == "earliest"
    assert source["maxOffsetsPerTrigger"] == str(spark.SPARK_MAX_OFFSETS)
    assert source["groupIdPrefix"].startswith("bench-")  # deleted with the bench's groups
    jdbc = spark.jdbc_options("host=127.0.0.1 port=15432 dbname=db user=u password=p",
                              "t_stage_0")
    assert jdbc["url"] == "jdbc:postgresql://127.0.0.1:15432/db?reWriteBatchedInserts=true"
    assert (jdbc["user"], jdbc["password"], jdbc["dbtable"]) == ("u", "p", "t_stage_0")
    assert jdbc["batchsize"] == str(spark.SPARK_JDBC_BATCH)
    assert "password" not in spark.jdbc_options("dbname=db", "s")
    for opts in (conf, source, jdbc):  # Spark's options are strings
        assert all(isinstance(v, str) for v in opts.values())
