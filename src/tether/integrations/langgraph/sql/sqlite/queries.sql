-- TetherSaver's named queries (SQLite), one per statement; `-- name:` starts each.
-- Sets of keys arrive as one JSON array parameter (`keys`), read with json_each.

-- name: insert_blob
-- A channel's value at one version never changes: the first write wins.
INSERT INTO tether_lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
VALUES (:thread_id, :checkpoint_ns, :channel, :version, :type, :blob)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;

-- name: upsert_checkpoint
INSERT INTO tether_lg_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint,
     metadata)
VALUES (:thread_id, :checkpoint_ns, :checkpoint_id, :parent_checkpoint_id, :checkpoint_type,
        :checkpoint, :metadata)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint_type = excluded.checkpoint_type, checkpoint = excluded.checkpoint,
              metadata = excluded.metadata;

-- name: put_write
-- A task's ordinary writes are kept as first stored; its special ones (idx < 0) are replaced.
INSERT INTO tether_lg_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
VALUES (:thread_id, :checkpoint_ns, :checkpoint_id, :task_id, :task_path, :idx, :channel,
        :type, :blob)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
DO UPDATE SET channel = excluded.channel, type = excluded.type, blob = excluded.blob,
              task_path = excluded.task_path
WHERE excluded.idx < 0;

-- name: list_checkpoints
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint,
       metadata
FROM tether_lg_checkpoints
WHERE {where}
ORDER BY checkpoint_id DESC
LIMIT coalesce(:limit, -1);

-- name: where_thread
thread_id = :thread_id

-- name: where_namespace
checkpoint_ns = :checkpoint_ns

-- name: where_checkpoint
checkpoint_id = :checkpoint_id

-- name: where_before
checkpoint_id < :before

-- name: where_metadata
-- Every key of the filter (scalars only) equals the metadata's value for it.
NOT EXISTS (SELECT 1 FROM json_each(:filter) AS f
            WHERE (metadata ->> ('$."' || f.key || '"')) IS NOT f.value)

-- name: blobs_of
-- keys: [[thread_id, checkpoint_ns, channel, version], ...]
SELECT b.thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob
FROM json_each(:keys) AS k
JOIN tether_lg_blobs AS b
  ON b.thread_id = k.value ->> 0 AND b.checkpoint_ns = k.value ->> 1
 AND b.channel = k.value ->> 2 AND b.version = k.value ->> 3;

-- name: writes_of
-- keys: [[thread_id, checkpoint_ns, checkpoint_id], ...]; in LangGraph's writes_sort_key order.
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, w.blob
FROM json_each(:keys) AS k
JOIN tether_lg_writes AS w
  ON w.thread_id = k.value ->> 0 AND w.checkpoint_ns = k.value ->> 1
 AND w.checkpoint_id = k.value ->> 2
ORDER BY w.task_path, w.task_id, w.idx;

-- name: blob_keys
SELECT checkpoint_ns, channel, version FROM tether_lg_blobs WHERE thread_id = :thread_id;

-- name: checkpoints_of_runs
SELECT thread_id, checkpoint_ns, checkpoint_id FROM tether_lg_checkpoints
WHERE metadata ->> '$.run_id' IN (SELECT value FROM json_each(:run_ids));

-- name: delete_checkpoints
-- keys: [[thread_id, checkpoint_ns, checkpoint_id], ...]
DELETE FROM tether_lg_checkpoints
WHERE (thread_id, checkpoint_ns, checkpoint_id) IN
      (SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(:keys));

-- name: delete_writes
-- keys: [[thread_id, checkpoint_ns, checkpoint_id], ...]
DELETE FROM tether_lg_writes
WHERE (thread_id, checkpoint_ns, checkpoint_id) IN
      (SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(:keys));

-- name: delete_blobs
-- keys: [[thread_id, checkpoint_ns, channel, version], ...]
DELETE FROM tether_lg_blobs
WHERE (thread_id, checkpoint_ns, channel, version) IN
      (SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(:keys));

-- name: delete_thread_checkpoints
DELETE FROM tether_lg_checkpoints WHERE thread_id = :thread_id;

-- name: delete_thread_blobs
DELETE FROM tether_lg_blobs WHERE thread_id = :thread_id;

-- name: delete_thread_writes
DELETE FROM tether_lg_writes WHERE thread_id = :thread_id;

-- name: copy_thread_checkpoints
INSERT INTO tether_lg_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint,
     metadata)
SELECT :target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
       checkpoint, metadata
FROM tether_lg_checkpoints WHERE thread_id = :source
ON CONFLICT DO NOTHING;

-- name: copy_thread_blobs
INSERT INTO tether_lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT :target, checkpoint_ns, channel, version, type, blob
FROM tether_lg_blobs WHERE thread_id = :source
ON CONFLICT DO NOTHING;

-- name: copy_thread_writes
INSERT INTO tether_lg_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT :target, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
FROM tether_lg_writes WHERE thread_id = :source
ON CONFLICT DO NOTHING;
