-- Named queries of the SQLite backend, one per statement; `-- name:` starts each.
-- Run columns are always selected in the order of RUN_COLUMNS in rows.py, approvals and audit
-- entries in that of APPROVAL_COLUMNS and AUDIT_COLUMNS in rows.py.

-- name: insert_run
-- Any unique key taken (the id, or the dedup key of an unfinished run of the queue) inserts
-- nothing: create_run tells the two apart, a schedule skips a slot's run whose key is held.
INSERT INTO tether_runs (id, workflow, status, args, owner, epoch, lease_expires_at,
                         deadline_at, parent_id, queue, priority, dedup_key, started_by,
                         started_at, created_at, updated_at, wake_at, version, trace_context)
VALUES (:id, :workflow, :status, :args, :owner, :epoch, :lease_expires_at,
        :deadline_at, :parent_id, :queue, :priority, :dedup_key, :started_by,
        :started_at, :now, :now, :wake_at, :version, :trace_context)
ON CONFLICT DO NOTHING;

-- name: get_run
SELECT {run_columns} FROM tether_runs WHERE id = :id;

-- name: list_runs
-- {where}: the runs_* fragments below of the filters given. Newest first, ties by id: the
-- order of the (..., created_at, id) indexes, read backwards, which serve each filter.
SELECT {run_columns} FROM tether_runs
WHERE {where}
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: runs_with_status
status = :status

-- name: runs_of_workflow
workflow = :workflow

-- name: runs_of_queue
queue = :queue

-- name: runs_of_version
version = :version

-- name: runs_started_by
started_by = :started_by

-- name: runs_created_from
created_at >= :created_after

-- name: runs_created_before
created_at < :created_before

-- name: runs_id_prefix
-- The ids that start with a prefix, as a range of the primary key (BINARY: code point order).
id >= :id_from AND id < :id_to

-- name: runs_id_from
id >= :id_from

-- name: runs_before
-- The keyset page: runs after (older than) the last one of the previous page.
(created_at, id) < (:before_at, :before_id)

-- name: store_stats
-- Rows (kind, label, count, extra), one statement, so one snapshot: runs by status (the status
-- index answers it); runs due to be claimed now by queue ('' outside queues: what a claim
-- would take, an expired lease's too); outbox messages not delivered by status, extra: how
-- many of them are in doubt; the pending approvals, extra: the oldest one's creation time.
SELECT 'runs', status, count(*), NULL FROM tether_runs GROUP BY status
UNION ALL
SELECT 'due', coalesce(queue, ''), count(*), NULL FROM tether_runs
WHERE (status = 'pending' AND (wake_at IS NULL OR wake_at <= :now))
   OR (status IN ('waiting', 'held') AND wake_at <= :now)
   OR (status = 'running' AND lease_expires_at < :now)
GROUP BY queue
UNION ALL
SELECT 'outbox', status, count(*), sum(CASE WHEN in_doubt <> 0 THEN 1 ELSE 0 END) FROM tether_outbox
WHERE status IN ('pending', 'sending', 'failed') GROUP BY status
UNION ALL
SELECT 'approvals', NULL, count(*), min(created_at) FROM tether_approvals WHERE status = 'pending';

-- name: claim_runs
-- Runs outside the queues that have limits. Highest priority first, then oldest.
-- Only runs of this worker's version, not pinned yet, or pinned to a version that has no live
-- worker (a heartbeat since live_since; NULL: none is taken over); each is pinned to it.
UPDATE tether_runs
SET owner = :worker, epoch = epoch + 1, status = 'running',
    lease_expires_at = :lease_until, wake_at = NULL, updated_at = :now,
    started_at = coalesce(started_at, :now), version = coalesce(:version, version)
WHERE id IN (
    SELECT id FROM tether_runs
    WHERE workflow IN (SELECT value FROM json_each(:workflows)) AND (queue IS NULL OR queue NOT IN (SELECT value FROM json_each(:limited)))
      AND ((status = 'pending' AND (wake_at IS NULL OR wake_at <= :now))
        OR (status IN ('waiting', 'held') AND wake_at <= :now)
        OR (status = 'running' AND lease_expires_at < :now))
      AND (:version IS NULL OR version IS NULL OR version = :version
           OR (:live_since IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= :live_since)))
    ORDER BY priority DESC, created_at, id
    LIMIT :limit
)
RETURNING {run_columns};

-- name: claim_queue
-- Runs of one queue with limits, up to the budget its limits leave.
UPDATE tether_runs
SET owner = :worker, epoch = epoch + 1, status = 'running',
    lease_expires_at = :lease_until, wake_at = NULL, updated_at = :now,
    started_at = coalesce(started_at, :now), version = coalesce(:version, version)
WHERE id IN (
    SELECT id FROM tether_runs
    WHERE workflow IN (SELECT value FROM json_each(:workflows)) AND queue = :queue
      AND ((status = 'pending' AND (wake_at IS NULL OR wake_at <= :now))
        OR (status IN ('waiting', 'held') AND wake_at <= :now)
        OR (status = 'running' AND lease_expires_at < :now))
      AND (:version IS NULL OR version IS NULL OR version = :version
           OR (:live_since IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= :live_since)))
    ORDER BY priority DESC, created_at, id
    LIMIT :limit
)
RETURNING {run_columns};

-- name: queue_load
-- What a queue's limits count: runs running with a live lease (all, and this worker's), and
-- first claims since `since`.
SELECT
    count(*) FILTER (WHERE status = 'running' AND lease_expires_at >= :now),
    count(*) FILTER (WHERE status = 'running' AND lease_expires_at >= :now
                           AND owner = :worker),
    count(*) FILTER (WHERE started_at >= :since)
FROM tether_runs WHERE queue = :queue;

-- name: next_wake_at
-- Runs pinned to another live version are not this worker's to wait for (a due one would
-- spin it).
SELECT min(t) FROM (
    SELECT min(wake_at) AS t FROM tether_runs
    WHERE status IN ('pending', 'waiting', 'held') AND wake_at IS NOT NULL
      AND workflow IN (SELECT value FROM json_each(:workflows))
      AND (:version IS NULL OR version IS NULL OR version = :version
           OR (:live_since IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= :live_since)))
    UNION ALL
    SELECT min(lease_expires_at) FROM tether_runs
    WHERE status = 'running' AND workflow IN (SELECT value FROM json_each(:workflows))
      AND (:version IS NULL OR version IS NULL OR version = :version
           OR (:live_since IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= :live_since))));

-- name: load_history
SELECT {checkpoint_columns} FROM tether_checkpoints WHERE run_id = :run_id ORDER BY seq;

-- name: load_histories
SELECT run_id, {checkpoint_columns} FROM tether_checkpoints
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) ORDER BY run_id, seq;

-- name: upsert_checkpoint
-- The hot path: fenced in the same statement (no row unless the lease is held), and bound by
-- position (?1..?15, rows.CHECKPOINT_PARAMS), which SQLite binds markedly faster than names.
INSERT OR REPLACE INTO tether_checkpoints
    (run_id, seq, name, kind, status, result, error, attempts, started_at, finished_at, retry_at,
     position, args)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?14, ?15
WHERE EXISTS (SELECT 1 FROM tether_runs WHERE id = ?1 AND status = 'running'
                                         AND owner = ?12 AND epoch = ?13);

-- name: suspend_run
-- An event already in the mailbox for a key it waits on, or a cancel request that came while
-- the run was held, makes the run due at once.
UPDATE tether_runs
SET status = 'waiting', owner = NULL, lease_expires_at = NULL, wake_on = :wake_on,
    wake_at = CASE WHEN cancel_requested OR EXISTS (
        SELECT 1 FROM tether_events
        WHERE run_id = :run_id AND consumed_by IS NULL
          AND key IN (SELECT value FROM json_each(:wake_on)))
        THEN :now ELSE :wake_at END,
    updated_at = :now, failures = 0, error = NULL
WHERE id = :run_id AND status = 'running' AND owner = :worker AND epoch = :epoch;

-- name: finish_alone
-- Nothing: a run's end is one transaction of the single writer, whatever it has to do.

-- name: finish_alone_carrying
-- Nothing, as finish_alone.

-- name: finish_run
UPDATE tether_runs
SET status = :status, result = :result, error = :error, owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, wake_on = NULL, cancel_requested = 0, finished_at = :now, updated_at = :now,
    failures = coalesce(:failures, failures)
WHERE id = :run_id AND status = 'running' AND owner = :worker AND epoch = :epoch
RETURNING parent_id, queue;

-- name: fail_execution
-- An execution failed outside the workflow's code: the run waits until :retry_at.
UPDATE tether_runs
SET status = 'waiting', error = :error, failures = :failures, owner = NULL,
    lease_expires_at = NULL, wake_at = :retry_at, wake_on = NULL, updated_at = :now
WHERE id = :run_id AND status = 'running' AND owner = :worker AND epoch = :epoch;

-- name: hold_run
-- Replay diverged: the run is held, unfinished, until wake_at (then tried again).
UPDATE tether_runs
SET status = 'held', error = :error, failures = :failures, owner = NULL,
    lease_expires_at = NULL, wake_at = :wake_at, wake_on = NULL, updated_at = :now
WHERE id = :run_id AND status = 'running' AND owner = :worker AND epoch = :epoch;

-- name: wake_held
UPDATE tether_runs SET wake_at = :now, updated_at = :now
WHERE status = 'held' AND (wake_at IS NULL OR wake_at > :now)
  AND workflow IN (SELECT value FROM json_each(:workflows));

-- name: live_workflows
-- What the workers that heartbeated since :since serve (NULL: an older worker, unknown).
SELECT workflows FROM tether_workers WHERE heartbeat_at >= :since;

-- name: unserved_runs
-- Runs claimable since before :since whose workflow is not among :served.
SELECT id, workflow, parent_id FROM tether_runs
WHERE ((status = 'pending' AND coalesce(wake_at, updated_at) < :since)
    OR (status = 'waiting' AND wake_at < :since)
    OR (status = 'running' AND lease_expires_at < :since))
  AND workflow NOT IN (SELECT value FROM json_each(:served))
ORDER BY id;

-- name: bury_run
-- A run nobody holds ends dead (see unserved_runs).
UPDATE tether_runs
SET status = 'dead', error = :error, owner = NULL, lease_expires_at = NULL, wake_at = NULL,
    wake_on = NULL, cancel_requested = 0, finished_at = :now, updated_at = :now
WHERE id = :id;

-- name: extend_leases
-- The leases given (ids and epochs, two JSON arrays alike) that the worker still holds,
-- extended in one statement (the write lock is the file's: no row is ever skipped here).
UPDATE tether_runs SET lease_expires_at = :lease_until
WHERE status = 'running' AND owner = :worker
  AND (id, epoch) IN (SELECT i.value, e.value FROM json_each(:ids) i
                      JOIN json_each(:epochs) e ON e.key = i.key)
RETURNING id, cancel_requested;

-- name: leases_held
SELECT id, cancel_requested FROM tether_runs
WHERE status = 'running' AND owner = :worker
  AND (id, epoch) IN (SELECT i.value, e.value FROM json_each(:ids) i
                      JOIN json_each(:epochs) e ON e.key = i.key);

-- name: cancel_unowned
UPDATE tether_runs
SET status = 'cancelled', error = :error, owner = NULL, lease_expires_at = NULL, wake_at = NULL,
    wake_on = NULL, cancel_requested = 0, finished_at = :now, updated_at = :now
WHERE id = :id AND status IN ('pending', 'waiting', 'held')
RETURNING parent_id;

-- name: cancel_owned
UPDATE tether_runs SET cancel_requested = 1, updated_at = :now
WHERE id = :id AND status = 'running';

-- name: upsert_worker
INSERT INTO tether_workers (id, host, pid, pid_token, started_at, heartbeat_at, workflows,
                            boot_id, pid_ns, version)
VALUES (:id, :host, :pid, :pid_token, :now, :now, :workflows,
        :boot_id, :pid_ns, :version)
ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
    pid_token = excluded.pid_token, heartbeat_at = excluded.heartbeat_at,
    workflows = excluded.workflows, boot_id = excluded.boot_id, pid_ns = excluded.pid_ns,
    version = excluded.version;

-- name: touch_worker
UPDATE tether_workers SET heartbeat_at = :now WHERE id = :id;

-- name: list_workers
SELECT id, host, pid, pid_token, started_at, heartbeat_at, workflows, boot_id, pid_ns, version
FROM tether_workers
WHERE (:host IS NULL OR host = :host) ORDER BY id;

-- name: release_worker_runs
UPDATE tether_runs
SET status = 'pending', owner = NULL, lease_expires_at = NULL, wake_at = NULL, updated_at = :now
WHERE owner = :id AND status = 'running'
RETURNING id;

-- name: delete_worker
DELETE FROM tether_workers WHERE id = :id;

-- name: move_version
-- Pin an unfinished run to another version (NULL: unpinned, the next claim pins it).
UPDATE tether_runs SET version = :version, updated_at = :now
WHERE id = :id AND status IN ('pending', 'running', 'waiting', 'held')
RETURNING {run_columns};

-- name: version_counts
-- Unfinished runs by the version they are pinned to (the status index finds them).
SELECT version, count(*) FROM tether_runs
WHERE status IN ('pending', 'running', 'waiting', 'held')
GROUP BY version ORDER BY version;

-- name: children
SELECT id FROM tether_runs
WHERE parent_id = :id AND status NOT IN ('succeeded', 'failed', 'cancelled', 'dead');

-- name: insert_event
INSERT INTO tether_events (run_id, key, payload, created_at)
VALUES (:run_id, :key, :payload, :now);

-- name: wake_for_event
UPDATE tether_runs SET wake_at = :now, updated_at = :now
WHERE id = :run_id AND status = 'waiting'
  AND :key IN (SELECT value FROM json_each(wake_on));

-- name: oldest_event
SELECT id, key, payload FROM tether_events
WHERE run_id = :run_id AND consumed_by IS NULL
  AND key IN (SELECT value FROM json_each(:keys))
ORDER BY id LIMIT 1;

-- name: consume_event
UPDATE tether_events SET consumed_by = :by, consumed_at = :now WHERE id = :id;

-- name: events_after
SELECT id, run_id, key FROM tether_events WHERE id > :after ORDER BY id LIMIT :limit;

-- name: last_event_id
SELECT coalesce(max(id), 0) FROM tether_events;

-- name: lease_held
SELECT 1 FROM tether_runs
WHERE id = :run_id AND status = 'running' AND owner = :worker AND epoch = :epoch;

-- name: dedup_holder
SELECT id FROM tether_runs
WHERE coalesce(queue, '') = coalesce(:queue, '') AND dedup_key = :dedup_key
  AND status IN ('pending', 'running', 'waiting', 'held');

-- name: insert_approval
INSERT INTO tether_approvals (id, run_id, step, status, created_at, expires_at, updated_at,
                              audit_count, audit_head, body)
VALUES (:id, :run_id, :step, :status, :created_at, :expires_at, :updated_at,
        :audit_count, :audit_head, :body)
ON CONFLICT (id) DO NOTHING;

-- name: update_approval
-- Every column but the id: the row becomes exactly the record the change asked for.
UPDATE tether_approvals
SET run_id = :run_id, step = :step, status = :status, created_at = :created_at,
    expires_at = :expires_at, updated_at = :updated_at, audit_count = :audit_count,
    audit_head = :audit_head, body = :body
WHERE id = :id;

-- name: get_approval
SELECT {approval_columns} FROM tether_approvals WHERE id = :id;

-- name: list_approvals
SELECT {approval_columns} FROM tether_approvals
WHERE (:status IS NULL OR status = :status) AND (:run_id IS NULL OR run_id = :run_id)
ORDER BY created_at, id
LIMIT :limit;

-- name: reviewer_approvals
-- The approvals a reviewer may decide, filtered here and not after a LIMIT: `reviewers` (a JSON
-- list inside `body`) holds one of :eligible (their name, "*", "group:<g>"), and separation of
-- duties does not shut them out. Keyset-paged by (created_at, id), oldest first.
SELECT {approval_columns} FROM tether_approvals
WHERE (:status IS NULL OR status = :status) AND (:run_id IS NULL OR run_id = :run_id)
  AND (created_at > :after_at OR (created_at = :after_at AND id > :after_id))
  AND EXISTS (SELECT 1 FROM json_each(json_extract(body, '$.reviewers')) AS r
              WHERE r.value IN (SELECT value FROM json_each(:eligible)))
  AND NOT (coalesce(json_extract(body, '$.separate_duties'), 0) = 1
           AND coalesce(json_extract(body, '$.starter') = :viewer, 1))
ORDER BY created_at, id
LIMIT :limit;

-- name: pending_approvals
SELECT {approval_columns} FROM tether_approvals
WHERE run_id = :run_id AND status = 'pending'
ORDER BY created_at, id;

-- name: approval_steps
-- The checkpoints recording that a run created an approval (flow.approval, kind 'approval'),
-- keyset-paged: verify finds approvals deleted with their trail from them.
SELECT run_id, seq, name FROM tether_checkpoints
WHERE kind = 'approval' AND (run_id, seq) > (:after_run, :after_seq)
ORDER BY run_id, seq LIMIT :limit;

-- name: insert_secret
-- The first value offered wins; later ones (another process racing) are dropped.
INSERT INTO tether_secrets (name, value, created_at) VALUES (:name, :value, :now)
ON CONFLICT (name) DO NOTHING;

-- name: get_secret
SELECT value FROM tether_secrets WHERE name = :name;

-- name: insert_audit
INSERT INTO tether_approval_audit ({audit_columns})
VALUES (:approval_id, :seq, :at, :event, :actor, :detail, :prev_hash, :hash);

-- name: approval_audit
SELECT {audit_columns} FROM tether_approval_audit WHERE approval_id = :id ORDER BY seq;

-- name: lock_run_status
-- SQLite's write lock, held from a write transaction's first statement, serializes writers: the
-- lock_ queries are plain reads here (PostgreSQL locks the rows).
SELECT status FROM tether_runs WHERE id = :id;

-- name: lock_approval
SELECT {approval_columns} FROM tether_approvals WHERE id = :id;

-- name: approval_run
SELECT run_id FROM tether_approvals WHERE id = :id;

-- name: lock_run
-- Nothing to lock (see lock_run_status).

-- name: lock_queue
-- Claims are serialized by the write lock already.

-- name: notify
-- Workers on SQLite see commits through PRAGMA data_version: nothing to send.

-- name: lease_state
SELECT owner, epoch, status FROM tether_runs WHERE id = :run_id;

-- name: put_user
INSERT INTO tether_users (name, groups, token_hash, created_at, revoked_at)
VALUES (:name, :groups, :token_hash, :created_at, :revoked_at)
ON CONFLICT (name) DO UPDATE SET groups = excluded.groups, token_hash = excluded.token_hash,
    created_at = excluded.created_at, revoked_at = excluded.revoked_at;

-- name: get_user
SELECT name, groups, token_hash, created_at, revoked_at FROM tether_users WHERE name = :name;

-- name: user_by_token
SELECT name, groups, token_hash, created_at, revoked_at FROM tether_users
WHERE token_hash = :token_hash;

-- name: list_users
SELECT name, groups, token_hash, created_at, revoked_at FROM tether_users ORDER BY name;

-- name: revoke_user
UPDATE tether_users SET revoked_at = coalesce(revoked_at, :now) WHERE name = :name
RETURNING name, groups, token_hash, created_at, revoked_at;

-- name: lock_stream
-- The stream's next offset; the write lock makes appenders take turns.
SELECT coalesce(max("offset") + 1, 0) FROM tether_stream_entries
WHERE run_id = :run_id AND key = :key;

-- name: stream_refs
SELECT ref, "offset" FROM tether_stream_entries
WHERE run_id = :run_id AND key = :key AND ref IN (SELECT value FROM json_each(:refs));

-- name: insert_stream_entries
-- Bound by position (?1..?9): a batch of a step's chunks inserts hundreds of rows at once.
INSERT INTO tether_stream_entries (run_id, key, "offset", kind, data, writer, attempt, ref,
                                   created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9);

-- name: set_stream_next
-- No counter row to move: the next offset is read from the entries (see lock_stream).

-- name: read_stream
SELECT "offset", kind, data, writer, attempt, ref, created_at FROM tether_stream_entries
WHERE run_id = :run_id AND key = :key AND "offset" >= :offset
ORDER BY "offset" LIMIT :limit;

-- name: stream_writer_entries
SELECT "offset", kind, data, writer, attempt, ref, created_at FROM tether_stream_entries
WHERE run_id = :run_id AND key = :key AND writer = :writer
ORDER BY "offset";

-- name: resume_checkpoints
UPDATE tether_checkpoints SET status = 'retrying', retry_at = :now
WHERE run_id = :id AND status = 'failed'
  AND coalesce(position, CAST(seq AS TEXT)) = :retry;

-- name: resume_run
-- Resumed after a fix, which is new code: unpinned, the next claim pins it to its version.
UPDATE tether_runs
SET status = 'pending', result = NULL, error = NULL, owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, wake_on = NULL, cancel_requested = 0, finished_at = NULL, updated_at = :now,
    failures = 0, deadline_at = :deadline_at, version = NULL
WHERE id = :id AND status IN ('failed', 'dead', 'held');
