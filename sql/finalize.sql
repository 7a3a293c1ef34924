-- Privileges, documentation and the first partitions. Runs after the generated functions.

-- The API is not for PUBLIC: grant the role idempotency_consumer to the roles that consume.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_consumer') THEN
        CREATE ROLE idempotency_consumer NOLOGIN;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION
    idem_claim(text, interval, text, text, boolean),
    idem_complete(text, jsonb, text, bigint),
    idem_fail(text, jsonb, boolean, text, bigint),
    idem_heartbeat(text, interval, text, bigint),
    idem_once(text, text),
    idem_status(text, text),
    idempotency.premake_partitions(timestamptz)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    idem_claim(text, interval, text, text, boolean),
    idem_complete(text, jsonb, text, bigint),
    idem_fail(text, jsonb, boolean, text, bigint),
    idem_heartbeat(text, interval, text, bigint),
    idem_once(text, text),
    idem_status(text, text)
TO idempotency_consumer;

COMMENT ON FUNCTION idem_claim(text, interval, text, text, boolean) IS
'Claims (scope, key) for processing. outcome: claimed (you own it; token is your fencing token), completed (payload replays the stored result), in_progress (another holder''s lease is live), failed (terminal; payload is the stored error), mismatch (same key, different fingerprint). ttl NULL = idempotency.lease_ttl.';
COMMENT ON FUNCTION idem_complete(text, jsonb, text, bigint) IS
'Marks a claimed key completed and stores payload for replay. token may be NULL only in the transaction that claimed. Errors: P0002 unknown key, 55000 already terminal, 55006 lease lost.';
COMMENT ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) IS
'Records a failed attempt. retryable: releases the key for another claim and returns released, or returns failed once idempotency.max_attempts is reached. Not retryable: terminal at once, returns failed.';
COMMENT ON FUNCTION idem_heartbeat(text, interval, text, bigint) IS
'Extends the caller''s lease to now + ttl and returns the new expires_at. 55006 if the lease was lost.';
COMMENT ON FUNCTION idem_once(text, text) IS
'True exactly once per (scope, key) over all committed transactions; records the key as completed in the caller''s transaction.';
COMMENT ON FUNCTION idem_status(text, text) IS
'The stored record of (scope, key): status, attempts, token, payload, error and timestamps; no row if unknown.';
COMMENT ON FUNCTION idempotency.premake_partitions(timestamptz) IS
'Creates the missing partitions of idempotency.records from as_of to idempotency.premake intervals ahead; returns how many.';

SELECT idempotency.premake_partitions(now());
