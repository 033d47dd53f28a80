-- Tether schema v5 for SQLite: streams, the append-only logs of chunks that runs write.

-- One row per entry of the stream (run_id, key), addressed by its offset: 0, 1, 2, ... with no
-- gap. A chunk's data is the JSON of its value; a reset's is the JSON list of the offsets it
-- retracts. `writer` is the checkpoint name of the step (or workflow write) that wrote it and
-- `attempt` the step's attempt (0 for workflow code). Offsets are given inside the append's
-- write transaction (max + 1), which SQLite's single writer serializes.
CREATE TABLE tether_stream_entries (
    run_id     TEXT NOT NULL,
    key        TEXT NOT NULL,
    "offset"   INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    data       TEXT NOT NULL,
    writer     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    ref        TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, key, "offset")
) WITHOUT ROWID;
-- A workflow's write carries its checkpoint name as ref: appending it again after a crash
-- between the append and its checkpoint finds it here instead of writing it twice.
CREATE UNIQUE INDEX tether_stream_refs ON tether_stream_entries (run_id, key, ref)
    WHERE ref IS NOT NULL;
-- A step attempt's first write looks up the chunks its earlier attempts left unretracted.
CREATE INDEX tether_stream_writers ON tether_stream_entries (run_id, key, writer);
