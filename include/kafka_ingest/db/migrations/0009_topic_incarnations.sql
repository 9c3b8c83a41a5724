-- A topic deleted and created again under the same name starts its offsets at 0 again:
-- offsets order a key's records only within one *incarnation* of a topic. Each topic id
-- Kafka gives a topic name (KIP-516) is numbered here, 1, 2, ... in the order first seen;
-- a latest table's rows and deletion markers carry the number of the incarnation they
-- came from, and (incarnation, offset) orders them.
CREATE TABLE topic_incarnations (
    topic          text        NOT NULL,
    topic_id       text        NOT NULL,   -- Kafka's topic id, as kafka-topics prints it
    incarnation    integer     NOT NULL CHECK (incarnation >= 1),
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, topic_id),
    UNIQUE (topic, incarnation)
);

-- The topic id the stored offset belongs to: a run refuses offsets of a topic that was
-- deleted and re-created since (NULL: stored before this was tracked; adopted at the next
-- run as the topic it reads now).
ALTER TABLE ingest_offsets ADD COLUMN topic_id text;

-- A dead letter is a record of one incarnation: the same offset of the re-created topic is
-- another record. Letters recorded before this belong to the first incarnation.
ALTER TABLE dead_letters ADD COLUMN source_incarnation integer NOT NULL DEFAULT 1;
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_pkey;
ALTER TABLE dead_letters ADD PRIMARY KEY (pipeline, source_topic, source_incarnation,
                                          source_partition, source_offset);

-- The example latest table: its rows so far came from the first incarnation.
ALTER TABLE device_state ADD COLUMN source_incarnation integer NOT NULL DEFAULT 1;
