
GRANT EXECUTE ON FUNCTION idem_complete(text, jsonb, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_complete(text, jsonb, text, bigint) IS
'Marks a claimed key completed and stores payload for replay. token may be NULL only in the transaction that claimed. Errors: P0002 unknown key, 55000 already terminal, 55006 lease lost.';
