"""The engine: one planner and one slice engine, and what ingest, replay and backfill
pass into them. The only place the Kafka side and the Postgres side meet."""
