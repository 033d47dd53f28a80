-- Tether schema v3 for SQLite: queues, priorities, dedup keys, and when a run first started.

ALTER TABLE tether_runs ADD COLUMN queue TEXT;
ALTER TABLE tether_runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tether_runs ADD COLUMN dedup_key TEXT;
ALTER TABLE tether_runs ADD COLUMN started_at REAL;
-- At most one unfinished run per (queue, dedup key); finished runs leave the index.
CREATE UNIQUE INDEX tether_runs_dedup ON tether_runs (coalesce(queue, ''), dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running', 'waiting');
CREATE INDEX tether_runs_queue ON tether_runs (queue, status) WHERE queue IS NOT NULL;
