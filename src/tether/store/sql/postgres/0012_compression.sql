-- Tether schema v12 for PostgreSQL: large values (step results, run arguments and results,
-- published values, event payloads, stream chunks) compressed with lz4 where the server has it
-- (PostgreSQL 14+ built with lz4), several times faster than the default pglz: a 1 MB result
-- is stored in a fraction of the time. Only new values are affected; nothing is rewritten. A
-- server without lz4 keeps pglz, and this migration changes nothing there.
DO $$
DECLARE
    target text;
BEGIN
    FOREACH target IN ARRAY ARRAY[
        'tether_checkpoints.result', 'tether_checkpoints.error', 'tether_runs.args',
        'tether_runs.result', 'tether_values.value', 'tether_events.payload',
        'tether_stream_entries.data'
    ] LOOP
        BEGIN
            EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET COMPRESSION lz4',
                           split_part(target, '.', 1), split_part(target, '.', 2));
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- no lz4 here (or a server before 14): pglz stays
        END;
    END LOOP;
END
$$;
