
GRANT EXECUTE ON FUNCTION idem_fingerprint(jsonb, text[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_fingerprint(jsonb, text[]) IS
'A request fingerprint for idem_claim: hex SHA-256 of the RFC 8785 canonical JSON of the document, or of an object mapping each given JSON Pointer to its value (null when absent). The client libraries compute the same value.';
