-- The outbox: messages committed with a checkpoint (by `await tether.outbox(...)` in a workflow,
-- or `tether.outbox(...)` inside a transaction step), delivered by a worker service by key.
-- A row is pending (due at next_at), sending (claimed by claimed_by until next_at: past that,
-- or once that worker's row is gone, the send's outcome is unknown), delivered or failed.
-- The id is derived from the run, the checkpoint and the message's index there, so a retried
-- body or a replay never records a second message. Times are seconds since the epoch (UTC).

CREATE TABLE tether_outbox (
    id           TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    checkpoint   TEXT NOT NULL,
    destination  TEXT NOT NULL,
    key          TEXT NOT NULL,
    payload      TEXT NOT NULL,
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    uncertain    INTEGER NOT NULL DEFAULT 0,
    in_doubt     INTEGER NOT NULL DEFAULT 0,
    claims       INTEGER NOT NULL DEFAULT 0,
    claimed_by   TEXT,
    next_at      REAL NOT NULL,
    error        TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    delivered_at REAL
);
CREATE INDEX tether_outbox_due ON tether_outbox (status, next_at);
CREATE INDEX tether_outbox_run ON tether_outbox (run_id);
