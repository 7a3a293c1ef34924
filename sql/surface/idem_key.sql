
GRANT EXECUTE ON FUNCTION idem_key(uuid, text[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_key(uuid, text[]) IS
'A key derived from a message''s identifying parts: the version-5 UUID of namespace and the parts (each as <UTF-8 length>:<bytes>;), as text. The client libraries compute the same value.';
