-- Tether schema v6 for SQLite: users of the server and the inbox (tokens kept as SHA-256 only).

CREATE TABLE tether_users (
    name        TEXT PRIMARY KEY,
    groups      TEXT NOT NULL,          -- JSON list of group names
    token_hash  TEXT NOT NULL UNIQUE,   -- sha256 hex of the bearer token
    created_at  REAL NOT NULL,
    revoked_at  REAL
);
