
GRANT EXECUTE ON FUNCTION idem_stats_reset(text) TO idempotency_admin;
COMMENT ON FUNCTION idem_stats_reset(text) IS
'Zeroes the counters of one scope, or of all scopes of this database (NULL); returns the time of the reset. For idempotency_admin.';
