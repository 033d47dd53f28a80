-- Tether schema v7 for SQLite: dead-lettered runs. A run counts its executions in a row that
-- failed outside the workflow's code (progress resets the count); a worker records which
-- workflows it serves, so that runs no live worker can execute are found.

ALTER TABLE tether_runs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
-- The workers' workflows: a JSON list of names, NULL for a worker of an older version.
ALTER TABLE tether_workers ADD COLUMN workflows TEXT;
