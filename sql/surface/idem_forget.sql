
GRANT EXECUTE ON FUNCTION idem_forget(text, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_forget(text, text) IS
'Deletes a key''s record whatever its state, so that it is processed again from scratch; false when unknown. A holder of its lease then gets P0002. Takes the key lock. For idempotency_admin.';
