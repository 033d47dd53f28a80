-- Tether schema v1 for SQLite: runs, their checkpoints, and the workers that lease them.
-- Times are REAL seconds since the epoch (UTC), values are JSON text made by tether.serde.

CREATE TABLE tether_runs (
    id               TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    status           TEXT NOT NULL,
    args             TEXT NOT NULL,
    result           TEXT,
    error            TEXT,
    owner            TEXT,
    epoch            INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    wake_at          REAL,
    deadline_at      REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL
);

-- claim_runs and next_wake_at look runs up by status, then by the time they become due.
CREATE INDEX tether_runs_due ON tether_runs (status, wake_at);
CREATE INDEX tether_runs_lease ON tether_runs (status, lease_expires_at);
CREATE INDEX tether_runs_created ON tether_runs (created_at);
CREATE INDEX tether_runs_owner ON tether_runs (owner) WHERE owner IS NOT NULL;

CREATE TABLE tether_checkpoints (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    started_at  REAL,
    finished_at REAL,
    retry_at    REAL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE tether_workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    pid_token    TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);

-- (Numbered 0002 until PostgreSQL's numbering was adopted) mailboxes of events, child runs, and what a waiting run waits for.

-- Events sent to a run, consumed once each, in order per key. `consumed_by` names the checkpoint
-- that took the event, so a replay finds it there and never takes a second one.
CREATE TABLE tether_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    key         TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    consumed_by TEXT,
    consumed_at REAL
);
CREATE INDEX tether_events_mailbox ON tether_events (run_id, key, id) WHERE consumed_by IS NULL;

ALTER TABLE tether_runs ADD COLUMN parent_id TEXT;
-- JSON list of mailbox keys whose arrival makes a waiting run claimable at once.
ALTER TABLE tether_runs ADD COLUMN wake_on TEXT;
CREATE INDEX tether_runs_parent ON tether_runs (parent_id) WHERE parent_id IS NOT NULL;
