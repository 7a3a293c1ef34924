-- Claim / complete / heartbeat / status: the happy paths.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
-- A digest of everything stored (superuser view), to prove that nothing was written.
CREATE FUNCTION records_digest() RETURNS text LANGUAGE sql AS $$
  SELECT count(*) || ':' || md5(coalesce(string_agg(x, '|' ORDER BY x), ''))
  FROM (SELECT r.tableoid::regclass::text || r.ctid::text || r.xmin::text || row_to_json(r)::text AS x
        FROM idempotency.records r) s
$$;

-----------------------------------------------------------------------------
-- One-transaction mode: claim and complete in the same transaction, no token.
-----------------------------------------------------------------------------
BEGIN;
SELECT outcome, attempts, token > 0 AS has_token, payload IS NULL AS no_payload,
       expires_at > now() AS lease_live
FROM idem_claim('order-1');
SELECT status, attempts, token > 0 AS has_token, payload, error,
       expires_at > now() AS lease_live
FROM idem_status('order-1');
-- A second claim of a key this transaction already holds is in_progress.
SELECT outcome, attempts FROM idem_claim('order-1');
SELECT token AS t1 FROM idem_status('order-1') \gset
SELECT idem_complete('order-1', '{"receipt": 42, "items": ["a", "b"]}');
SELECT status, attempts, token = :t1 AS same_token, payload FROM idem_status('order-1');
COMMIT;
-- Redelivery: the stored payload is replayed.
SELECT outcome, token = :t1 AS same_token, attempts, payload FROM idem_claim('order-1');
SELECT outcome, token = :t1 AS same_token, attempts, payload FROM idem_claim('order-1', wait => false);
SELECT status, attempts, token = :t1 AS same_token, payload, error,
       created_at <= updated_at AS ordered
FROM idem_status('order-1');
-- Completing without a payload stores NULL.
BEGIN;
SELECT outcome FROM idem_claim('order-null');
SELECT idem_complete('order-null');
COMMIT;
SELECT outcome, attempts, payload IS NULL AS null_payload FROM idem_claim('order-null');
-- A token passed explicitly in one-transaction mode is accepted too.
BEGIN;
SELECT token AS t2 FROM idem_claim('order-tok') \gset
SELECT idem_complete('order-tok', '"done"', token => :t2);
COMMIT;
SELECT outcome, payload FROM idem_claim('order-tok');

-----------------------------------------------------------------------------
-- Two-transaction mode: claim and commit, work, complete with the token.
-----------------------------------------------------------------------------
SELECT outcome AS o, token AS t3, attempts AS a FROM idem_claim('order-2', ttl => '10 minutes') \gset
SELECT :'o' AS outcome, :a AS attempts, :t3 > 0 AS has_token;
SELECT status, attempts, token = :t3 AS same_token, payload IS NULL AS no_payload,
       expires_at > now() AS lease_live
FROM idem_status('order-2');
-- While the lease is live, another claimer gets in_progress (waiting or not).
SELECT outcome, attempts, token IS NULL AS no_token,
       expires_at > now() + interval '9 minutes' AS lease_expiry_reported
FROM idem_claim('order-2');
SELECT outcome, attempts FROM idem_claim('order-2', wait => false);
SELECT idem_complete('order-2', '{"receipt": 43}', token => :t3);
SELECT outcome, token = :t3 AS same_token, attempts, payload FROM idem_claim('order-2');
SELECT status, attempts, payload, error FROM idem_status('order-2');

-----------------------------------------------------------------------------
-- Heartbeat extends the lease.
-----------------------------------------------------------------------------
SELECT token AS th, expires_at AS e0 FROM idem_claim('hb', ttl => '1 minute') \gset
SELECT idem_heartbeat('hb', ttl => '1 hour', token => :th) AS e1 \gset
SELECT :'e1'::timestamptz > :'e0'::timestamptz AS extended,
       :'e1'::timestamptz > now() + interval '59 minutes'
         AND :'e1'::timestamptz < clock_timestamp() + interval '61 minutes' AS about_one_hour;
SELECT status, attempts, token = :th AS same_token,
       expires_at = :'e1'::timestamptz AS stored
FROM idem_status('hb');
-- ttl NULL: the lease_ttl GUC (5min).
SELECT idem_heartbeat('hb', token => :th) > now() + interval '4 minutes' AS about_five_minutes;
-- In one-transaction mode without a token.
BEGIN;
SELECT outcome FROM idem_claim('hb-1tx', ttl => '1 minute');
SELECT idem_heartbeat('hb-1tx', ttl => '2 hours') > now() + interval '119 minutes' AS extended;
SELECT expires_at > now() + interval '119 minutes' AS stored FROM idem_status('hb-1tx');
SELECT idem_complete('hb-1tx', '1');
COMMIT;
SELECT outcome, payload FROM idem_claim('hb-1tx');

-----------------------------------------------------------------------------
-- Fingerprints: same key, different request.
-----------------------------------------------------------------------------
BEGIN;
SELECT outcome FROM idem_claim('pay-1', fingerprint => 'sha256:aaaa');
SELECT idem_complete('pay-1', '{"charged": 100}');
COMMIT;
SELECT outcome, attempts, payload FROM idem_claim('pay-1', fingerprint => 'sha256:aaaa');
SELECT outcome, attempts, token IS NULL AS no_token, payload IS NULL AS no_payload
FROM idem_claim('pay-1', fingerprint => 'sha256:bbbb');
SELECT outcome FROM idem_claim('pay-1', fingerprint => 'sha256:bbbb', wait => false);
SELECT status, payload FROM idem_status('pay-1');

-----------------------------------------------------------------------------
-- Scopes are independent namespaces.
-----------------------------------------------------------------------------
BEGIN;
SELECT outcome FROM idem_claim('shared-key', scope => 'billing');
SELECT idem_complete('shared-key', '"billing"', scope => 'billing');
COMMIT;
SELECT outcome, attempts FROM idem_claim('shared-key', scope => 'shipping');
SELECT outcome, payload FROM idem_claim('shared-key', scope => 'billing');
SELECT count(*) AS default_scope_rows FROM idem_status('shared-key');
SELECT status FROM idem_status('shared-key', scope => 'shipping');
SELECT status, payload FROM idem_status('shared-key', 'billing');

-----------------------------------------------------------------------------
-- wait => false on a free key claims it.
-----------------------------------------------------------------------------
SELECT outcome, attempts, token > 0 AS has_token FROM idem_claim('free-nowait', wait => false);

-----------------------------------------------------------------------------
-- Tokens grow: every claim's token is larger than all earlier ones of the key.
-----------------------------------------------------------------------------
SELECT token AS k1 FROM idem_claim('grow', ttl => '1 millisecond') \gset
SELECT pg_sleep(0.05);
SELECT outcome, attempts, token > :k1 AS bigger FROM idem_claim('grow', ttl => '1 millisecond');
SELECT token AS k2 FROM idem_status('grow') \gset
SELECT pg_sleep(0.05);
SELECT outcome, attempts, token > :k2 AS bigger FROM idem_claim('grow');

-----------------------------------------------------------------------------
-- A rolled back transaction leaves no trace.
-----------------------------------------------------------------------------
SELECT records_digest() AS d0 \gset
BEGIN;
SELECT outcome FROM idem_claim('rb-1');
SELECT idem_complete('rb-1', '"never"');
SELECT idem_once('rb-2');
SELECT outcome FROM idem_claim('rb-3', ttl => '1 hour');
SELECT idem_fail('rb-3', '"nope"', retryable => false);
ROLLBACK;
SELECT records_digest() = :'d0' AS nothing_written;
SELECT count(*) AS rows FROM idem_status('rb-1');
SELECT count(*) AS rows FROM idem_status('rb-2');
SELECT count(*) AS rows FROM idem_status('rb-3');
SELECT outcome, attempts FROM idem_claim('rb-1');
SELECT idem_once('rb-2');
-- Same for a rolled back completion of a committed claim: the claim stays pending.
SELECT token AS tr FROM idem_claim('rb-4') \gset
BEGIN;
SELECT idem_complete('rb-4', '"x"', token => :tr);
ROLLBACK;
SELECT status, attempts, token = :tr AS same_token, payload IS NULL AS no_payload FROM idem_status('rb-4');
SELECT idem_complete('rb-4', '"y"', token => :tr);
SELECT status, payload FROM idem_status('rb-4');
-- And a savepoint rolled back inside a committed transaction.
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_claim('rb-5');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS rows FROM idem_status('rb-5');
COMMIT;
SELECT count(*) AS rows FROM idem_status('rb-5');
-- Without a token, idem_complete settles a claim this transaction made: in a savepoint released before, in
-- the savepoint it is called from, and two claims of one transaction, each (the common path matches a row
-- written by the transaction itself, the long way one written by any of its subtransactions).
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_claim('sp-1');
RELEASE SAVEPOINT s;
SELECT idem_complete('sp-1', '"a"');
SAVEPOINT t;
SELECT outcome FROM idem_claim('sp-2');
SELECT idem_complete('sp-2', '"b"');
RELEASE SAVEPOINT t;
SELECT outcome FROM idem_claim('sp-3');
SELECT outcome FROM idem_claim('sp-4');
SELECT idem_complete('sp-3', '"c"');
SAVEPOINT u;
SELECT idem_complete('sp-4', '"d"');
RELEASE SAVEPOINT u;
COMMIT;
SELECT key, status, payload FROM (VALUES ('sp-1'), ('sp-2'), ('sp-3'), ('sp-4')) k(key), idem_status(k.key) ORDER BY key;
-- A claim this transaction released (a retryable failure) is not its to complete any more.
BEGIN;
SELECT outcome FROM idem_claim('sp-5');
SELECT idem_fail('sp-5', '"boom"');
SELECT idem_complete('sp-5', '"e"');
ROLLBACK;

-- idem_claim answers one row however it is called: in FROM, in the select list, as a whole row, once per
-- row of another relation (the native edition answers it in materialize mode: src/api/one_row.rs).
SELECT outcome, token IS NOT NULL AS has_token, attempts, payload FROM idem_claim('form-1');
SELECT (idem_claim('form-1')).outcome;
SELECT (c).outcome, (c).token IS NOT NULL AS has_token FROM (SELECT idem_claim('form-2') AS c) s;
SELECT row_to_json(c)::jsonb - 'expires_at' - 'token' AS claim FROM idem_claim('form-3') c;
SELECT array_agg(k ORDER BY k) AS columns
FROM (SELECT row_to_json(idem_claim('form-4')) AS j) s, json_object_keys(s.j) k;
SELECT g, (idem_claim('form-5-' || g)).outcome FROM generate_series(1, 3) g;
SELECT g, c.outcome, c.attempts FROM generate_series(1, 3) g, LATERAL idem_claim('form-6-' || g) c ORDER BY g;
SELECT count(*) AS claims, count(DISTINCT (c).token) AS tokens
FROM (SELECT idem_claim('form-7-' || g) AS c FROM generate_series(1, 200) g) s;
-- Beside another set-returning function in the select list the claim is made once: its row, then NULLs.
BEGIN;
SELECT (c).outcome, g FROM (SELECT idem_claim('form-9') AS c, generate_series(1, 3) AS g) s;
SELECT status, attempts FROM idem_status('form-9');
COMMIT;
\set VERBOSITY terse
DO $$
DECLARE r record;
BEGIN
    SELECT * INTO r FROM idem_claim('form-8');
    RAISE NOTICE 'first: %', r.outcome;
    PERFORM idem_complete('form-8', '"done"');
    SELECT * INTO r FROM idem_claim('form-8');
    RAISE NOTICE 'again: % %', r.outcome, r.payload;
END
$$;
\set VERBOSITY sqlstate
