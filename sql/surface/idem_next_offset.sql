
GRANT EXECUTE ON FUNCTION idem_next_offset(text, text, integer) TO idempotency_consumer;
COMMENT ON FUNCTION idem_next_offset(text, text, integer) IS
'Where to seek on restart: last processed offset + 1, or NULL when nothing is stored.';
