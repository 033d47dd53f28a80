-- Named queries of the PostgreSQL backend for transactions and the outbox (store/ops/outbox.py).
-- Outbox rows are always selected in the order of OUTBOX_COLUMNS in rows.py.

-- name: outbox_insert
INSERT INTO tether_outbox (id, run_id, checkpoint, destination, key, payload, status, next_at,
                           created_at, updated_at)
VALUES (%(id)s, %(run_id)s, %(checkpoint)s, %(destination)s, %(key)s, %(payload)s, 'pending',
        %(now)s, %(now)s, %(now)s)
ON CONFLICT (id) DO NOTHING;

-- name: outbox_claim
-- Due pending messages, and sending ones whose claim expired or whose claimer is gone (the
-- outcome of their send is unknown). SKIP LOCKED: concurrent claimers take different rows.
UPDATE tether_outbox
SET in_doubt = (status = 'sending'),
    uncertain = uncertain + CASE WHEN status = 'sending' THEN 1 ELSE 0 END,
    status = 'sending', attempts = attempts + 1, claims = claims + 1, claimed_by = %(worker)s,
    next_at = %(claim_until)s, updated_at = %(now)s
WHERE id IN (
    SELECT id FROM tether_outbox
    WHERE (status = 'pending' AND next_at <= %(now)s)
       OR (status = 'sending' AND (next_at <= %(now)s OR claimed_by IS NULL
                                   OR claimed_by NOT IN (SELECT id FROM tether_workers)))
    ORDER BY next_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain,
          in_doubt, claims, claimed_by, next_at, error, created_at, updated_at, delivered_at;

-- name: outbox_settle
UPDATE tether_outbox
SET status = %(status)s, next_at = coalesce(%(next_at)s, next_at), error = %(error)s,
    delivered_at = %(delivered_at)s, claimed_by = NULL, in_doubt = FALSE, updated_at = %(now)s
WHERE id = %(id)s AND status = 'sending' AND claims = %(claim)s;

-- name: outbox_next_at
SELECT min(CASE WHEN status = 'sending' AND (claimed_by IS NULL
                     OR claimed_by NOT IN (SELECT id FROM tether_workers))
                THEN 0 ELSE next_at END)
FROM tether_outbox WHERE status IN ('pending', 'sending');

-- name: outbox_list
SELECT id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain,
       in_doubt, claims, claimed_by, next_at, error, created_at, updated_at, delivered_at
FROM tether_outbox
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: outbox_get
SELECT id, run_id, checkpoint, destination, key, payload, status, attempts, uncertain,
       in_doubt, claims, claimed_by, next_at, error, created_at, updated_at, delivered_at
FROM tether_outbox WHERE id = %(id)s;

-- name: outbox_retry
UPDATE tether_outbox
SET status = 'pending', next_at = %(now)s, attempts = 0, in_doubt = FALSE, claimed_by = NULL,
    updated_at = %(now)s
WHERE id = %(id)s AND status = 'failed';
