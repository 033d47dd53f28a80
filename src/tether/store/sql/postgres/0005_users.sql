-- Tether schema v5 for PostgreSQL: users of the server and the inbox (tokens kept as SHA-256 only).

CREATE TABLE tether_users (
    name        TEXT PRIMARY KEY,
    groups      TEXT NOT NULL,
    token_hash  TEXT NOT NULL UNIQUE,
    created_at  DOUBLE PRECISION NOT NULL,
    revoked_at  DOUBLE PRECISION
);
