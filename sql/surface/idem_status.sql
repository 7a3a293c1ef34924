
GRANT EXECUTE ON FUNCTION idem_status(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_status(text, text) IS
'The stored record of (scope, key): status, attempts, token, payload, error and timestamps; no row if unknown.';
