
COMMENT ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) IS
'Sets the next offset of (consumer_group, topic, partition), backwards or forwards, and, when generation is given, the stored generation (lower or higher: a zombie''s huge generation is undone here). For DBAs; not granted to idempotency_consumer.';
