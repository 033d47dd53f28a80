-- Named queries of retention (store/sqlite_retention.py): finding what ended long ago, deleting
-- it a bounded number of rows at a time, and the sizes of the database. A cursor (:after_at,
-- :after_id) says where the previous batch stopped in the order of deletion. `+r.status` keeps
-- the planner on the index of ended runs (tether_runs_finished), not on that of statuses.

-- name: retention_expired_runs
-- Runs that ended before :before, oldest first after the cursor, whose parent (if any) is not
-- unfinished and none of whose children is; with the rows each has beside its own (what a
-- batch deletes with it) and whether an outbox message of it is neither delivered nor failed
-- (then it is kept).
SELECT r.id, r.finished_at,
       (SELECT count(*) FROM tether_checkpoints x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_events x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_stream_entries x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_values x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_forks x WHERE x.run_id = r.id)
       + (SELECT count(*) FROM tether_outbox x WHERE x.run_id = r.id
          AND +x.status IN ('delivered', 'failed')),
       EXISTS (SELECT 1 FROM tether_outbox x WHERE x.run_id = r.id
               AND +x.status NOT IN ('delivered', 'failed'))
FROM tether_runs r
WHERE r.finished_at < :before
  AND (r.finished_at, r.id) > (:after_at, :after_id)
  AND +r.status IN ('succeeded', 'failed', 'cancelled', 'dead')
  AND NOT EXISTS (SELECT 1 FROM tether_runs p WHERE p.id = r.parent_id
                  AND p.status IN ('pending', 'running', 'waiting', 'held'))
  AND NOT EXISTS (SELECT 1 FROM tether_runs c WHERE c.parent_id = r.id
                  AND c.status IN ('pending', 'running', 'waiting', 'held'))
ORDER BY r.finished_at, r.id
LIMIT :limit;

-- name: retention_ended_runs
-- Runs that ended before :before, oldest first after the cursor, and whether they have stream
-- entries left.
SELECT r.id, r.finished_at,
       EXISTS (SELECT 1 FROM tether_stream_entries s WHERE s.run_id = r.id)
FROM tether_runs r
WHERE r.finished_at < :before
  AND (r.finished_at, r.id) > (:after_at, :after_id)
  AND +r.status IN ('succeeded', 'failed', 'cancelled', 'dead')
ORDER BY r.finished_at, r.id
LIMIT :limit;

-- Each table's rows of a set of runs (:ids, a JSON list): counted per run (dry runs), or
-- deleted at once: one statement per table, however many runs the batch holds. (`+status`:
-- found by run, not through the index of statuses.)

-- name: retention_rows_tether_checkpoints
SELECT run_id, count(*) FROM tether_checkpoints
WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY run_id;

-- name: retention_delete_all_tether_checkpoints
DELETE FROM tether_checkpoints WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: retention_rows_tether_events
SELECT run_id, count(*) FROM tether_events
WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY run_id;

-- name: retention_delete_all_tether_events
DELETE FROM tether_events WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: retention_rows_tether_stream_entries
SELECT run_id, count(*) FROM tether_stream_entries
WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY run_id;

-- name: retention_delete_all_tether_stream_entries
DELETE FROM tether_stream_entries WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: retention_rows_tether_values
SELECT run_id, count(*) FROM tether_values
WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY run_id;

-- name: retention_delete_all_tether_values
DELETE FROM tether_values WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: retention_rows_tether_forks
SELECT run_id, count(*) FROM tether_forks
WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY run_id;

-- name: retention_delete_all_tether_forks
DELETE FROM tether_forks WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: retention_rows_tether_outbox
SELECT run_id, count(*) FROM tether_outbox
WHERE run_id IN (SELECT value FROM json_each(:ids)) AND +status IN ('delivered', 'failed') GROUP BY run_id;

-- name: retention_delete_all_tether_outbox
DELETE FROM tether_outbox WHERE run_id IN (SELECT value FROM json_each(:ids)) AND +status IN ('delivered', 'failed');

-- name: retention_delete_runs
DELETE FROM tether_runs WHERE id IN (SELECT value FROM json_each(:ids))
  AND +status IN ('succeeded', 'failed', 'cancelled', 'dead');

-- The rows of one run bigger than a batch, a batch at a time.

-- name: retention_count_tether_checkpoints
SELECT count(*) FROM tether_checkpoints WHERE run_id = :id;

-- name: retention_delete_tether_checkpoints
DELETE FROM tether_checkpoints WHERE run_id = :id
  AND seq IN (SELECT seq FROM tether_checkpoints WHERE run_id = :id LIMIT :limit);

-- name: retention_count_tether_events
SELECT count(*) FROM tether_events WHERE run_id = :id;

-- name: retention_delete_tether_events
DELETE FROM tether_events
WHERE id IN (SELECT id FROM tether_events WHERE run_id = :id LIMIT :limit);

-- name: retention_count_tether_stream_entries
SELECT count(*) FROM tether_stream_entries WHERE run_id = :id;

-- name: retention_delete_tether_stream_entries
DELETE FROM tether_stream_entries WHERE run_id = :id
  AND (key, "offset") IN (SELECT key, "offset" FROM tether_stream_entries
                          WHERE run_id = :id LIMIT :limit);

-- name: retention_count_tether_values
SELECT count(*) FROM tether_values WHERE run_id = :id;

-- name: retention_delete_tether_values
DELETE FROM tether_values WHERE run_id = :id
  AND (key, version) IN (SELECT key, version FROM tether_values WHERE run_id = :id LIMIT :limit);

-- name: retention_count_tether_forks
SELECT count(*) FROM tether_forks WHERE run_id = :id;

-- name: retention_delete_tether_forks
-- The link naming the run as the fork; links naming it as the source stay.
DELETE FROM tether_forks WHERE run_id = :id;

-- name: retention_count_tether_outbox
SELECT count(*) FROM tether_outbox WHERE run_id = :id AND +status IN ('delivered', 'failed');

-- name: retention_delete_tether_outbox
-- A run has few messages: deleted at once.
DELETE FROM tether_outbox WHERE run_id = :id AND +status IN ('delivered', 'failed');

-- name: retention_delete_run
DELETE FROM tether_runs
WHERE id = :id AND +status IN ('succeeded', 'failed', 'cancelled', 'dead');

-- name: retention_expired_approvals
-- Approvals whose run is gone, that are not pending and were last changed before :before.
SELECT a.id, a.updated_at FROM tether_approvals a
WHERE a.updated_at < :before
  AND (a.updated_at, a.id) > (:after_at, :after_id)
  AND a.status <> 'pending'
  AND NOT EXISTS (SELECT 1 FROM tether_runs r WHERE r.id = a.run_id)
ORDER BY a.updated_at, a.id
LIMIT :limit;

-- name: retention_count_audit
SELECT count(*) FROM tether_approval_audit WHERE approval_id = :id;

-- name: retention_delete_audit
DELETE FROM tether_approval_audit WHERE approval_id = :id;

-- name: retention_delete_approval
DELETE FROM tether_approvals WHERE id = :id AND status <> 'pending';

-- name: retention_table_names
SELECT name FROM sqlite_master
WHERE type = 'table' AND name LIKE 'tether\_%' ESCAPE '\'
ORDER BY name;

-- name: retention_count_rows
-- {table} is a name from retention_table_names, checked by tables.table_name.
SELECT count(*) FROM {table};

-- name: retention_table_bytes
-- The bytes of each table with its indexes (the dbstat virtual table, summed per b-tree).
SELECT m.tbl_name, sum(s.pgsize) FROM dbstat AS s
JOIN sqlite_master AS m ON m.name = s.name
WHERE s.aggregate = TRUE AND m.tbl_name LIKE 'tether\_%' ESCAPE '\'
GROUP BY m.tbl_name;

-- name: retention_pages
-- The page size, the free pages inside the file and the auto_vacuum mode (0 none, 1 full,
-- 2 incremental).
SELECT s.page_size, f.freelist_count, a.auto_vacuum
FROM pragma_page_size() AS s, pragma_freelist_count() AS f, pragma_auto_vacuum() AS a;
