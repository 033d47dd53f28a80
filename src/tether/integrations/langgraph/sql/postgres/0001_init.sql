-- TetherSaver's tables, v1 (PostgreSQL): LangGraph checkpoints, next to Tether's own tables.
-- A checkpoint row holds the checkpoint without its channel values (channel_versions,
-- versions_seen, ...; small scalar values stay in it) and its metadata, as JSON since `list`
-- filters on it. Each other channel value is a blob keyed by (thread, namespace, channel,
-- version), written once, when its version changes. Checkpoints and values are encoded by the
-- saver's serde as (type, bytes): msgpack, never pickle.

CREATE TABLE tether_lg_checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL DEFAULT '',
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    checkpoint_type      TEXT NOT NULL,
    checkpoint           BYTEA NOT NULL,
    metadata             JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

-- delete_for_runs finds a run's checkpoints by the run id in their metadata.
CREATE INDEX tether_lg_checkpoints_run ON tether_lg_checkpoints ((metadata ->> 'run_id'));

CREATE TABLE tether_lg_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel       TEXT NOT NULL,
    version       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

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
    blob          BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
