-- Tether schema v4 for SQLite: approvals, their hash-chained audit trail, and who started a run.

ALTER TABLE tether_runs ADD COLUMN started_by TEXT;

-- One row per approval. The columns queried or updated on their own sit outside `body`, the
-- JSON of every other field (rows.approval_to_row).
CREATE TABLE tether_approvals (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    step        TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    audit_count INTEGER NOT NULL,
    audit_head  TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX tether_approvals_status ON tether_approvals (status, created_at);
CREATE INDEX tether_approvals_run ON tether_approvals (run_id);

-- Append-only: rows are inserted, never updated or deleted. Each entry's hash covers its content
-- and the hash before it, so an edit breaks the chain. `at` is REAL, exactly the float hashed.
CREATE TABLE tether_approval_audit (
    approval_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    at          REAL NOT NULL,
    event       TEXT NOT NULL,
    actor       TEXT,
    detail      TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    PRIMARY KEY (approval_id, seq)
) WITHOUT ROWID;
