
GRANT EXECUTE ON FUNCTION idem_claim(text, interval, text, text, boolean) TO idempotency_consumer;
COMMENT ON FUNCTION idem_claim(text, interval, text, text, boolean) IS
'Claims (scope, key) for processing. outcome: claimed (you own it; token is your fencing token), completed (payload replays the stored result), in_progress (another holder''s lease is live), failed (terminal; payload is the stored error), mismatch (same key, different fingerprint). ttl NULL = idempotency.lease_ttl.';
