-- Named queries of the PostgreSQL backend, one per statement; `-- name:` starts each.
-- Run columns are always selected in the order of RUN_COLUMNS in rows.py (shared), approvals
-- and audit entries in that of APPROVAL_COLUMNS and AUDIT_COLUMNS in rows.py.

-- name: insert_run
-- Any unique key taken (the id, or the dedup key of an unfinished run of the queue) inserts
-- nothing: create_run tells the two apart, a schedule skips a slot's run whose key is held.
INSERT INTO tether_runs (id, workflow, status, args, owner, epoch, lease_expires_at,
                         deadline_at, parent_id, queue, priority, dedup_key, started_by,
                         started_at, created_at, updated_at, wake_at, version, trace_context)
VALUES (%(id)s, %(workflow)s, %(status)s, %(args)s, %(owner)s, %(epoch)s, %(lease_expires_at)s,
        %(deadline_at)s, %(parent_id)s, %(queue)s, %(priority)s, %(dedup_key)s, %(started_by)s,
        %(started_at)s, %(now)s, %(now)s, %(wake_at)s, %(version)s, %(trace_context)s)
ON CONFLICT DO NOTHING;

-- name: get_run
SELECT {run_columns} FROM tether_runs WHERE id = %(id)s;

-- name: list_runs
-- {where}: the runs_* fragments below of the filters given. Newest first, ties by id in code
-- point order (COLLATE "C", as SQLite's and Python's, whatever the database's collation): the
-- order of the (..., created_at, id COLLATE "C") indexes, read backwards, which serve each filter.
SELECT {run_columns} FROM tether_runs
WHERE {where}
ORDER BY created_at DESC, id COLLATE "C" DESC
LIMIT %(limit)s;

-- name: runs_with_status
status = %(status)s

-- name: runs_of_workflow
workflow = %(workflow)s

-- name: runs_of_queue
queue = %(queue)s

-- name: runs_of_version
version = %(version)s

-- name: runs_started_by
started_by = %(started_by)s

-- name: runs_created_from
created_at >= %(created_after)s

-- name: runs_created_before
created_at < %(created_before)s

-- name: runs_id_prefix
-- The ids that start with a prefix, as a range of tether_runs_id_text (code point order).
id COLLATE "C" >= %(id_from)s AND id COLLATE "C" < %(id_to)s

-- name: runs_id_from
id COLLATE "C" >= %(id_from)s

-- name: runs_before
-- The keyset page: runs after (older than) the last one of the previous page.
(created_at, id COLLATE "C") < (%(before_at)s, %(before_id)s)

-- name: store_stats
-- Rows (kind, label, count, extra), one statement, so one snapshot: runs by status (the status
-- index answers it); runs due to be claimed now by queue ('' outside queues: what a claim
-- would take, an expired lease's too); outbox messages not delivered by status, extra: how
-- many of them are in doubt; the pending approvals, extra: the oldest one's creation time.
SELECT 'runs', status, count(*), NULL::double precision FROM tether_runs GROUP BY status
UNION ALL
SELECT 'due', coalesce(queue, ''), count(*), NULL FROM tether_runs
WHERE (status = 'pending' AND (wake_at IS NULL OR wake_at <= %(now)s))
   OR (status IN ('waiting', 'held') AND wake_at <= %(now)s)
   OR (status = 'running' AND lease_expires_at < %(now)s)
GROUP BY queue
UNION ALL
SELECT 'outbox', status, count(*), sum(CASE WHEN in_doubt THEN 1 ELSE 0 END) FROM tether_outbox
WHERE status IN ('pending', 'sending', 'failed') GROUP BY status
UNION ALL
SELECT 'approvals', NULL, count(*), min(created_at) FROM tether_approvals WHERE status = 'pending';

-- name: claim_runs
-- Runs outside the queues that have limits. Highest priority first, then oldest.
-- Only runs of this worker's version, not pinned yet, or pinned to a version that has no live
-- worker (a heartbeat since live_since; NULL: none is taken over); each is pinned to it.
UPDATE tether_runs
SET owner = %(worker)s, epoch = epoch + 1, status = 'running',
    lease_expires_at = %(lease_until)s, wake_at = NULL, updated_at = %(now)s,
    started_at = coalesce(started_at, %(now)s), version = coalesce(%(version)s, version)
WHERE id IN (
    SELECT id FROM tether_runs
    WHERE workflow = ANY(%(workflows)s) AND (queue IS NULL OR NOT (queue = ANY(%(limited)s)))
      AND ((status = 'pending' AND (wake_at IS NULL OR wake_at <= %(now)s))
        OR (status IN ('waiting', 'held') AND wake_at <= %(now)s)
        OR (status = 'running' AND lease_expires_at < %(now)s))
      AND (%(version)s::text IS NULL OR version IS NULL OR version = %(version)s
           OR (%(live_since)s::double precision IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= %(live_since)s)))
    ORDER BY priority DESC, created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING {run_columns};

-- name: claim_queue
-- Runs of one queue with limits, up to the budget its limits leave.
UPDATE tether_runs
SET owner = %(worker)s, epoch = epoch + 1, status = 'running',
    lease_expires_at = %(lease_until)s, wake_at = NULL, updated_at = %(now)s,
    started_at = coalesce(started_at, %(now)s), version = coalesce(%(version)s, version)
WHERE id IN (
    SELECT id FROM tether_runs
    WHERE workflow = ANY(%(workflows)s) AND queue = %(queue)s
      AND ((status = 'pending' AND (wake_at IS NULL OR wake_at <= %(now)s))
        OR (status IN ('waiting', 'held') AND wake_at <= %(now)s)
        OR (status = 'running' AND lease_expires_at < %(now)s))
      AND (%(version)s::text IS NULL OR version IS NULL OR version = %(version)s
           OR (%(live_since)s::double precision IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= %(live_since)s)))
    ORDER BY priority DESC, created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING {run_columns};

-- name: queue_load
-- What a queue's limits count: runs running with a live lease (all, and this worker's), and
-- first claims since `since`.
SELECT
    count(*) FILTER (WHERE status = 'running' AND lease_expires_at >= %(now)s),
    count(*) FILTER (WHERE status = 'running' AND lease_expires_at >= %(now)s
                           AND owner = %(worker)s),
    count(*) FILTER (WHERE started_at >= %(since)s)
FROM tether_runs WHERE queue = %(queue)s;

-- name: next_wake_at
-- Runs pinned to another live version are not this worker's to wait for (a due one would
-- spin it).
SELECT min(t) FROM (
    SELECT min(wake_at) AS t FROM tether_runs
    WHERE status IN ('pending', 'waiting', 'held') AND wake_at IS NOT NULL
      AND workflow = ANY(%(workflows)s)
      AND (%(version)s::text IS NULL OR version IS NULL OR version = %(version)s
           OR (%(live_since)s::double precision IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= %(live_since)s)))
    UNION ALL
    SELECT min(lease_expires_at) FROM tether_runs
    WHERE status = 'running' AND workflow = ANY(%(workflows)s)
      AND (%(version)s::text IS NULL OR version IS NULL OR version = %(version)s
           OR (%(live_since)s::double precision IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tether_workers w WHERE w.version = tether_runs.version
                 AND w.heartbeat_at >= %(live_since)s)))) AS due;

-- name: lease_held
SELECT 1 FROM tether_runs
WHERE id = %(run_id)s AND status = 'running' AND owner = %(worker)s AND epoch = %(epoch)s
FOR UPDATE;

-- name: load_history
SELECT {checkpoint_columns} FROM tether_checkpoints WHERE run_id = %(run_id)s ORDER BY seq;

-- name: load_histories
SELECT run_id, {checkpoint_columns} FROM tether_checkpoints
WHERE run_id = ANY(%(run_ids)s::text[]) ORDER BY run_id, seq;

-- name: upsert_checkpoint
-- The hot path: fenced in the same statement (no row unless the lease is held; the run's row is
-- share-locked, so a claim that would move it waits for this commit and one that moved it first
-- makes this insert nothing), bound by position in rows.CHECKPOINT_PARAMS order. Its ON
-- CONFLICT list is finish_alone_carrying's: keep them one.
WITH c (run_id, seq, name, kind, status, result, error, attempts, started_at, finished_at,
        retry_at, worker, epoch, position, args) AS (
    VALUES (%s::text, %s::integer, %s::text, %s::text, %s::text, %s::text, %s::text,
            %s::integer, %s::double precision, %s::double precision, %s::double precision,
            %s::text, %s::integer, %s::text, %s::text))
INSERT INTO tether_checkpoints
    (run_id, seq, name, kind, status, result, error, attempts, started_at, finished_at, retry_at,
     position, args)
SELECT c.run_id, c.seq, c.name, c.kind, c.status, c.result, c.error, c.attempts, c.started_at,
       c.finished_at, c.retry_at, c.position, c.args
FROM c
WHERE EXISTS (SELECT 1 FROM tether_runs r
              WHERE r.id = c.run_id AND r.status = 'running' AND r.owner = c.worker
                AND r.epoch = c.epoch
              FOR SHARE OF r)
ON CONFLICT (run_id, seq) DO UPDATE SET
    name = excluded.name, kind = excluded.kind, status = excluded.status,
    result = excluded.result, error = excluded.error, attempts = excluded.attempts,
    started_at = excluded.started_at, finished_at = excluded.finished_at,
    retry_at = excluded.retry_at, position = excluded.position, args = excluded.args;

-- name: suspend_run
UPDATE tether_runs
SET status = 'waiting', owner = NULL, lease_expires_at = NULL, wake_on = %(wake_on)s,
    wake_at = CASE WHEN cancel_requested OR EXISTS (
        SELECT 1 FROM tether_events
        WHERE run_id = %(run_id)s AND consumed_by IS NULL
          AND key = ANY(%(wake_on_keys)s))
        THEN %(now)s ELSE %(wake_at)s END,
    updated_at = %(now)s, failures = 0, error = NULL
WHERE id = %(run_id)s AND status = 'running' AND owner = %(worker)s AND epoch = %(epoch)s;

-- name: finish_alone
-- A run's whole end when it has no parent and no pending approval, else nothing (FALSE): see
-- tether_finish_alone in 0020_finish.sql.
SELECT tether_finish_alone(%(run_id)s, %(worker)s, %(epoch)s, %(status)s, %(result)s,
                           %(error)s, %(now)s, %(failures)s::integer);

-- name: finish_alone_carrying
-- finish_alone with the checkpoints the execution completed last, in the same one statement,
-- as one JSON array of rows (rows.carried_rows): written only once the function ended the run
-- (it holds the run's row, locked under the lease), so an answer FALSE changes nothing at all,
-- and the full end writes them in its transaction. Its ON CONFLICT list is upsert_checkpoint's:
-- keep them one.
WITH f AS (
    SELECT tether_finish_alone(%(run_id)s, %(worker)s, %(epoch)s, %(status)s, %(result)s,
                               %(error)s, %(now)s, %(failures)s::integer) AS done
), c AS (
    INSERT INTO tether_checkpoints
        (run_id, seq, name, kind, status, result, error, attempts, started_at, finished_at,
         retry_at, position, args)
    SELECT %(run_id)s, u.seq, u.name, u.kind, u.status, u.result, u.error, u.attempts,
           u.started_at, u.finished_at, u.retry_at, u.position, u.args
    FROM json_to_recordset(%(carried)s::json)
        AS u (seq integer, name text, kind text, status text, result text, error text,
              attempts integer, started_at double precision, finished_at double precision,
              retry_at double precision, position text, args text)
    WHERE (SELECT done FROM f)
    ON CONFLICT (run_id, seq) DO UPDATE SET
        name = excluded.name, kind = excluded.kind, status = excluded.status,
        result = excluded.result, error = excluded.error, attempts = excluded.attempts,
        started_at = excluded.started_at, finished_at = excluded.finished_at,
        retry_at = excluded.retry_at, position = excluded.position, args = excluded.args)
SELECT done FROM f;

-- name: finish_run
-- Its SET list is tether_finish_alone's (0020_finish.sql): keep them one.
UPDATE tether_runs
SET status = %(status)s, result = %(result)s, error = %(error)s, owner = NULL,
    lease_expires_at = NULL, wake_at = NULL, wake_on = NULL, cancel_requested = FALSE,
    finished_at = %(now)s, updated_at = %(now)s,
    failures = coalesce(%(failures)s::integer, failures)
WHERE id = %(run_id)s AND status = 'running' AND owner = %(worker)s AND epoch = %(epoch)s
RETURNING parent_id, queue;

-- name: fail_execution
-- An execution failed outside the workflow's code: the run waits until retry_at.
UPDATE tether_runs
SET status = 'waiting', error = %(error)s, failures = %(failures)s, owner = NULL,
    lease_expires_at = NULL, wake_at = %(retry_at)s, wake_on = NULL, updated_at = %(now)s
WHERE id = %(run_id)s AND status = 'running' AND owner = %(worker)s AND epoch = %(epoch)s;

-- name: hold_run
-- Replay diverged: the run is held, unfinished, until wake_at (then tried again).
UPDATE tether_runs
SET status = 'held', error = %(error)s, failures = %(failures)s, owner = NULL,
    lease_expires_at = NULL, wake_at = %(wake_at)s, wake_on = NULL, updated_at = %(now)s
WHERE id = %(run_id)s AND status = 'running' AND owner = %(worker)s AND epoch = %(epoch)s;

-- name: wake_held
UPDATE tether_runs SET wake_at = %(now)s, updated_at = %(now)s
WHERE status = 'held' AND (wake_at IS NULL OR wake_at > %(now)s)
  AND workflow = ANY(%(workflows)s);

-- name: database_time
SELECT extract(epoch FROM clock_timestamp())::double precision;

-- name: live_workflows
-- What the workers that heartbeated since `since` serve (NULL: an older worker, unknown).
SELECT workflows FROM tether_workers WHERE heartbeat_at >= %(since)s;

-- name: unserved_runs
-- Runs claimable since before `since` whose workflow is not among `served`; rows a claim
-- holds are skipped (that claim decides them).
SELECT id, workflow, parent_id FROM tether_runs
WHERE ((status = 'pending' AND coalesce(wake_at, updated_at) < %(since)s)
    OR (status = 'waiting' AND wake_at < %(since)s)
    OR (status = 'running' AND lease_expires_at < %(since)s))
  AND NOT (workflow = ANY(%(served)s))
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: bury_run
-- A run nobody holds ends dead (see unserved_runs).
UPDATE tether_runs
SET status = 'dead', error = %(error)s, owner = NULL, lease_expires_at = NULL, wake_at = NULL,
    wake_on = NULL, cancel_requested = FALSE, finished_at = %(now)s, updated_at = %(now)s
WHERE id = %(id)s;

-- name: extend_leases
-- The leases given (ids and epochs, two arrays alike) that the worker still holds, extended in
-- one statement. A row another transaction holds locked is skipped, never waited for: a wait
-- with the rows extended so far locked could deadlock with that transaction (a commit of the
-- worker's checkpoints and ends); leases_held tells a skipped lease from a lost one.
WITH held AS (
    SELECT r.id FROM tether_runs r
    JOIN unnest(%(ids)s::text[], %(epochs)s::integer[]) AS l (id, epoch)
      ON r.id = l.id AND r.epoch = l.epoch
    WHERE r.status = 'running' AND r.owner = %(worker)s
    FOR NO KEY UPDATE OF r SKIP LOCKED)
UPDATE tether_runs r SET lease_expires_at = %(lease_until)s
FROM held WHERE r.id = held.id
RETURNING r.id, r.cancel_requested;

-- name: leases_held
-- Of these leases, those the worker holds, as last committed (no lock taken).
SELECT r.id, r.cancel_requested FROM tether_runs r
JOIN unnest(%(ids)s::text[], %(epochs)s::integer[]) AS l (id, epoch)
  ON r.id = l.id AND r.epoch = l.epoch
WHERE r.status = 'running' AND r.owner = %(worker)s;

-- name: cancel_unowned
UPDATE tether_runs
SET status = 'cancelled', error = %(error)s, owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, wake_on = NULL, cancel_requested = FALSE, finished_at = %(now)s,
    updated_at = %(now)s
WHERE id = %(id)s AND status IN ('pending', 'waiting', 'held')
RETURNING parent_id;

-- name: cancel_owned
UPDATE tether_runs SET cancel_requested = TRUE, updated_at = %(now)s
WHERE id = %(id)s AND status = 'running';

-- name: children
SELECT id FROM tether_runs
WHERE parent_id = %(id)s AND status NOT IN ('succeeded', 'failed', 'cancelled', 'dead');

-- name: upsert_worker
INSERT INTO tether_workers (id, host, pid, pid_token, started_at, heartbeat_at, workflows,
                            boot_id, pid_ns, version)
VALUES (%(id)s, %(host)s, %(pid)s, %(pid_token)s, %(now)s, %(now)s, %(workflows)s,
        %(boot_id)s, %(pid_ns)s, %(version)s)
ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
    pid_token = excluded.pid_token, heartbeat_at = excluded.heartbeat_at,
    workflows = excluded.workflows, boot_id = excluded.boot_id, pid_ns = excluded.pid_ns,
    version = excluded.version;

-- name: touch_worker
UPDATE tether_workers SET heartbeat_at = %(now)s WHERE id = %(id)s;

-- name: list_workers
SELECT id, host, pid, pid_token, started_at, heartbeat_at, workflows, boot_id, pid_ns, version
FROM tether_workers
WHERE (%(host)s::text IS NULL OR host = %(host)s) ORDER BY id;

-- name: release_worker_runs
UPDATE tether_runs
SET status = 'pending', owner = NULL, lease_expires_at = NULL, wake_at = NULL,
    updated_at = %(now)s
WHERE owner = %(id)s AND status = 'running'
RETURNING id;

-- name: delete_worker
DELETE FROM tether_workers WHERE id = %(id)s;

-- name: move_version
-- Pin an unfinished run to another version (NULL: unpinned, the next claim pins it).
UPDATE tether_runs SET version = %(version)s, updated_at = %(now)s
WHERE id = %(id)s AND status IN ('pending', 'running', 'waiting', 'held')
RETURNING {run_columns};

-- name: version_counts
-- Unfinished runs by the version they are pinned to (the status index finds them).
SELECT version, count(*) FROM tether_runs
WHERE status IN ('pending', 'running', 'waiting', 'held')
GROUP BY version ORDER BY version;

-- name: lock_run
-- Taken before an event is delivered to the run and before the run suspends, so the two are
-- serialized: one that suspends sees an event delivered just before (its UPDATE, a later
-- statement, has a later snapshot), and a delivery just after sees the run waiting.
SELECT 1 FROM tether_runs WHERE id = %(run_id)s FOR UPDATE;

-- name: insert_event
INSERT INTO tether_events (run_id, key, payload, created_at)
VALUES (%(run_id)s, %(key)s, %(payload)s, %(now)s);

-- name: wake_for_event
UPDATE tether_runs SET wake_at = %(now)s, updated_at = %(now)s
WHERE id = %(run_id)s AND status = 'waiting' AND wake_on IS NOT NULL
  AND wake_on::jsonb ? %(key)s;

-- name: oldest_event
SELECT id, key, payload FROM tether_events
WHERE run_id = %(run_id)s AND consumed_by IS NULL AND key = ANY(%(keys)s)
ORDER BY id LIMIT 1;

-- name: consume_event
UPDATE tether_events SET consumed_by = %(by)s, consumed_at = %(now)s WHERE id = %(id)s;

-- name: events_after
SELECT id, run_id, key FROM tether_events WHERE id > %(after)s ORDER BY id LIMIT %(limit)s;

-- name: last_event_id
SELECT coalesce(max(id), 0) FROM tether_events;

-- name: dedup_holder
SELECT id FROM tether_runs
WHERE coalesce(queue, '') = coalesce(%(queue)s, '') AND dedup_key = %(dedup_key)s
  AND status IN ('pending', 'running', 'waiting', 'held');

-- name: insert_approval
INSERT INTO tether_approvals (id, run_id, step, status, created_at, expires_at, updated_at,
                              audit_count, audit_head, body)
VALUES (%(id)s, %(run_id)s, %(step)s, %(status)s, %(created_at)s, %(expires_at)s,
        %(updated_at)s, %(audit_count)s, %(audit_head)s, %(body)s)
ON CONFLICT (id) DO NOTHING;

-- name: update_approval
-- Every column but the id: the row becomes exactly the record the change asked for.
UPDATE tether_approvals
SET run_id = %(run_id)s, step = %(step)s, status = %(status)s, created_at = %(created_at)s,
    expires_at = %(expires_at)s, updated_at = %(updated_at)s, audit_count = %(audit_count)s,
    audit_head = %(audit_head)s, body = %(body)s
WHERE id = %(id)s;

-- name: get_approval
SELECT {approval_columns} FROM tether_approvals WHERE id = %(id)s;

-- name: lock_approval
SELECT {approval_columns} FROM tether_approvals WHERE id = %(id)s FOR UPDATE;

-- name: approval_run
SELECT run_id FROM tether_approvals WHERE id = %(id)s;

-- name: list_approvals
-- Ids compare byte-wise (COLLATE "C"), as SQLite and the memory store compare them.
SELECT {approval_columns} FROM tether_approvals
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
ORDER BY created_at, id COLLATE "C"
LIMIT %(limit)s;

-- name: reviewer_approvals
-- The approvals a reviewer may decide, filtered here and not after a LIMIT: `reviewers` (a JSON
-- list inside `body`) holds one of %(eligible)s (their name, "*", "group:<g>"), and separation
-- of duties does not shut them out. Keyset-paged by (created_at, id), oldest first.
SELECT {approval_columns} FROM tether_approvals
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
  AND (created_at > %(after_at)s
       OR (created_at = %(after_at)s AND id COLLATE "C" > %(after_id)s COLLATE "C"))
  AND (body::jsonb ->> 'reviewers')::jsonb
      ?| ARRAY(SELECT jsonb_array_elements_text(%(eligible)s::jsonb))
  AND NOT (coalesce((body::jsonb ->> 'separate_duties')::boolean, false)
           AND coalesce(body::jsonb ->> 'starter' = %(viewer)s, true))
ORDER BY created_at, id COLLATE "C"
LIMIT %(limit)s;

-- name: pending_approvals
-- Locked, and read again after any decision that held them committed: a decision taken
-- meanwhile is not overwritten.
SELECT {approval_columns} FROM tether_approvals
WHERE run_id = %(run_id)s AND status = 'pending'
ORDER BY created_at, id COLLATE "C"
FOR UPDATE;

-- name: approval_steps
-- The checkpoints recording that a run created an approval (flow.approval, kind 'approval'),
-- keyset-paged: verify finds approvals deleted with their trail from them.
SELECT run_id, seq, name FROM tether_checkpoints
WHERE kind = 'approval' AND (run_id, seq) > (%(after_run)s, %(after_seq)s)
ORDER BY run_id, seq LIMIT %(limit)s;

-- name: insert_secret
-- The first value offered wins; later ones (another process racing) are dropped.
INSERT INTO tether_secrets (name, value, created_at) VALUES (%(name)s, %(value)s, %(now)s)
ON CONFLICT (name) DO NOTHING;

-- name: get_secret
SELECT value FROM tether_secrets WHERE name = %(name)s;

-- name: insert_audit
INSERT INTO tether_approval_audit ({audit_columns})
VALUES (%(approval_id)s, %(seq)s, %(at)s, %(event)s, %(actor)s, %(detail)s, %(prev_hash)s,
        %(hash)s);

-- name: approval_audit
SELECT {audit_columns} FROM tether_approval_audit WHERE approval_id = %(id)s ORDER BY seq;

-- name: lock_run_status
SELECT status FROM tether_runs WHERE id = %(id)s FOR UPDATE;

-- name: lock_queue
SELECT pg_advisory_xact_lock(hashtext(%(lock)s));

-- name: notify
-- Sent once per transaction by the driver, however many operations in it ask.
NOTIFY tether;

-- name: lease_state
SELECT owner, epoch, status FROM tether_runs WHERE id = %(run_id)s;

-- name: put_user
INSERT INTO tether_users (name, groups, token_hash, created_at, revoked_at)
VALUES (%(name)s, %(groups)s, %(token_hash)s, %(created_at)s, %(revoked_at)s)
ON CONFLICT (name) DO UPDATE SET groups = excluded.groups, token_hash = excluded.token_hash,
    created_at = excluded.created_at, revoked_at = excluded.revoked_at;

-- name: get_user
SELECT name, groups, token_hash, created_at, revoked_at FROM tether_users WHERE name = %(name)s;

-- name: user_by_token
SELECT name, groups, token_hash, created_at, revoked_at FROM tether_users
WHERE token_hash = %(token_hash)s;

-- name: list_users
SELECT name, groups, token_hash, created_at, revoked_at FROM tether_users ORDER BY name COLLATE "C";

-- name: revoke_user
UPDATE tether_users SET revoked_at = coalesce(revoked_at, %(now)s) WHERE name = %(name)s
RETURNING name, groups, token_hash, created_at, revoked_at;

-- name: lock_stream
-- The stream's counter row, created at 0 if new, locked until the append commits: appenders
-- of one stream take turns, in any number of processes.
INSERT INTO tether_streams (run_id, key, next_offset) VALUES (%(run_id)s, %(key)s, 0)
ON CONFLICT (run_id, key) DO UPDATE SET next_offset = tether_streams.next_offset
RETURNING next_offset;

-- name: stream_refs
SELECT ref, "offset" FROM tether_stream_entries
WHERE run_id = %(run_id)s AND key = %(key)s AND ref = ANY(%(refs)s);

-- name: insert_stream_entries
-- Bound by position, one row per parameter set (executemany pipelines them).
INSERT INTO tether_stream_entries (run_id, key, "offset", kind, data, writer, attempt, ref,
                                   created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: set_stream_next
UPDATE tether_streams SET next_offset = %(next)s WHERE run_id = %(run_id)s AND key = %(key)s;

-- name: read_stream
SELECT "offset", kind, data, writer, attempt, ref, created_at FROM tether_stream_entries
WHERE run_id = %(run_id)s AND key = %(key)s AND "offset" >= %(offset)s
ORDER BY "offset" LIMIT %(limit)s;

-- name: stream_writer_entries
SELECT "offset", kind, data, writer, attempt, ref, created_at FROM tether_stream_entries
WHERE run_id = %(run_id)s AND key = %(key)s AND writer = %(writer)s
ORDER BY "offset";

-- name: resume_checkpoints
UPDATE tether_checkpoints SET status = 'retrying', retry_at = %(now)s
WHERE run_id = %(id)s AND status = 'failed'
  AND coalesce(position, CAST(seq AS TEXT)) = %(retry)s;

-- name: resume_run
-- Resumed after a fix, which is new code: unpinned, the next claim pins it to its version.
UPDATE tether_runs
SET status = 'pending', result = NULL, error = NULL, owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, wake_on = NULL, cancel_requested = FALSE, finished_at = NULL,
    updated_at = %(now)s, failures = 0, deadline_at = %(deadline_at)s, version = NULL
WHERE id = %(id)s AND status IN ('failed', 'dead', 'held');
