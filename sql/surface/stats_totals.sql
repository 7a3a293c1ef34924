
GRANT EXECUTE ON FUNCTION idempotency.stats_totals() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.stats_totals() IS
'The counters behind idem_stats(), added up over the scopes of this database.';
