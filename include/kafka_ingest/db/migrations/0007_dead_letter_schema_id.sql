-- The writer schema id of a registry-encoded dead letter (format avro | protobuf |
-- json_schema), as its wire header says; NULL for JSON pipelines and headerless values.
ALTER TABLE dead_letters ADD COLUMN schema_id bigint;
