-- Tether schema v11 for SQLite: the indexes retention finds what to delete by.

-- Ended runs in the order retention deletes them (a resumed run leaves it: finished_at NULL).
CREATE INDEX tether_runs_finished ON tether_runs (finished_at, id) WHERE finished_at IS NOT NULL;
-- A run's events, taken or not (the mailbox index holds only those not yet taken).
CREATE INDEX tether_events_run ON tether_events (run_id);
-- Approvals by their last change (audit entries and decisions move it).
CREATE INDEX tether_approvals_updated ON tether_approvals (updated_at, id);
