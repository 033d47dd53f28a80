-- Named queries of the SQLite backend for transactions and the outbox (store/ops/outbox.py).
-- Outbox rows are always selected in the order of OUTBOX_COLUMNS in rows.py.

-- name: outbox_insert
INSERT INTO tether_outbox (id, run_id, checkpoint, destination, key, payload, status, next_at,
                           created_at, updated_at)
VALUES (:id, :run_id, :checkpoint, :destination, :key, :payload, 'pending', :now, :now, :now)
ON CONFLICT (id) DO NOTHING;

-- name: outbox_claim
-- Due pending messages, and sending ones whose claim expired or whose claimer is gone (the
-- outcome of their send is unknown). SET expressions read the row as it was.
UPDATE tether_outbox
SET in_doubt = (status = 'sending'), uncertain = uncertain + (status = 'sending'),
    status = 'sending', attempts = attempts + 1, claims = claims + 1, claimed_by = :worker,
    next_at = :claim_until, updated_at = :now
WHERE id IN (
    SELECT id FROM tether_outbox
    WHERE (status = 'pending' AND next_at <= :now)
       OR (status = 'sending' AND (next_at <= :now OR claimed_by IS NULL
                                   OR claimed_by NOT IN (SELECT id FROM tether_workers)))
    ORDER BY next_at, id
    LIMIT :limit)
RETURNING id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain,
          in_doubt, claims, claimed_by, next_at, error, created_at, updated_at, delivered_at;

-- name: outbox_settle
UPDATE tether_outbox
SET status = :status, next_at = coalesce(:next_at, next_at), error = :error,
    delivered_at = :delivered_at, claimed_by = NULL, in_doubt = 0, updated_at = :now
WHERE id = :id AND status = 'sending' AND claims = :claim;

-- name: outbox_next_at
SELECT min(CASE WHEN status = 'sending' AND (claimed_by IS NULL
                     OR claimed_by NOT IN (SELECT id FROM tether_workers))
                THEN 0 ELSE next_at END)
FROM tether_outbox WHERE status IN ('pending', 'sending');

-- name: outbox_list
SELECT id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain,
       in_doubt, claims, claimed_by, next_at, error, created_at, updated_at, delivered_at
FROM tether_outbox
WHERE (:status IS NULL OR status = :status) AND (:run_id IS NULL OR run_id = :run_id)
ORDER BY created_at, id
LIMIT :limit;

-- name: outbox_get
SELECT id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain,
       in_doubt, claims, claimed_by, next_at, error, created_at, updated_at, delivered_at
FROM tether_outbox WHERE id = :id;

-- name: outbox_retry
UPDATE tether_outbox
SET status = 'pending', next_at = :now, attempts = 0, in_doubt = 0, claimed_by = NULL,
    updated_at = :now
WHERE id = :id AND status = 'failed';
