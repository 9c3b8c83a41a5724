-- Runs once, when the postgres service initialises an empty volume
-- (/docker-entrypoint-initdb.d). Mirrors the local stack (`kafka-ingest stack up`):
-- one non-superuser role owning the pipelines database and Airflow's metadata database.
CREATE ROLE kafka_ingest LOGIN PASSWORD 'kafka_ingest';
CREATE DATABASE kafka_ingest OWNER kafka_ingest;
CREATE DATABASE airflow OWNER kafka_ingest;
