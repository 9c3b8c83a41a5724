"""kafka_ingest_dev: development tooling beside the runtime package, never imported by it.

The real local stack (Kafka on the JVM, Postgres, Airflow's metadata database), the demo
and the sample generator. Its commands (``kafka-ingest stack``, ``kafka-ingest demo``,
``kafka-ingest produce-sample``) reach the ``kafka-ingest`` command line through the
``kafka_ingest.commands`` entry point, so the runtime names nothing of it.
"""
