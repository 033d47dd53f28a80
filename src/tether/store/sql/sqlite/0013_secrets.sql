-- Tether schema v13 for SQLite: the database's own secrets (the key of approval digests).

-- One row per named secret, inserted once on first use and never changed: a value only the
-- store reads (no API or CLI shows it), so a reviewer cannot recompute a keyed digest.
CREATE TABLE tether_secrets (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;
