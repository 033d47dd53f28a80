-- TetherSaver's tables, v1 (SQLite): LangGraph checkpoints, next to Tether's own tables.
-- A checkpoint row holds the checkpoint without its channel values (channel_versions,
-- versions_seen, ...; small scalar values stay in it) and its metadata, as JSON since `list`
-- filters on it. Each other channel value is a blob keyed by (thread, namespace, channel,
-- version), written once, when its version changes. Checkpoints and values are encoded by the
-- saver's serde as (type, bytes): msgpack, never pickle.
--
-- Blobs and writes are WITHOUT ROWID tables: they are only ever found by their primary key, so
-- a rowid table would add a second b-tree to write at every step (a fifth of a step's pages).

CREATE TABLE tether_lg_checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL DEFAULT '',
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    checkpoint_type      TEXT NOT NULL,
    checkpoint           BLOB NOT NULL,
    metadata             TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

-- No index on the metadata's run_id: it would cost every put a JSON parse, and only
-- delete_for_runs, a maintenance operation, looks checkpoints up by it (a scan, here).

CREATE TABLE tether_lg_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel       TEXT NOT NULL,
    version       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
) WITHOUT ROWID;

-- Pending writes of a checkpoint's tasks; idx < 0 marks the special channels (errors,
-- interrupts, resumes), which a task may write again.
CREATE TABLE tether_lg_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    task_path     TEXT NOT NULL DEFAULT '',
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;
