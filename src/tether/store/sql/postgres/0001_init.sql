-- Tether schema v1 for PostgreSQL: runs, checkpoints, workers, mailboxes (SQLite's v1 and v2).
-- Times are DOUBLE PRECISION seconds since the epoch (UTC), values are JSON text from serde.

CREATE TABLE tether_runs (
    id               TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    status           TEXT NOT NULL,
    args             TEXT NOT NULL,
    result           TEXT,
    error            TEXT,
    owner            TEXT,
    epoch            BIGINT NOT NULL DEFAULT 0,
    lease_expires_at DOUBLE PRECISION,
    wake_at          DOUBLE PRECISION,
    deadline_at      DOUBLE PRECISION,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    finished_at      DOUBLE PRECISION,
    parent_id        TEXT,
    wake_on          TEXT
);
CREATE INDEX tether_runs_due ON tether_runs (status, wake_at);
CREATE INDEX tether_runs_lease ON tether_runs (status, lease_expires_at);
CREATE INDEX tether_runs_created ON tether_runs (created_at);
CREATE INDEX tether_runs_owner ON tether_runs (owner) WHERE owner IS NOT NULL;
CREATE INDEX tether_runs_parent ON tether_runs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE tether_checkpoints (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    started_at  DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    retry_at    DOUBLE PRECISION,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE tether_workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    pid_token    TEXT NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE tether_events (
    id          BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL,
    key         TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    consumed_by TEXT,
    consumed_at DOUBLE PRECISION
);
CREATE INDEX tether_events_mailbox ON tether_events (run_id, key, id) WHERE consumed_by IS NULL;
