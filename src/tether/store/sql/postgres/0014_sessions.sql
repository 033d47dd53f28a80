-- Tether schema v14 for PostgreSQL: inbox sessions, checked on every request (id kept as SHA-256).

-- A session is live while ended_at is NULL, now < expires_at (the absolute limit) and
-- now < seen_at + idle (the idle limit, in seconds). Rows that are not live are deleted by the
-- next create_session.
CREATE TABLE tether_sessions (
    id_hash     TEXT PRIMARY KEY,
    user_name   TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    seen_at     DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL,
    idle        DOUBLE PRECISION NOT NULL,
    ended_at    DOUBLE PRECISION
);

CREATE INDEX tether_sessions_user ON tether_sessions (user_name);
