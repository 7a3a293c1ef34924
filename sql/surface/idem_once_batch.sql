
GRANT EXECUTE ON FUNCTION idem_once_batch(text[], text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_once_batch(text[], text) IS
'The keys of the batch seen for the first time over all committed transactions, each once, in input order; records them as completed.';
