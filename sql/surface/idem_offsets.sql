
GRANT EXECUTE ON FUNCTION idem_offsets(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_offsets(text, text) IS
'Stored positions of a consumer group (optionally one topic), for the startup seek.';
