-- Named queries of inbox sessions (SQLite); the table is in 0014_sessions.sql.
-- Live means: not ended, before the absolute expiry, and seen within the idle limit.

-- name: drop_stale_sessions
DELETE FROM tether_sessions
WHERE ended_at IS NOT NULL OR expires_at <= :now OR seen_at + idle <= :now;

-- name: insert_session
INSERT INTO tether_sessions (id_hash, user_name, created_at, seen_at, expires_at, idle, ended_at)
VALUES (:id_hash, :user_name, :created_at, :seen_at, :expires_at, :idle, :ended_at);

-- name: get_session
SELECT id_hash, user_name, created_at, seen_at, expires_at, idle, ended_at FROM tether_sessions
WHERE id_hash = :id_hash AND ended_at IS NULL AND expires_at > :now AND seen_at + idle > :now;

-- name: touch_session
UPDATE tether_sessions SET seen_at = :now
WHERE id_hash = :id_hash AND ended_at IS NULL AND expires_at > :now AND seen_at + idle > :now
RETURNING id_hash, user_name, created_at, seen_at, expires_at, idle, ended_at;

-- name: end_session
UPDATE tether_sessions SET ended_at = :now WHERE id_hash = :id_hash AND ended_at IS NULL;

-- name: end_sessions
UPDATE tether_sessions SET ended_at = :now WHERE user_name = :user_name AND ended_at IS NULL;
