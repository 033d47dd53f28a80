-- Tether schema v15 for PostgreSQL: code versions (docs/versions.md).

-- The application version a run is pinned to: set by its first claim (or its creation already
-- claimed), then only workers of that version claim it, until it is moved explicitly. NULL:
-- not pinned yet (runs made before this version are pinned at their next claim).
ALTER TABLE tether_runs ADD COLUMN version TEXT;

-- The version each worker declares (NULL: an older worker, which claims runs of any version).
ALTER TABLE tether_workers ADD COLUMN version TEXT;
