-- Tether schema v12 for SQLite: structured positions and arguments of checkpoints, held runs,
-- and where a worker process really lives.

-- A checkpoint's identity is its position: the path of the workflow task that asked for it
-- (from the root task, the index of each task its parent created), then its sequence within
-- that task, "/"-joined: "3" is the root task's fourth checkpoint, "1/0" the first of the
-- root's second task. Checkpoints recorded before positions were all the root task's: NULL
-- reads as their seq (load_history), so old rows need no rewrite. `seq` stays the row's key
-- and the order in which checkpoints were first recorded.
ALTER TABLE tether_checkpoints ADD COLUMN position TEXT;
-- A step's (a child start's) arguments as replay compares them: their canonical JSON, or for
-- long ones {"$digest": sha256 of it}. NULL: not recorded (an older row, or not JSON).
ALTER TABLE tether_checkpoints ADD COLUMN args TEXT;

-- Status 'held': replay diverged from the history; the run waits, unfinished, for code that
-- replays it. It keeps its dedup key like every unfinished run.
DROP INDEX tether_runs_dedup;
CREATE UNIQUE INDEX tether_runs_dedup ON tether_runs (coalesce(queue, ''), dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'held');

-- Same-host recovery judges a worker's process only where the boot and the PID namespace are
-- this process's own (containers share host names, and each has its own PIDs).
ALTER TABLE tether_workers ADD COLUMN boot_id TEXT;
ALTER TABLE tether_workers ADD COLUMN pid_ns TEXT;
