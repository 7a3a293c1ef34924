
GRANT EXECUTE ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) IS
'Stores processed_offset + 1 as the next offset of (consumer_group, topic, partition) in the caller''s transaction. False when processed_offset is not beyond the stored position (a duplicate). 55006 when generation is older than the stored one.';
