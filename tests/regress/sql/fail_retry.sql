-- Failures, retries, attempts, max_attempts, lease takeover and stale tokens.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
CREATE FUNCTION records_digest() RETURNS text LANGUAGE sql AS $$
  SELECT count(*) || ':' || md5(coalesce(string_agg(x, '|' ORDER BY x), ''))
  FROM (SELECT r.tableoid::regclass::text || r.ctid::text || r.xmin::text || row_to_json(r)::text AS x
        FROM idempotency.records r) s
$$;

-----------------------------------------------------------------------------
-- Retryable failure releases the key; the next claim is attempt 2.
-----------------------------------------------------------------------------
BEGIN;
SELECT outcome, attempts FROM idem_claim('msg-1');
SELECT idem_fail('msg-1', '{"error": "timeout"}');
COMMIT;
-- Released: still pending, nobody holds it, lease in the past, last error kept.
SELECT status, attempts, token IS NULL AS no_token, expires_at <= now() AS lease_over,
       payload IS NULL AS no_payload, error
FROM idem_status('msg-1');
SELECT outcome, attempts, token > 0 AS has_token, expires_at > now() AS lease_live
FROM idem_claim('msg-1');
SELECT token AS t FROM idem_status('msg-1') \gset
SELECT idem_complete('msg-1', '"ok on 2nd try"', token => :t);
SELECT outcome, attempts, payload FROM idem_claim('msg-1');
SELECT status, attempts, payload FROM idem_status('msg-1');

-- Two-transaction mode: fail with the token.
SELECT token AS t FROM idem_claim('msg-2') \gset
SELECT idem_fail('msg-2', '{"error": "503"}', token => :t) AS result;
SELECT status, attempts, token IS NULL AS no_token, error FROM idem_status('msg-2');
-- The released token is dead: 55006, and nothing changes.
SELECT records_digest() AS d0 \gset
SELECT idem_complete('msg-2', '"late"', token => :t);
SELECT idem_heartbeat('msg-2', token => :t);
SELECT idem_fail('msg-2', '"late"', token => :t);
SELECT records_digest() = :'d0' AS nothing_written;
SELECT outcome, attempts, token > :t AS bigger FROM idem_claim('msg-2', wait => false);

-----------------------------------------------------------------------------
-- retryable => false: terminal at once; later claims replay the error.
-----------------------------------------------------------------------------
BEGIN;
SELECT outcome FROM idem_claim('poison-1');
SELECT idem_fail('poison-1', '{"error": "bad input", "field": "amount"}', retryable => false) AS result;
COMMIT;
SELECT status, attempts, error FROM idem_status('poison-1');
SELECT outcome, attempts, token IS NULL AS no_token, payload FROM idem_claim('poison-1');
SELECT outcome, attempts, payload FROM idem_claim('poison-1', wait => false);
-- Terminal in two-transaction mode too.
SELECT token AS t FROM idem_claim('poison-2') \gset
SELECT idem_fail('poison-2', '"fatal"', retryable => false, token => :t) AS result;
SELECT outcome, attempts, payload FROM idem_claim('poison-2');
-- A NULL error is stored as NULL.
BEGIN;
SELECT outcome FROM idem_claim('poison-3');
SELECT idem_fail('poison-3', retryable => false) AS result;
COMMIT;
SELECT outcome, payload IS NULL AS null_payload FROM idem_claim('poison-3');

-----------------------------------------------------------------------------
-- Stale token after a takeover: the old holder is fenced off with 55006.
-----------------------------------------------------------------------------
SELECT outcome AS o, token AS old FROM idem_claim('lease-1', ttl => '1 millisecond') \gset
SELECT :'o' AS outcome;
SELECT pg_sleep(0.05);
SELECT status, expires_at < now() AS expired FROM idem_status('lease-1');
SELECT outcome, attempts, token > :old AS bigger, expires_at > now() AS lease_live
FROM idem_claim('lease-1', ttl => '1 hour');
SELECT token AS new FROM idem_status('lease-1') \gset
SELECT records_digest() AS d0 \gset
SELECT idem_complete('lease-1', '"from old holder"', token => :old);
SELECT idem_heartbeat('lease-1', ttl => '1 hour', token => :old);
SELECT idem_fail('lease-1', '"from old holder"', token => :old);
SELECT idem_fail('lease-1', '"from old holder"', retryable => false, token => :old);
-- No token from another transaction than the claimer's: 55006 as well.
SELECT idem_complete('lease-1', '"no token"');
SELECT idem_heartbeat('lease-1');
SELECT idem_fail('lease-1');
-- A token that never existed.
SELECT idem_complete('lease-1', '"bogus"', token => :new + 1000);
SELECT records_digest() = :'d0' AS nothing_written;
SELECT status, attempts, token = :new AS new_holder FROM idem_status('lease-1');
-- The new holder is unaffected.
SELECT idem_heartbeat('lease-1', ttl => '2 hours', token => :new) > now() + interval '119 minutes' AS extended;
SELECT idem_complete('lease-1', '"from new holder"', token => :new);
SELECT outcome, attempts, token = :new AS same_token, payload FROM idem_claim('lease-1');

-----------------------------------------------------------------------------
-- max_attempts: a takeover when the key already had max_attempts claims
-- makes the key terminal.
-----------------------------------------------------------------------------
SET idempotency.max_attempts = 2;
SELECT outcome, attempts FROM idem_claim('crashy', ttl => '1 millisecond');
SELECT pg_sleep(0.05);
SELECT outcome, attempts FROM idem_claim('crashy', ttl => '1 millisecond');
SELECT token AS t FROM idem_status('crashy') \gset
SELECT pg_sleep(0.05);
SELECT outcome, attempts, payload->>'error' AS error FROM idem_claim('crashy');
SELECT status, attempts, error->>'error' AS error FROM idem_status('crashy');
SELECT outcome, attempts, payload->>'error' AS error FROM idem_claim('crashy');
-- It is terminal: the last holder cannot complete any more.
SELECT idem_complete('crashy', '"too late"', token => :t);
RESET idempotency.max_attempts;
-- The GUC is read at claim time: raising it does not revive a failed key.
SELECT outcome FROM idem_claim('crashy');

-- max_attempts with retryable failures: at most max_attempts claims succeed.
SET idempotency.max_attempts = 3;
BEGIN;
SELECT outcome, attempts FROM idem_claim('flaky');
SELECT idem_fail('flaky', '{"error": "e1"}') AS result;
COMMIT;
BEGIN;
SELECT outcome, attempts FROM idem_claim('flaky');
SELECT idem_fail('flaky', '{"error": "e2"}') AS result;
COMMIT;
BEGIN;
SELECT outcome, attempts FROM idem_claim('flaky');
-- The last allowed attempt fails: terminal at once (see COMMENT ON FUNCTION idem_fail).
SELECT idem_fail('flaky', '{"error": "e3"}') AS result;
COMMIT;
SELECT status, attempts, error FROM idem_status('flaky');
SELECT outcome, attempts, payload FROM idem_claim('flaky');
SELECT outcome FROM idem_claim('flaky');
SELECT status FROM idem_status('flaky');
RESET idempotency.max_attempts;

-- Default max_attempts is 5: five claims, the sixth finds the key terminal.
SELECT outcome, attempts FROM idem_claim('five', ttl => '1 millisecond');
SELECT pg_sleep(0.02);
SELECT outcome, attempts FROM idem_claim('five', ttl => '1 millisecond');
SELECT pg_sleep(0.02);
SELECT outcome, attempts FROM idem_claim('five', ttl => '1 millisecond');
SELECT pg_sleep(0.02);
SELECT outcome, attempts FROM idem_claim('five', ttl => '1 millisecond');
SELECT pg_sleep(0.02);
SELECT outcome, attempts FROM idem_claim('five', ttl => '1 millisecond');
SELECT pg_sleep(0.02);
SELECT outcome, payload->>'error' AS error FROM idem_claim('five');
