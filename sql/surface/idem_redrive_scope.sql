
GRANT EXECUTE ON FUNCTION idem_redrive_scope(text, timestamptz, integer) TO idempotency_admin;
COMMENT ON FUNCTION idem_redrive_scope(text, timestamptz, integer) IS
'Redrives up to max_keys failed keys of a scope (failed since failed_since, when given), in key order; returns how many. Call again until 0. Holds each key''s lock until commit. For idempotency_admin.';
