-- Tether schema v10 for SQLite: values that runs publish for callers, and fork links.

-- Every version of a run's value `key` (tether.set_value), numbered from 1 per (run, key): the
-- latest is the highest. `seq` is the position of the set_value checkpoint written in the
-- same transaction, so a fork copies exactly the versions its copied checkpoints set.
CREATE TABLE tether_values (
    run_id     TEXT NOT NULL,
    key        TEXT NOT NULL,
    version    INTEGER NOT NULL,
    value      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, key, version)
) WITHOUT ROWID;

-- Run `run_id` was forked from `source_run_id`, reusing its checkpoints before `from_step`
-- (at position `from_seq`). Written with the fork and its copied history. The source may be
-- deleted later (retention): the link stays, naming it.
CREATE TABLE tether_forks (
    run_id        TEXT PRIMARY KEY,
    source_run_id TEXT NOT NULL,
    from_step     TEXT NOT NULL,
    from_seq      INTEGER NOT NULL,
    created_at    REAL NOT NULL
);
CREATE INDEX tether_forks_source ON tether_forks (source_run_id, created_at);
