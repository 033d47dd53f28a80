-- Named queries of published values and fork links (PostgreSQL); the tables are in
-- 0009_values.sql.

-- name: value_lease_held
-- Locks the run row: a set_value and the run's other fenced writes take turns.
SELECT 1 FROM tether_runs
WHERE id = %(run_id)s AND status = 'running' AND owner = %(worker)s AND epoch = %(epoch)s
FOR UPDATE;

-- name: next_value_version
SELECT coalesce(max(version), 0) + 1 FROM tether_values
WHERE run_id = %(run_id)s AND key = %(key)s;

-- name: insert_value
INSERT INTO tether_values (run_id, key, version, value, seq, created_at)
VALUES (%(run_id)s, %(key)s, %(version)s, %(value)s, %(seq)s, %(now)s);

-- name: put_checkpoint
-- Not fenced here: set_value checks the lease first in its transaction, and fork_run writes
-- the history of the run it has just created.
INSERT INTO tether_checkpoints
    (run_id, seq, name, kind, status, result, error, attempts, started_at, finished_at, retry_at,
     position, args)
VALUES (%(run_id)s, %(seq)s, %(name)s, %(kind)s, %(status)s, %(result)s, %(error)s,
        %(attempts)s, %(started_at)s, %(finished_at)s, %(retry_at)s, %(position)s, %(args)s)
ON CONFLICT (run_id, seq) DO UPDATE SET
    name = excluded.name, kind = excluded.kind, status = excluded.status,
    result = excluded.result, error = excluded.error, attempts = excluded.attempts,
    started_at = excluded.started_at, finished_at = excluded.finished_at,
    retry_at = excluded.retry_at, position = excluded.position, args = excluded.args;

-- name: latest_value
SELECT run_id, key, version, value, seq, created_at FROM tether_values
WHERE run_id = %(run_id)s AND key = %(key)s
ORDER BY version DESC LIMIT 1;

-- name: latest_values
SELECT DISTINCT ON (key) run_id, key, version, value, seq, created_at FROM tether_values
WHERE run_id = %(run_id)s
ORDER BY key, version DESC;

-- name: fork_insert_run
INSERT INTO tether_runs (id, workflow, status, args, epoch, deadline_at, parent_id, queue,
                         priority, started_by, created_at, updated_at)
VALUES (%(id)s, %(workflow)s, 'pending', %(args)s, 0, %(deadline_at)s, %(parent_id)s, %(queue)s,
        %(priority)s, %(started_by)s, %(now)s, %(now)s)
ON CONFLICT (id) DO NOTHING;

-- name: fork_values
-- The versions the copied checkpoints set (by their positions).
INSERT INTO tether_values (run_id, key, version, value, seq, created_at)
SELECT %(run_id)s, v.key, v.version, v.value, v.seq, v.created_at FROM tether_values AS v
WHERE v.run_id = %(source)s AND v.seq = ANY(%(seqs)s);

-- name: fork_events
-- The source's events that no copied checkpoint (by name) consumed, in order.
INSERT INTO tether_events (run_id, key, payload, created_at)
SELECT %(run_id)s, e.key, e.payload, e.created_at FROM tether_events AS e
WHERE e.run_id = %(source)s AND left(e.key, 7) <> 'tether:'
  AND (e.consumed_by IS NULL OR NOT e.consumed_by = ANY(%(names)s))
ORDER BY e.id;

-- name: fork_event
INSERT INTO tether_events (run_id, key, payload, created_at)
VALUES (%(run_id)s, %(key)s, %(payload)s, %(now)s);

-- name: insert_fork
INSERT INTO tether_forks (run_id, source_run_id, from_step, from_seq, created_at)
VALUES (%(run_id)s, %(source_run_id)s, %(from_step)s, %(from_seq)s, %(created_at)s);

-- name: get_fork
SELECT run_id, source_run_id, from_step, from_seq, created_at FROM tether_forks
WHERE run_id = %(run_id)s;

-- name: list_forks
SELECT run_id, source_run_id, from_step, from_seq, created_at FROM tether_forks
WHERE source_run_id = %(source)s
ORDER BY created_at, run_id;
