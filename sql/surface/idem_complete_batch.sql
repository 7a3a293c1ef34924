
GRANT EXECUTE ON FUNCTION idem_complete_batch(text[], jsonb[], text, bigint[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_complete_batch(text[], jsonb[], text, bigint[]) IS
'Completes many claimed keys; payloads and tokens, when given, pair with keys by position. All or nothing; returns the number completed.';
