-- Bad input and misuse: every SQLSTATE of the contract that a single session can provoke
-- (40001 and 40P01 need two sessions: see tests/isolation). After each group of errors,
-- the storage is unchanged.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
CREATE FUNCTION records_digest() RETURNS text LANGUAGE sql AS $$
  SELECT count(*) || ':' || md5(coalesce(string_agg(x, '|' ORDER BY x), ''))
  FROM (SELECT r.tableoid::regclass::text || r.ctid::text || r.xmin::text || row_to_json(r)::text AS x
        FROM idempotency.records r) s
$$;

-- Fixtures: a key held by a committed claim (two-transaction mode), a completed key,
-- a failed key and an idem_once key. 'warmup' makes every token of the fixtures >= 2.
SELECT outcome FROM idem_claim('warmup');
SELECT token AS held FROM idem_claim('held', ttl => '1 hour') \gset
BEGIN;
SELECT token AS done FROM idem_claim('done') \gset
SELECT idem_complete('done', '{"ok": true}');
COMMIT;
BEGIN;
SELECT token AS dead FROM idem_claim('dead') \gset
SELECT idem_fail('dead', '{"error": "fatal"}', retryable => false) AS result;
COMMIT;
SELECT idem_once('once') AS first;
SELECT records_digest() AS d0 \gset
SELECT count(*) AS rows FROM idempotency.records;

-----------------------------------------------------------------------------
-- 22004 null_value_not_allowed: a required argument is NULL.
-----------------------------------------------------------------------------
SELECT * FROM idem_claim(NULL);
SELECT * FROM idem_claim(NULL::text, ttl => '1 minute');
SELECT * FROM idem_claim('new-key', scope => NULL);
SELECT * FROM idem_claim('new-key', wait => NULL);
SELECT idem_complete(NULL, '1', token => :held);
SELECT idem_complete('held', '1', scope => NULL, token => :held);
SELECT idem_fail(NULL, '1', token => :held);
SELECT idem_fail('held', '1', retryable => NULL, token => :held);
SELECT idem_fail('held', '1', scope => NULL, token => :held);
SELECT idem_heartbeat(NULL, token => :held);
SELECT idem_heartbeat('held', scope => NULL, token => :held);
SELECT idem_once(NULL);
SELECT idem_once('new-key', NULL);
SELECT * FROM idem_status(NULL);
SELECT * FROM idem_status('held', NULL);
SELECT records_digest() = :'d0' AS nothing_written;

-----------------------------------------------------------------------------
-- 22023 invalid_parameter_value: empty key or scope, control characters, ttl <= 0.
-----------------------------------------------------------------------------
SELECT * FROM idem_claim('');
SELECT * FROM idem_claim('new-key', scope => '');
SELECT * FROM idem_claim(E'new\nkey');
SELECT * FROM idem_claim(E'new\tkey');
SELECT * FROM idem_claim(E'new\x01key');
SELECT * FROM idem_claim(E'new\x7fkey');
SELECT * FROM idem_claim('new-key', scope => E'sc\rope');
SELECT * FROM idem_claim('new-key', ttl => '0 seconds');
SELECT * FROM idem_claim('new-key', ttl => '-5 minutes');
SELECT idem_complete('', '1', token => :held);
SELECT idem_complete('held', '1', scope => '', token => :held);
SELECT idem_complete(E'held\n', '1', token => :held);
SELECT idem_fail('', '1', token => :held);
SELECT idem_fail('held', '1', scope => E'\x1b', token => :held);
SELECT idem_heartbeat('', token => :held);
SELECT idem_heartbeat('held', ttl => '0', token => :held);
SELECT idem_heartbeat('held', ttl => '-1 second', token => :held);
SELECT idem_once('');
SELECT idem_once('new-key', '');
SELECT idem_once(E'new\nkey');
SELECT * FROM idem_status('');
SELECT * FROM idem_status('held', '');
SELECT records_digest() = :'d0' AS nothing_written;
-- Non-ASCII printable keys are fine.
SELECT outcome FROM idem_claim('clé-ключ-鍵', ttl => '1 hour');
SELECT status FROM idem_status('clé-ключ-鍵');
SELECT records_digest() AS d0 \gset

-----------------------------------------------------------------------------
-- 54000 program_limit_exceeded: key/scope longer than max_key_bytes (512),
-- payload/error larger than max_payload_bytes (1MB), measured as stored jsonb bytes.
-----------------------------------------------------------------------------
SELECT * FROM idem_claim(repeat('k', 513));
SELECT * FROM idem_claim(repeat('é', 257));          -- 257 characters, 514 bytes
SELECT * FROM idem_claim('new-key', scope => repeat('s', 513));
SELECT idem_once(repeat('k', 513));
SELECT idem_once('new-key', repeat('s', 513));
SELECT idem_complete(repeat('k', 513), '1');
SELECT idem_complete('held', to_jsonb(repeat('x', 1048575)), token => :held);   -- 1048577 bytes of JSON
SELECT idem_fail('held', to_jsonb(repeat('x', 1048575)), token => :held);
SELECT idem_fail('held', to_jsonb(repeat('x', 1048575)), retryable => false, token => :held);
SELECT records_digest() = :'d0' AS nothing_written;
-- At the limits it works.
SELECT outcome FROM idem_claim(repeat('k', 512), scope => repeat('s', 512));
SELECT outcome FROM idem_claim(repeat('é', 256));
SELECT idem_once(repeat('o', 512), repeat('s', 512)) AS once_at_limit;
SELECT token AS big FROM idem_claim('big') \gset
SELECT idem_complete('big', to_jsonb(repeat('x', 1048564)), token => :big);    -- stored size exactly 1048576 bytes
SELECT outcome, octet_length(payload::text) AS payload_bytes FROM idem_claim('big');
-- The limits are GUCs (superuser).
SET idempotency.max_key_bytes = 16;
SET idempotency.max_payload_bytes = '1kB';
SELECT * FROM idem_claim(repeat('k', 17));
SELECT outcome FROM idem_claim(repeat('k', 16));
SELECT token AS small FROM idem_claim('small') \gset
SELECT idem_complete('small', to_jsonb(repeat('x', 1013)), token => :small);      -- stored size 1025 bytes
SELECT idem_complete('small', to_jsonb(repeat('x', 1012)), token => :small);      -- stored size 1024 bytes
RESET idempotency.max_key_bytes;
RESET idempotency.max_payload_bytes;
SELECT records_digest() AS d0 \gset

-----------------------------------------------------------------------------
-- P0002 no_data_found: complete / fail / heartbeat on a key that does not exist.
-----------------------------------------------------------------------------
SELECT idem_complete('missing', '1');
SELECT idem_complete('missing', '1', token => :held);
SELECT idem_fail('missing', '1');
SELECT idem_fail('missing', '1', retryable => false, token => :held);
SELECT idem_heartbeat('missing');
SELECT idem_heartbeat('missing', ttl => '1 minute', token => :held);
-- The key exists, but in another scope.
SELECT idem_complete('held', '1', scope => 'elsewhere', token => :held);
SELECT idem_heartbeat('held', scope => 'elsewhere', token => :held);
SELECT records_digest() = :'d0' AS nothing_written;

-----------------------------------------------------------------------------
-- 55000 object_not_in_prerequisite_state: the key is already terminal.
-----------------------------------------------------------------------------
SELECT idem_complete('done', '"again"', token => :done);
SELECT idem_fail('done', '"again"', token => :done);
SELECT idem_fail('done', '"again"', retryable => false, token => :done);
SELECT idem_heartbeat('done', token => :done);
SELECT idem_complete('dead', '"again"', token => :dead);
SELECT idem_fail('dead', '"again"', token => :dead);
SELECT idem_heartbeat('dead', token => :dead);
SELECT idem_complete('once', '"again"');
SELECT idem_heartbeat('once');
SELECT records_digest() = :'d0' AS nothing_written;
-- Completing twice in the transaction that claimed the key.
BEGIN;
SELECT outcome FROM idem_claim('twice');
SELECT idem_complete('twice', '1');
SELECT idem_complete('twice', '2');
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('twice');
SELECT idem_fail('twice', '1', retryable => false) AS result;
SELECT idem_heartbeat('twice');
ROLLBACK;
SELECT records_digest() = :'d0' AS nothing_written;

-----------------------------------------------------------------------------
-- 55006 object_in_use: the lease is not the caller's.
-----------------------------------------------------------------------------
-- No token, and the claim was made by another transaction.
SELECT idem_complete('held', '1');
SELECT idem_fail('held', '1');
SELECT idem_heartbeat('held');
-- A token that is not the holder's.
SELECT idem_complete('held', '1', token => :held + 1);
SELECT idem_complete('held', '1', token => :held - 1);
-- Tokens are positive: 0 and negative numbers are invalid input (22023).
SELECT idem_complete('held', '1', token => 0);
SELECT idem_heartbeat('held', token => -1);
SELECT idem_fail('held', '1', token => -9223372036854775808);
SELECT idem_complete('held', '1', token => :done);
SELECT idem_fail('held', '1', token => :held + 1);
SELECT idem_heartbeat('held', token => :held + 1);
SELECT records_digest() = :'d0' AS nothing_written;
SELECT status, attempts, token = :held AS same_token, payload IS NULL AS no_payload FROM idem_status('held');

-----------------------------------------------------------------------------
-- After an error inside a transaction, the whole transaction is gone.
-----------------------------------------------------------------------------
BEGIN;
SELECT outcome FROM idem_claim('tx-err');
SELECT idem_complete('tx-err', to_jsonb(repeat('x', 1048575)));
COMMIT;
SELECT count(*) AS rows FROM idem_status('tx-err');
SELECT records_digest() = :'d0' AS nothing_written;
-- A caught error inside a subtransaction leaves the outer claim intact.
\set VERBOSITY default
BEGIN;
SELECT outcome FROM idem_claim('tx-sub');
DO $$
BEGIN
  PERFORM idem_complete('tx-sub', to_jsonb(repeat('x', 1048575)));
EXCEPTION WHEN program_limit_exceeded THEN
  RAISE NOTICE 'caught %', SQLSTATE;
END $$;
SELECT idem_complete('tx-sub', '"fits"');
COMMIT;
SELECT outcome, payload FROM idem_claim('tx-sub');
-- The error codes can be caught by name, too.
DO $$
DECLARE states text[] := '{}';
BEGIN
  BEGIN PERFORM idem_once(NULL);
  EXCEPTION WHEN null_value_not_allowed THEN states := states || SQLSTATE; END;
  BEGIN PERFORM idem_once('');
  EXCEPTION WHEN invalid_parameter_value THEN states := states || SQLSTATE; END;
  BEGIN PERFORM idem_heartbeat('nope');
  EXCEPTION WHEN no_data_found THEN states := states || SQLSTATE; END;
  BEGIN PERFORM idem_heartbeat('once');
  EXCEPTION WHEN object_not_in_prerequisite_state THEN states := states || SQLSTATE; END;
  BEGIN PERFORM idem_heartbeat('held');
  EXCEPTION WHEN object_in_use THEN states := states || SQLSTATE; END;
  RAISE NOTICE 'caught: %', states;
END $$;
\set VERBOSITY sqlstate
