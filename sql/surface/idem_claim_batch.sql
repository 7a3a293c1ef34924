
GRANT EXECUTE ON FUNCTION idem_claim_batch(text[], interval, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_claim_batch(text[], interval, text) IS
'Claims many keys of one scope in one call (one broker poll); one row per input key, in input order, with the same outcomes as idem_claim. Keys are locked in sorted order.';
