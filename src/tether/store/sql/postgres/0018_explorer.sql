-- Tether schema v18 for PostgreSQL: indexes for listing runs by filter, newest first (list_runs).

-- Each serves one filter of a page (alone, or with a time range and the keyset cursor) in the
-- listing's order, read backwards: a page reads about `limit` rows on a million runs. Ids are
-- ordered COLLATE "C" (code point order, as on SQLite), whatever the database's collation.
-- The created_at index gains id, the listing's tie-breaker, and so serves the unfiltered page.
DROP INDEX tether_runs_created;
CREATE INDEX tether_runs_created ON tether_runs (created_at, id COLLATE "C");
CREATE INDEX tether_runs_status_created ON tether_runs (status, created_at, id COLLATE "C");
CREATE INDEX tether_runs_workflow_created ON tether_runs (workflow, created_at, id COLLATE "C");
CREATE INDEX tether_runs_queue_created ON tether_runs (queue, created_at, id COLLATE "C")
    WHERE queue IS NOT NULL;
CREATE INDEX tether_runs_version_created ON tether_runs (version, created_at, id COLLATE "C")
    WHERE version IS NOT NULL;
CREATE INDEX tether_runs_starter_created ON tether_runs (started_by, created_at, id COLLATE "C")
    WHERE started_by IS NOT NULL;
-- The search by id prefix: a range in code point order (the primary key's index has the
-- database's collation, in which the ids of a prefix need not be one range).
CREATE INDEX tether_runs_id_text ON tether_runs (id COLLATE "C");
