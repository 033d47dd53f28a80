-- Schedules (see docs/schedules.md): a definition and a cursor (last_slot) per name.

-- name: put_schedule
-- A new schedule's cursor starts at now (no slot before its first registration runs). An
-- existing one keeps its cursor and takes the definition given.
INSERT INTO tether_schedules (name, workflow, cron, tz, catch_up, last_slot, created_at,
                              updated_at)
VALUES (%(name)s, %(workflow)s, %(cron)s, %(tz)s, %(catch_up)s, %(now)s, %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, cron = excluded.cron,
    tz = excluded.tz, catch_up = excluded.catch_up, updated_at = excluded.updated_at
WHERE (tether_schedules.workflow, tether_schedules.cron, tether_schedules.tz,
       tether_schedules.catch_up) IS DISTINCT FROM (excluded.workflow, excluded.cron,
                                                    excluded.tz, excluded.catch_up);

-- name: get_schedule
SELECT name, workflow, cron, tz, catch_up, last_slot, created_at, updated_at
FROM tether_schedules WHERE name = %(name)s;

-- name: list_schedules
SELECT name, workflow, cron, tz, catch_up, last_slot, created_at, updated_at
FROM tether_schedules ORDER BY name;

-- name: advance_schedule
-- Compare-and-set: only the worker that still sees the cursor at cursor moves it (a second
-- concurrent update waits for the first, then finds the cursor moved and changes nothing).
UPDATE tether_schedules SET last_slot = %(slot)s, updated_at = %(now)s
WHERE name = %(name)s AND last_slot = %(cursor)s;
