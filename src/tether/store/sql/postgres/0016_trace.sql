-- Tether schema v16 for PostgreSQL: the trace context a run was started under (docs/observability.md).

-- JSON {"traceparent": ..., "tracestate": ...} (W3C Trace Context) of the caller's span when the
-- run was started, so that its run spans are children of that span. NULL: none was given.
ALTER TABLE tether_runs ADD COLUMN trace_context TEXT;
