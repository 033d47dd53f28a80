-- Tether schema v20 for PostgreSQL: a run's end in one statement when it has nothing else to do.

-- A run without a parent and without a pending approval ends with its own row alone: this
-- function locks the row (fenced by the lease), then looks for pending approvals (a later
-- statement, so a later snapshot: an approval committed before the lock is seen, and one
-- created after it waits for this end and finds the lease gone), and only then ends the run,
-- waking the workers (pg_notify commits with it) when the run was in a queue, whose budget it
-- frees. Anything else (the lease not held, a parent to tell, approvals to cancel) changes
-- nothing and answers FALSE: the caller ends the run with the finish_run query and its
-- companions in one transaction. Called in autocommit it is one round trip and one commit. Its
-- SET list is finish_run's (queries.sql): keep them one.
CREATE FUNCTION tether_finish_alone(
    p_run_id TEXT, p_worker TEXT, p_epoch INTEGER, p_status TEXT, p_result TEXT, p_error TEXT,
    p_now DOUBLE PRECISION, p_failures INTEGER
) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    v_queue TEXT;
BEGIN
    SELECT queue INTO v_queue FROM tether_runs
    WHERE id = p_run_id AND status = 'running' AND owner = p_worker AND epoch = p_epoch
      AND parent_id IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    IF EXISTS (SELECT 1 FROM tether_approvals WHERE run_id = p_run_id AND status = 'pending') THEN
        RETURN FALSE;
    END IF;
    UPDATE tether_runs
    SET status = p_status, result = p_result, error = p_error, owner = NULL,
        lease_expires_at = NULL, wake_at = NULL, wake_on = NULL, cancel_requested = FALSE,
        finished_at = p_now, updated_at = p_now, failures = coalesce(p_failures, failures)
    WHERE id = p_run_id;
    IF v_queue IS NOT NULL THEN
        PERFORM pg_notify('tether', '');
    END IF;
    RETURN TRUE;
END
$$;
