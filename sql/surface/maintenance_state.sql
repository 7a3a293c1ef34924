
GRANT EXECUTE ON FUNCTION idempotency.maintenance_state() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.maintenance_state() IS
'The last maintenance round of this database since the server started (worker or idem_maintenance()), how many ran and failed, the last error. Empty without the library preloaded.';
