
GRANT EXECUTE ON FUNCTION idem_once(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_once(text, text) IS
'True exactly once per (scope, key) over all committed transactions; records the key as completed in the caller''s transaction.';
