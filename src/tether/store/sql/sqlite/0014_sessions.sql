-- Tether schema v14 for SQLite: inbox sessions, checked on every request (id kept as SHA-256).

-- A session is live while ended_at is NULL, now < expires_at (the absolute limit) and
-- now < seen_at + idle (the idle limit, in seconds). Rows that are not live are deleted by the
-- next create_session.
CREATE TABLE tether_sessions (
    id_hash     TEXT PRIMARY KEY,       -- sha256 hex of the session id (the cookie holds the id)
    user_name   TEXT NOT NULL,
    created_at  REAL NOT NULL,
    seen_at     REAL NOT NULL,
    expires_at  REAL NOT NULL,
    idle        REAL NOT NULL,
    ended_at    REAL
) WITHOUT ROWID;

CREATE INDEX tether_sessions_user ON tether_sessions (user_name);
