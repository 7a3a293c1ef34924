
GRANT EXECUTE ON FUNCTION idempotency.scope_stats() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.scope_stats() IS
'The counters behind idempotency.stats, per scope, in the order of its columns (lock waits in microseconds).';
