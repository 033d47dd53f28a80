-- Named queries of retention (store/postgres_retention.py): finding what ended long ago,
-- deleting it a bounded number of rows at a time, and the sizes of the database. A cursor
-- (after_at, after_id) says where the previous batch stopped in the order of deletion.

-- name: retention_expired_runs
-- Runs that ended before the cutoff, oldest first after the cursor, whose parent (if any) is
-- not unfinished and none of whose children is; with the rows each has beside its own (what a
-- batch deletes with it) and whether an outbox message of it is neither delivered nor failed
-- (then it is kept). Locked: a resume waits, then finds it gone; runs another transaction
-- holds are skipped (the next sweep gets them).
SELECT r.id, r.finished_at,
       (SELECT count(*) FROM tether_checkpoints x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_events x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_stream_entries x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_streams x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_values x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_forks x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_outbox x WHERE x.run_id = r.id
          AND x.status IN ('delivered', 'failed')),
       EXISTS (SELECT 1 FROM tether_outbox x WHERE x.run_id = r.id
               AND x.status NOT IN ('delivered', 'failed'))
FROM tether_runs r
WHERE r.finished_at < %(before)s
  AND (r.finished_at, r.id) > (%(after_at)s, %(after_id)s)
  AND r.status IN ('succeeded', 'failed', 'cancelled', 'dead')
  AND NOT EXISTS (SELECT 1 FROM tether_runs p WHERE p.id = r.parent_id
                  AND p.status IN ('pending', 'running', 'waiting', 'held'))
  AND NOT EXISTS (SELECT 1 FROM tether_runs c WHERE c.parent_id = r.id
                  AND c.status IN ('pending', 'running', 'waiting', 'held'))
ORDER BY r.finished_at, r.id
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;

-- name: retention_ended_runs
-- Runs that ended before the cutoff, oldest first after the cursor, and whether they have
-- stream entries left.
SELECT r.id, r.finished_at,
       EXISTS (SELECT 1 FROM tether_stream_entries s WHERE s.run_id = r.id)
FROM tether_runs r
WHERE r.finished_at < %(before)s
  AND (r.finished_at, r.id) > (%(after_at)s, %(after_id)s)
  AND r.status IN ('succeeded', 'failed', 'cancelled', 'dead')
ORDER BY r.finished_at, r.id
LIMIT %(limit)s;

-- Each table's rows of a set of runs (ids, a list): counted per run (dry runs), or deleted
-- at once: one statement per table, however many runs the batch holds.

-- name: retention_rows_tether_checkpoints
SELECT run_id, count(*) FROM tether_checkpoints WHERE run_id = ANY(%(ids)s) GROUP BY run_id;

-- name: retention_delete_all_tether_checkpoints
DELETE FROM tether_checkpoints WHERE run_id = ANY(%(ids)s);

-- name: retention_rows_tether_events
SELECT run_id, count(*) FROM tether_events WHERE run_id = ANY(%(ids)s) GROUP BY run_id;

-- name: retention_delete_all_tether_events
DELETE FROM tether_events WHERE run_id = ANY(%(ids)s);

-- name: retention_rows_tether_stream_entries
SELECT run_id, count(*) FROM tether_stream_entries WHERE run_id = ANY(%(ids)s) GROUP BY run_id;

-- name: retention_delete_all_tether_stream_entries
DELETE FROM tether_stream_entries WHERE run_id = ANY(%(ids)s);

-- name: retention_rows_tether_values
SELECT run_id, count(*) FROM tether_values WHERE run_id = ANY(%(ids)s) GROUP BY run_id;

-- name: retention_delete_all_tether_values
DELETE FROM tether_values WHERE run_id = ANY(%(ids)s);

-- name: retention_rows_tether_forks
SELECT run_id, count(*) FROM tether_forks WHERE run_id = ANY(%(ids)s) GROUP BY run_id;

-- name: retention_delete_all_tether_forks
DELETE FROM tether_forks WHERE run_id = ANY(%(ids)s);

-- name: retention_rows_tether_outbox
SELECT run_id, count(*) FROM tether_outbox WHERE run_id = ANY(%(ids)s) AND status IN ('delivered', 'failed') GROUP BY run_id;

-- name: retention_delete_all_tether_outbox
DELETE FROM tether_outbox WHERE run_id = ANY(%(ids)s) AND status IN ('delivered', 'failed');

-- name: retention_rows_tether_streams
SELECT run_id, count(*) FROM tether_streams WHERE run_id = ANY(%(ids)s) GROUP BY run_id;

-- name: retention_delete_all_tether_streams
DELETE FROM tether_streams WHERE run_id = ANY(%(ids)s);

-- name: retention_delete_runs
DELETE FROM tether_runs WHERE id = ANY(%(ids)s)
  AND status IN ('succeeded', 'failed', 'cancelled', 'dead');

-- The rows of one run bigger than a batch, a batch at a time.

-- name: retention_count_tether_checkpoints
SELECT count(*) FROM tether_checkpoints WHERE run_id = %(id)s;

-- name: retention_delete_tether_checkpoints
DELETE FROM tether_checkpoints WHERE run_id = %(id)s
  AND seq IN (SELECT seq FROM tether_checkpoints WHERE run_id = %(id)s LIMIT %(limit)s);

-- name: retention_count_tether_events
SELECT count(*) FROM tether_events WHERE run_id = %(id)s;

-- name: retention_delete_tether_events
DELETE FROM tether_events
WHERE id IN (SELECT id FROM tether_events WHERE run_id = %(id)s LIMIT %(limit)s);

-- name: retention_count_tether_stream_entries
SELECT count(*) FROM tether_stream_entries WHERE run_id = %(id)s;

-- name: retention_delete_tether_stream_entries
DELETE FROM tether_stream_entries WHERE run_id = %(id)s
  AND (key, "offset") IN (SELECT key, "offset" FROM tether_stream_entries
                          WHERE run_id = %(id)s LIMIT %(limit)s);

-- name: retention_count_tether_streams
SELECT count(*) FROM tether_streams WHERE run_id = %(id)s;

-- name: retention_delete_tether_streams
-- The offset counters of the run's streams (a run has few).
DELETE FROM tether_streams WHERE run_id = %(id)s;

-- name: retention_count_tether_values
SELECT count(*) FROM tether_values WHERE run_id = %(id)s;

-- name: retention_delete_tether_values
DELETE FROM tether_values WHERE run_id = %(id)s
  AND (key, version) IN (SELECT key, version FROM tether_values
                         WHERE run_id = %(id)s LIMIT %(limit)s);

-- name: retention_count_tether_forks
SELECT count(*) FROM tether_forks WHERE run_id = %(id)s;

-- name: retention_delete_tether_forks
-- The link naming the run as the fork; links naming it as the source stay.
DELETE FROM tether_forks WHERE run_id = %(id)s;

-- name: retention_count_tether_outbox
SELECT count(*) FROM tether_outbox WHERE run_id = %(id)s AND status IN ('delivered', 'failed');

-- name: retention_delete_tether_outbox
-- A run has few messages: deleted at once.
DELETE FROM tether_outbox WHERE run_id = %(id)s AND status IN ('delivered', 'failed');

-- name: retention_delete_run
DELETE FROM tether_runs
WHERE id = %(id)s AND status IN ('succeeded', 'failed', 'cancelled', 'dead');

-- name: retention_expired_approvals
-- Approvals whose run is gone, that are not pending and were last changed before the cutoff.
SELECT a.id, a.updated_at FROM tether_approvals a
WHERE a.updated_at < %(before)s
  AND (a.updated_at, a.id) > (%(after_at)s, %(after_id)s)
  AND a.status <> 'pending'
  AND NOT EXISTS (SELECT 1 FROM tether_runs r WHERE r.id = a.run_id)
ORDER BY a.updated_at, a.id
LIMIT %(limit)s
FOR UPDATE OF a SKIP LOCKED;

-- name: retention_count_audit
SELECT count(*) FROM tether_approval_audit WHERE approval_id = %(id)s;

-- name: retention_delete_audit
DELETE FROM tether_approval_audit WHERE approval_id = %(id)s;

-- name: retention_delete_approval
DELETE FROM tether_approvals WHERE id = %(id)s AND status <> 'pending';

-- name: retention_table_sizes
-- Tether's tables in the current schema, with the bytes each takes with its indexes and TOAST.
SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c
WHERE c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace
  AND c.relname LIKE 'tether\_%%'
ORDER BY c.relname;

-- name: retention_count_rows
-- {table} is a name from retention_table_sizes, checked by tables.table_name.
SELECT count(*) FROM {table};

-- name: retention_database_bytes
SELECT pg_database_size(current_database());
