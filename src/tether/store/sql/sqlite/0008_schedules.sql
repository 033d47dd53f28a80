-- Tether schema v9 for SQLite: schedules (one run per cron slot, see docs/schedules.md).
-- last_slot is the cursor: every slot at or before it is handled (started, or skipped for good
-- by the catch-up policy). Workers move it by compare-and-set in the transaction that creates
-- the slot's runs, so two workers never both start a slot.

CREATE TABLE tether_schedules (
    name        TEXT PRIMARY KEY,
    workflow    TEXT NOT NULL,
    cron        TEXT NOT NULL,
    tz          TEXT NOT NULL,
    catch_up    TEXT NOT NULL,
    last_slot   REAL NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
