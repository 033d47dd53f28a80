-- TetherSaver's named queries (PostgreSQL), one per statement; `-- name:` starts each.
-- Sets of keys arrive as one JSON array parameter (`keys`), read with jsonb_array_elements.

-- name: insert_blob
-- A channel's value at one version never changes: the first write wins.
INSERT INTO tether_lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
VALUES (%(thread_id)s, %(checkpoint_ns)s, %(channel)s, %(version)s, %(type)s, %(blob)s)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;

-- name: upsert_checkpoint
INSERT INTO tether_lg_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint,
     metadata)
VALUES (%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_checkpoint_id)s,
        %(checkpoint_type)s, %(checkpoint)s, %(metadata)s::jsonb)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint_type = excluded.checkpoint_type, checkpoint = excluded.checkpoint,
              metadata = excluded.metadata;

-- name: put_write
-- A task's ordinary writes are kept as first stored; its special ones (idx < 0) are replaced.
INSERT INTO tether_lg_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
VALUES (%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(task_id)s, %(task_path)s,
        %(idx)s, %(channel)s, %(type)s, %(blob)s)
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
LIMIT %(limit)s;

-- name: where_thread
thread_id = %(thread_id)s

-- name: where_namespace
checkpoint_ns = %(checkpoint_ns)s

-- name: where_checkpoint
checkpoint_id = %(checkpoint_id)s

-- name: where_before
checkpoint_id < %(before)s

-- name: where_metadata
-- Every key of the filter (scalars only) equals the metadata's value for it.
metadata @> %(filter)s::jsonb

-- name: blobs_of
-- keys: [[thread_id, checkpoint_ns, channel, version], ...]
SELECT b.thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob
FROM jsonb_array_elements(%(keys)s::jsonb) AS k
JOIN tether_lg_blobs AS b
  ON b.thread_id = k ->> 0 AND b.checkpoint_ns = k ->> 1
 AND b.channel = k ->> 2 AND b.version = k ->> 3;

-- name: writes_of
-- keys: [[thread_id, checkpoint_ns, checkpoint_id], ...]; in LangGraph's writes_sort_key order.
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, w.blob
FROM jsonb_array_elements(%(keys)s::jsonb) AS k
JOIN tether_lg_writes AS w
  ON w.thread_id = k ->> 0 AND w.checkpoint_ns = k ->> 1 AND w.checkpoint_id = k ->> 2
ORDER BY w.task_path, w.task_id, w.idx;

-- name: blob_keys
SELECT checkpoint_ns, channel, version FROM tether_lg_blobs WHERE thread_id = %(thread_id)s;

-- name: checkpoints_of_runs
SELECT thread_id, checkpoint_ns, checkpoint_id FROM tether_lg_checkpoints
WHERE metadata ->> 'run_id' IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: delete_checkpoints
-- keys: [[thread_id, checkpoint_ns, checkpoint_id], ...]
DELETE FROM tether_lg_checkpoints
WHERE (thread_id, checkpoint_ns, checkpoint_id) IN
      (SELECT k ->> 0, k ->> 1, k ->> 2 FROM jsonb_array_elements(%(keys)s::jsonb) AS k);

-- name: delete_writes
-- keys: [[thread_id, checkpoint_ns, checkpoint_id], ...]
DELETE FROM tether_lg_writes
WHERE (thread_id, checkpoint_ns, checkpoint_id) IN
      (SELECT k ->> 0, k ->> 1, k ->> 2 FROM jsonb_array_elements(%(keys)s::jsonb) AS k);

-- name: delete_blobs
-- keys: [[thread_id, checkpoint_ns, channel, version], ...]
DELETE FROM tether_lg_blobs
WHERE (thread_id, checkpoint_ns, channel, version) IN
      (SELECT k ->> 0, k ->> 1, k ->> 2, k ->> 3 FROM jsonb_array_elements(%(keys)s::jsonb) AS k);

-- name: delete_thread_checkpoints
DELETE FROM tether_lg_checkpoints WHERE thread_id = %(thread_id)s;

-- name: delete_thread_blobs
DELETE FROM tether_lg_blobs WHERE thread_id = %(thread_id)s;

-- name: delete_thread_writes
DELETE FROM tether_lg_writes WHERE thread_id = %(thread_id)s;

-- name: copy_thread_checkpoints
INSERT INTO tether_lg_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint,
     metadata)
SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
       checkpoint, metadata
FROM tether_lg_checkpoints WHERE thread_id = %(source)s
ON CONFLICT DO NOTHING;

-- name: copy_thread_blobs
INSERT INTO tether_lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT %(target)s, checkpoint_ns, channel, version, type, blob
FROM tether_lg_blobs WHERE thread_id = %(source)s
ON CONFLICT DO NOTHING;

-- name: copy_thread_writes
INSERT INTO tether_lg_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
FROM tether_lg_writes WHERE thread_id = %(source)s
ON CONFLICT DO NOTHING;
