-- Named queries of published values and fork links (SQLite); the tables are in 0010_values.sql.

-- name: value_lease_held
SELECT 1 FROM tether_runs
WHERE id = :run_id AND status = 'running' AND owner = :worker AND epoch = :epoch;

-- name: next_value_version
SELECT coalesce(max(version), 0) + 1 FROM tether_values WHERE run_id = :run_id AND key = :key;

-- name: insert_value
INSERT INTO tether_values (run_id, key, version, value, seq, created_at)
VALUES (:run_id, :key, :version, :value, :seq, :now);

-- name: put_checkpoint
-- Not fenced here: set_value checks the lease first in its transaction, and fork_run writes
-- the history of the run it has just created.
INSERT OR REPLACE INTO tether_checkpoints
    (run_id, seq, name, kind, status, result, error, attempts, started_at, finished_at, retry_at,
     position, args)
VALUES (:run_id, :seq, :name, :kind, :status, :result, :error, :attempts, :started_at,
        :finished_at, :retry_at, :position, :args);

-- name: latest_value
SELECT run_id, key, version, value, seq, created_at FROM tether_values
WHERE run_id = :run_id AND key = :key
ORDER BY version DESC LIMIT 1;

-- name: latest_values
SELECT v.run_id, v.key, v.version, v.value, v.seq, v.created_at FROM tether_values AS v
WHERE v.run_id = :run_id AND v.version = (
    SELECT max(w.version) FROM tether_values AS w WHERE w.run_id = v.run_id AND w.key = v.key)
ORDER BY v.key;

-- name: fork_insert_run
INSERT INTO tether_runs (id, workflow, status, args, epoch, deadline_at, parent_id, queue,
                         priority, started_by, created_at, updated_at)
VALUES (:id, :workflow, 'pending', :args, 0, :deadline_at, :parent_id, :queue,
        :priority, :started_by, :now, :now)
ON CONFLICT (id) DO NOTHING;

-- name: fork_values
-- The versions the copied checkpoints set (by their positions, a JSON list).
INSERT INTO tether_values (run_id, key, version, value, seq, created_at)
SELECT :run_id, v.key, v.version, v.value, v.seq, v.created_at FROM tether_values AS v
WHERE v.run_id = :source AND v.seq IN (SELECT j.value FROM json_each(:seqs) AS j);

-- name: fork_events
-- The source's events that no copied checkpoint (by name, a JSON list) consumed, in order.
INSERT INTO tether_events (run_id, key, payload, created_at)
SELECT :run_id, e.key, e.payload, e.created_at FROM tether_events AS e
WHERE e.run_id = :source AND substr(e.key, 1, 7) <> 'tether:'
  AND (e.consumed_by IS NULL
       OR e.consumed_by NOT IN (SELECT j.value FROM json_each(:names) AS j))
ORDER BY e.id;

-- name: fork_event
INSERT INTO tether_events (run_id, key, payload, created_at)
VALUES (:run_id, :key, :payload, :now);

-- name: insert_fork
INSERT INTO tether_forks (run_id, source_run_id, from_step, from_seq, created_at)
VALUES (:run_id, :source_run_id, :from_step, :from_seq, :created_at);

-- name: get_fork
SELECT run_id, source_run_id, from_step, from_seq, created_at FROM tether_forks
WHERE run_id = :run_id;

-- name: list_forks
SELECT run_id, source_run_id, from_step, from_seq, created_at FROM tether_forks
WHERE source_run_id = :source
ORDER BY created_at, run_id;
