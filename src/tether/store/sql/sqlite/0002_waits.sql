-- Tether schema v2 for SQLite: mailboxes of events, child runs, and what a waiting run waits for.

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
