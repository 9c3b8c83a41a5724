"""The peers of ``bench_ingest.py --peers``: other ways to load the same sample, same run.

One module a peer, each with its children (run in their own processes) and its
``measure_*`` rows, each checked before its figure is accepted (the valid events once in
its table, nothing else):

- :mod:`peers.naive`: ``B  naive loader`` (runs without ``--peers`` too: every row's
  baseline);
- :mod:`peers.copy_ceiling`: ``COPY ceiling``;
- :mod:`peers.connect`: Kafka Connect + the Debezium JDBC sink, fresh JVM and warm worker;
- :mod:`peers.spark`: Spark Structured Streaming, fresh JVM and warm session;
- :mod:`peers.airflow_operator`: the Airflow provider's ``ConsumeFromTopicOperator``, per
  message and per batch;
- :mod:`peers.seeds`: the seeds' poll/commit loop, on the first 2,000 messages.

What they share is :mod:`peers.common`; the harness is :mod:`harness`.
"""

from __future__ import annotations

from collections.abc import Callable

from harness import Bench, Measure

from peers import airflow_operator, connect, copy_ceiling, seeds, spark
from peers.common import PeerData, wanted

#: The ``--peers`` rows, in the order they run and print: (key for --only/--skip, row).
PATHS: list[tuple[str, Callable[[Bench, int], Measure]]] = [
    ("copy", copy_ceiling.measure_copy),
    ("connect_fresh", connect.measure_connect_fresh),
    ("connect_warm", connect.measure_connect_warm),
    ("spark_fresh", spark.measure_spark_fresh),
    ("spark_warm", spark.measure_spark_warm),
    ("operator_batch", airflow_operator.measure_operator_batch),
    ("operator_row", airflow_operator.measure_operator_row),
    ("seeds", seeds.measure_seeds),
]


def prepare(b: Bench) -> PeerData:
    """What the selected peers need, once per run: Connect's jars and topics, Spark's extra,
    jars and warm-up topic."""
    data = PeerData(b.args.seeds_cap or seeds.SEEDS_CAP)
    if wanted(b, connect.KEYS):
        connect.prepare(b, data)
    if wanted(b, spark.KEYS):
        spark.prepare(b, data)
    return data
