"""The Kafka side: clients (and the one place Kafka's errors are mapped), group
commits, bounded reads, the dead-letter queue, topics. It never imports the Postgres side."""
