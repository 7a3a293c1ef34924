
GRANT EXECUTE ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) IS
'Records a failed attempt. retryable: releases the key for another claim and returns released, or returns failed once idempotency.max_attempts is reached. Not retryable: terminal at once, returns failed.';
