
GRANT EXECUTE ON FUNCTION idem_redrive(text, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_redrive(text, text) IS
'Makes a failed (dead-letter) key claimable again: released, attempts counted from zero, error kept. False when the key is not failed; P0002 when unknown. Takes the key lock. For idempotency_admin.';
