
GRANT EXECUTE ON FUNCTION idem_heartbeat(text, interval, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_heartbeat(text, interval, text, bigint) IS
'Extends the caller''s lease to now + ttl and returns the new expires_at. 55006 if the lease was lost.';
