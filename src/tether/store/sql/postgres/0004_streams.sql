-- Tether schema v4 for PostgreSQL: streams, the append-only logs of chunks that runs write.

-- The next offset of each stream. An append locks its stream's row (an upsert), so appenders
-- in any number of processes take turns and never hand out an offset twice.
CREATE TABLE tether_streams (
    run_id      TEXT NOT NULL,
    key         TEXT NOT NULL,
    next_offset BIGINT NOT NULL,
    PRIMARY KEY (run_id, key)
);

-- One row per entry of the stream (run_id, key), addressed by its offset: 0, 1, 2, ... with no
-- gap. A chunk's data is the JSON of its value; a reset's is the JSON list of the offsets it
-- retracts. `writer` is the checkpoint name of the step (or workflow write) that wrote it and
-- `attempt` the step's attempt (0 for workflow code).
CREATE TABLE tether_stream_entries (
    run_id     TEXT NOT NULL,
    key        TEXT NOT NULL,
    "offset"   BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    data       TEXT NOT NULL,
    writer     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    ref        TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, key, "offset")
);
-- A workflow's write carries its checkpoint name as ref: appending it again after a crash
-- between the append and its checkpoint finds it here instead of writing it twice.
CREATE UNIQUE INDEX tether_stream_refs ON tether_stream_entries (run_id, key, ref)
    WHERE ref IS NOT NULL;
-- A step attempt's first write looks up the chunks its earlier attempts left unretracted.
CREATE INDEX tether_stream_writers ON tether_stream_entries (run_id, key, writer);
