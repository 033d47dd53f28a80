-- Named queries of inbox sessions (PostgreSQL); the table is in 0014_sessions.sql.
-- Live means: not ended, before the absolute expiry, and seen within the idle limit.

-- name: drop_stale_sessions
DELETE FROM tether_sessions
WHERE ended_at IS NOT NULL OR expires_at <= %(now)s OR seen_at + idle <= %(now)s;

-- name: insert_session
INSERT INTO tether_sessions (id_hash, user_name, created_at, seen_at, expires_at, idle, ended_at)
VALUES (%(id_hash)s, %(user_name)s, %(created_at)s, %(seen_at)s, %(expires_at)s, %(idle)s, %(ended_at)s);

-- name: get_session
SELECT id_hash, user_name, created_at, seen_at, expires_at, idle, ended_at FROM tether_sessions
WHERE id_hash = %(id_hash)s AND ended_at IS NULL AND expires_at > %(now)s AND seen_at + idle > %(now)s;

-- name: touch_session
UPDATE tether_sessions SET seen_at = %(now)s
WHERE id_hash = %(id_hash)s AND ended_at IS NULL AND expires_at > %(now)s AND seen_at + idle > %(now)s
RETURNING id_hash, user_name, created_at, seen_at, expires_at, idle, ended_at;

-- name: end_session
UPDATE tether_sessions SET ended_at = %(now)s WHERE id_hash = %(id_hash)s AND ended_at IS NULL;

-- name: end_sessions
UPDATE tether_sessions SET ended_at = %(now)s WHERE user_name = %(user_name)s AND ended_at IS NULL;
