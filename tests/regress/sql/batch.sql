-- Batches: idem_claim_batch / idem_complete_batch / idem_once_batch.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
-- A digest of everything stored (superuser view), to prove that nothing was written.
CREATE FUNCTION records_digest() RETURNS text LANGUAGE sql AS $$
  SELECT count(*) || ':' || md5(coalesce(string_agg(x, '|' ORDER BY x), ''))
  FROM (SELECT r.tableoid::regclass::text || r.ctid::text || r.xmin::text || row_to_json(r)::text AS x
        FROM idempotency.records r) s
$$;

-- Exact argument lists and results of the batch contract.
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments
FROM pg_proc p
WHERE p.proname IN ('idem_claim_batch', 'idem_complete_batch', 'idem_once_batch')
ORDER BY p.proname;
SELECT p.proname, pg_get_function_result(p.oid) AS result
FROM pg_proc p
WHERE p.proname IN ('idem_claim_batch', 'idem_complete_batch', 'idem_once_batch')
ORDER BY p.proname;

-----------------------------------------------------------------------------
-- idem_claim_batch: one row per input key, in input order (not sorted).
-----------------------------------------------------------------------------
BEGIN;
SELECT ordinality AS n, key, outcome, attempts, token > 0 AS has_token, payload IS NULL AS no_payload,
       expires_at > now() AS lease_live
FROM idem_claim_batch(ARRAY['c-3', 'c-1', 'c-2']) WITH ORDINALITY;
-- Each key is claimed exactly as by idem_claim.
SELECT key, s.status, s.attempts, s.token > 0 AS has_token
FROM unnest(ARRAY['c-1', 'c-2', 'c-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- Claiming again in the same transaction: the keys are held, in_progress.
SELECT ordinality AS n, key, outcome, attempts, token IS NULL AS no_token
FROM idem_claim_batch(ARRAY['c-1', 'c-2', 'c-3']) WITH ORDINALITY;
-- One-transaction mode: complete without tokens, payloads paired with keys by position.
SELECT idem_complete_batch(ARRAY['c-2', 'c-3', 'c-1'],
                           ARRAY['{"n": 2}', '{"n": 3}', '{"n": 1}']::jsonb[]) AS completed;
COMMIT;
-- Redelivery of the batch: every key replays its own payload.
SELECT ordinality AS n, key, outcome, attempts, token > 0 AS has_token, payload
FROM idem_claim_batch(ARRAY['c-1', 'c-2', 'c-3']) WITH ORDINALITY;
SELECT key, s.status, s.payload
FROM unnest(ARRAY['c-1', 'c-2', 'c-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- The token replayed by a completed key is the one of its claim.
SELECT b.token = s.token AS same_token
FROM idem_claim_batch(ARRAY['c-1']) b, idem_status('c-1') s;
-- Without payloads, NULL is stored.
BEGIN;
SELECT key, outcome FROM idem_claim_batch(ARRAY['np-1', 'np-2']);
SELECT idem_complete_batch(ARRAY['np-1', 'np-2']) AS completed;
COMMIT;
SELECT key, outcome, payload IS NULL AS null_payload FROM idem_claim_batch(ARRAY['np-1', 'np-2']);
-- Empty batches answer nothing and write nothing.
SELECT records_digest() AS d0 \gset
SELECT count(*) AS rows FROM idem_claim_batch('{}'::text[]);
SELECT idem_complete_batch('{}'::text[]) AS completed;
SELECT count(*) AS rows FROM idem_once_batch('{}'::text[]);
SELECT records_digest() = :'d0' AS nothing_written;

-----------------------------------------------------------------------------
-- ttl and scope.
-----------------------------------------------------------------------------
SELECT key, outcome, expires_at > now() + interval '59 minutes'
                     AND expires_at < clock_timestamp() + interval '61 minutes' AS about_one_hour
FROM idem_claim_batch(ARRAY['ttl-1', 'ttl-2'], ttl => '1 hour');
SET idempotency.lease_ttl = '10min';
SELECT key, outcome, expires_at > now() + interval '9 minutes'
                     AND expires_at < clock_timestamp() + interval '11 minutes' AS about_ten_minutes
FROM idem_claim_batch(ARRAY['ttl-3'], ttl => NULL);
RESET idempotency.lease_ttl;
SELECT key, outcome, expires_at > now() + interval '4 minutes'
                     AND expires_at < clock_timestamp() + interval '6 minutes' AS about_five_minutes
FROM idem_claim_batch(ARRAY['ttl-4']);
-- Scopes are separate namespaces: c-1 is new in scope 'other'.
SELECT key, outcome, attempts FROM idem_claim_batch(ARRAY['c-1', 'c-9'], scope => 'other');
SELECT status FROM idem_status('c-1', 'other');
SELECT count(*) AS default_scope_rows FROM idem_status('c-9');
BEGIN;
SELECT key, outcome FROM idem_claim_batch(ARRAY['sc-1'], scope => 'other');
SELECT idem_complete_batch(ARRAY['sc-1'], ARRAY['"other"']::jsonb[], scope => 'other') AS completed;
COMMIT;
SELECT status, payload FROM idem_status('sc-1', 'other');
SELECT count(*) AS default_scope_rows FROM idem_status('sc-1');

-----------------------------------------------------------------------------
-- Duplicates inside one batch.
-----------------------------------------------------------------------------
-- A new key repeated: only the first occurrence is claimed, the repeats are in_progress.
BEGIN;
SELECT ordinality AS n, key, outcome, attempts, token > 0 AS has_token, token IS NULL AS no_token
FROM idem_claim_batch(ARRAY['d-1', 'd-2', 'd-1', 'd-3', 'd-1', 'd-2']) WITH ORDINALITY;
SELECT key, s.status, s.attempts
FROM unnest(ARRAY['d-1', 'd-2', 'd-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- idem_complete_batch refuses repeats (22023).
SELECT idem_complete_batch(ARRAY['d-1', 'd-2', 'd-1']);
ROLLBACK;
BEGIN;
SELECT count(*) AS rows FROM idem_claim_batch(ARRAY['d-1', 'd-2', 'd-3']);
SELECT idem_complete_batch(ARRAY['d-1', 'd-2', 'd-3', 'd-2'],
                           ARRAY['1', '2', '3', '4']::jsonb[]);
ROLLBACK;
BEGIN;
SELECT count(*) AS rows FROM idem_claim_batch(ARRAY['d-1', 'd-2', 'd-3']);
SELECT idem_complete_batch(ARRAY['d-1', 'd-2', 'd-3'], ARRAY['1', '2', '3']::jsonb[]) AS completed;
COMMIT;
-- A settled key repeated: every occurrence replays the same answer.
SELECT ordinality AS n, key, outcome, attempts, payload
FROM idem_claim_batch(ARRAY['d-2', 'd-2', 'd-1']) WITH ORDINALITY;
-- A key held by a committed live lease, repeated: in_progress each time.
SELECT token AS dheld FROM idem_claim('d-held', ttl => '1 hour') \gset
SELECT ordinality AS n, key, outcome, attempts, token IS NULL AS no_token,
       expires_at > now() + interval '59 minutes' AS lease_reported
FROM idem_claim_batch(ARRAY['d-held', 'd-held']) WITH ORDINALITY;
-- idem_once_batch counts a repeated key once, in input order of first appearance.
SELECT ordinality AS n, k FROM idem_once_batch(ARRAY['o-2', 'o-1', 'o-2', 'o-3', 'o-1']) WITH ORDINALITY AS t(k);
-- Only the keys never seen before come back.
SELECT ordinality AS n, k FROM idem_once_batch(ARRAY['o-4', 'o-1', 'o-5', 'o-4', 'o-3']) WITH ORDINALITY AS t(k);
SELECT count(*) AS rows FROM idem_once_batch(ARRAY['o-1', 'o-2', 'o-3', 'o-4', 'o-5']);
-- Written as completed, like idem_once.
SELECT key, s.status, s.attempts, s.token IS NULL AS no_token
FROM unnest(ARRAY['o-1', 'o-4']) AS key, LATERAL idem_status(key) s
ORDER BY key;
SELECT idem_once('o-5') AS single_after_batch;
SELECT idem_once('o-6') AS single_first;
SELECT k FROM idem_once_batch(ARRAY['o-6', 'o-7']) AS t(k);
-- Claimed and completed keys are not new for idem_once_batch either.
SELECT k FROM idem_once_batch(ARRAY['d-held', 'c-1', 'o-8']) AS t(k);
-- Twice in one transaction: new, then not.
BEGIN;
SELECT k FROM idem_once_batch(ARRAY['o-9', 'o-10']) AS t(k);
SELECT count(*) AS rows FROM idem_once_batch(ARRAY['o-10', 'o-9']);
COMMIT;
-- Scopes are separate.
SELECT k FROM idem_once_batch(ARRAY['o-1', 'o-9'], scope => 'other') AS t(k);
SELECT k FROM idem_once_batch(ARRAY['o-1', 'o-9'], 'other') AS t(k);

-----------------------------------------------------------------------------
-- Mixed outcomes in one batch: completed, failed, in_progress and claimed
-- (new, taken over after expiry, retried after a retryable failure).
-----------------------------------------------------------------------------
BEGIN;
SELECT token AS mdone FROM idem_claim('m-done') \gset
SELECT idem_complete('m-done', '{"receipt": 7}');
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim('m-dead');
SELECT idem_fail('m-dead', '{"error": "fatal"}', retryable => false) AS result;
COMMIT;
SELECT outcome FROM idem_claim('m-held', ttl => '1 hour');
BEGIN;
SELECT outcome FROM idem_claim('m-released');
SELECT idem_fail('m-released', '{"error": "timeout"}') AS result;
COMMIT;
SELECT token AS mexp FROM idem_claim('m-expired', ttl => '1 millisecond') \gset
SELECT pg_sleep(0.05);
BEGIN;
SELECT ordinality AS n, key, outcome, attempts, token > 0 AS has_token, payload,
       expires_at > now() AS lease_live
FROM idem_claim_batch(ARRAY['m-new', 'm-done', 'm-dead', 'm-held', 'm-released', 'm-expired'],
                      ttl => '1 hour') WITH ORDINALITY;
SELECT token = :mdone AS done_token_replayed FROM idem_claim_batch(ARRAY['m-done']);
SELECT token > :mexp AS bigger FROM idem_status('m-expired');
-- Complete the keys this batch claimed, in another order.
SELECT idem_complete_batch(ARRAY['m-expired', 'm-new', 'm-released'],
                           ARRAY['"e"', '"n"', '"r"']::jsonb[]) AS completed;
COMMIT;
SELECT ordinality AS n, key, outcome, attempts, payload
FROM idem_claim_batch(ARRAY['m-new', 'm-done', 'm-dead', 'm-held', 'm-released', 'm-expired'])
     WITH ORDINALITY;
-- The old holder of m-expired lost its lease.
SELECT idem_complete('m-expired', '"late"', token => :mexp);
-- Failed and held keys are not new for idem_once_batch.
SELECT count(*) AS rows FROM idem_once_batch(ARRAY['m-dead', 'm-held']);

-----------------------------------------------------------------------------
-- Two-transaction mode: tokens from a committed batch claim, paired by position.
-----------------------------------------------------------------------------
SELECT max(token) FILTER (WHERE key = 't-1') AS tok1,
       max(token) FILTER (WHERE key = 't-2') AS tok2,
       max(token) FILTER (WHERE key = 't-3') AS tok3,
       count(*) FILTER (WHERE outcome = 'claimed') AS claimed
FROM idem_claim_batch(ARRAY['t-1', 't-2', 't-3'], ttl => '1 hour') \gset
SELECT :claimed AS claimed, :tok1 <> :tok2 AND :tok2 <> :tok3 AND :tok1 <> :tok3 AS distinct_tokens;
SELECT key, s.status, s.attempts,
       s.token = CASE key WHEN 't-1' THEN :tok1 WHEN 't-2' THEN :tok2 ELSE :tok3 END AS token_matches
FROM unnest(ARRAY['t-1', 't-2', 't-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- A batch token works with the single-key calls too.
SELECT idem_heartbeat('t-2', ttl => '2 hours', token => :tok2) > now() + interval '119 minutes' AS extended;
SELECT records_digest() AS d0 \gset
-- Without tokens, from another transaction than the claim's: 55006.
SELECT idem_complete_batch(ARRAY['t-1', 't-2', 't-3']);
SELECT idem_complete_batch(ARRAY['t-1']);
-- Tokens swapped between keys: 55006.
SELECT idem_complete_batch(ARRAY['t-1', 't-2'], tokens => ARRAY[:tok2, :tok1]);
-- Tokens are positive (22023).
SELECT idem_complete_batch(ARRAY['t-1', 't-2'], tokens => ARRAY[:tok1, 0]);
SELECT idem_complete_batch(ARRAY['t-1', 't-2'], tokens => ARRAY[-1, :tok2]::bigint[]);
SELECT records_digest() = :'d0' AS nothing_written;
SELECT key, s.status, s.payload IS NULL AS no_payload
FROM unnest(ARRAY['t-1', 't-2', 't-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- Right tokens, keys in another order than the claim's: payloads and tokens pair by position.
SELECT idem_complete_batch(ARRAY['t-3', 't-1', 't-2'],
                           ARRAY['"three"', '"one"', '"two"']::jsonb[],
                           tokens => ARRAY[:tok3, :tok1, :tok2]) AS completed;
SELECT ordinality AS n, key, outcome, payload
FROM idem_claim_batch(ARRAY['t-1', 't-2', 't-3']) WITH ORDINALITY;
SELECT key, s.status, s.payload,
       s.token = CASE key WHEN 't-1' THEN :tok1 WHEN 't-2' THEN :tok2 ELSE :tok3 END AS token_kept
FROM unnest(ARRAY['t-1', 't-2', 't-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- Once completed, the same call is refused (55000) and changes nothing.
SELECT records_digest() AS d0 \gset
SELECT idem_complete_batch(ARRAY['t-3', 't-1', 't-2'],
                           ARRAY['"again"', '"again"', '"again"']::jsonb[],
                           tokens => ARRAY[:tok3, :tok1, :tok2]);
SELECT records_digest() = :'d0' AS nothing_written;

-----------------------------------------------------------------------------
-- All or nothing: one bad key in idem_complete_batch writes nothing.
-----------------------------------------------------------------------------
SELECT max(token) FILTER (WHERE key = 'a-1') AS a1,
       max(token) FILTER (WHERE key = 'a-2') AS a2
FROM idem_claim_batch(ARRAY['a-1', 'a-2'], ttl => '1 hour') \gset
SELECT token AS a3old FROM idem_claim('a-3', ttl => '1 millisecond') \gset
SELECT pg_sleep(0.05);
SELECT token AS a3 FROM idem_claim('a-3', ttl => '1 hour') \gset
SELECT token AS adead FROM idem_claim('a-dead', ttl => '1 hour') \gset
SELECT idem_fail('a-dead', '"fatal"', retryable => false, token => :adead) AS result;
SELECT token AS cdone FROM idem_status('c-1') \gset
SELECT records_digest() AS d0 \gset
-- An unknown key (P0002), first or last.
SELECT idem_complete_batch(ARRAY['a-1', 'a-2', 'a-missing'], tokens => ARRAY[:a1, :a2, :a1]);
SELECT idem_complete_batch(ARRAY['a-missing', 'a-1'], tokens => ARRAY[:a1, :a1]);
-- A stale token (taken over since): 55006.
SELECT idem_complete_batch(ARRAY['a-1', 'a-3', 'a-2'], tokens => ARRAY[:a1, :a3old, :a2]);
-- A key already completed (55000) or failed (55000).
SELECT idem_complete_batch(ARRAY['a-1', 'c-1'], tokens => ARRAY[:a1, :cdone]);
SELECT idem_complete_batch(ARRAY['a-1', 'a-dead'], tokens => ARRAY[:a1, :adead]);
-- A payload over idempotency.max_payload_bytes: 54000.
SELECT idem_complete_batch(ARRAY['a-1', 'a-2'],
                           ARRAY['"small"'::jsonb, to_jsonb(repeat('x', 1048575))],
                           tokens => ARRAY[:a1, :a2]);
SELECT records_digest() = :'d0' AS nothing_written;
SELECT key, s.status, s.payload IS NULL AS no_payload,
       s.token = CASE key WHEN 'a-1' THEN :a1 WHEN 'a-2' THEN :a2 ELSE :a3 END AS holder_unchanged
FROM unnest(ARRAY['a-1', 'a-2', 'a-3']) AS key, LATERAL idem_status(key) s
ORDER BY key;
-- The good call afterwards completes all three.
SELECT idem_complete_batch(ARRAY['a-1', 'a-2', 'a-3'], tokens => ARRAY[:a1, :a2, :a3]) AS completed;
SELECT key, outcome FROM idem_claim_batch(ARRAY['a-1', 'a-2', 'a-3']);

-----------------------------------------------------------------------------
-- A rolled back batch leaves no trace.
-----------------------------------------------------------------------------
SELECT records_digest() AS d0 \gset
BEGIN;
SELECT key, outcome FROM idem_claim_batch(ARRAY['rb-1', 'rb-2']);
SELECT idem_complete_batch(ARRAY['rb-1', 'rb-2']) AS completed;
SELECT k FROM idem_once_batch(ARRAY['rb-3', 'rb-4']) AS t(k);
ROLLBACK;
SELECT records_digest() = :'d0' AS nothing_written;
SELECT key, outcome, attempts FROM idem_claim_batch(ARRAY['rb-1', 'rb-2']);
SELECT k FROM idem_once_batch(ARRAY['rb-3', 'rb-4']) AS t(k);

-----------------------------------------------------------------------------
-- Bad input: nothing is written.
-----------------------------------------------------------------------------
SELECT token AS bheld FROM idem_claim('b-held', ttl => '1 hour') \gset
SELECT records_digest() AS d0 \gset
-- 22004: a NULL array, a NULL key in the array, a NULL scope.
SELECT * FROM idem_claim_batch(NULL);
SELECT * FROM idem_claim_batch(ARRAY['b-new', NULL]);
SELECT * FROM idem_claim_batch(ARRAY[NULL]::text[]);
SELECT * FROM idem_claim_batch(ARRAY['b-new'], scope => NULL);
SELECT idem_complete_batch(NULL);
SELECT idem_complete_batch(NULL, tokens => ARRAY[:bheld]);
SELECT idem_complete_batch(ARRAY['b-held', NULL], tokens => ARRAY[:bheld, :bheld]);
SELECT idem_complete_batch(ARRAY['b-held'], scope => NULL, tokens => ARRAY[:bheld]);
SELECT * FROM idem_once_batch(NULL);
SELECT * FROM idem_once_batch(ARRAY['b-new', NULL]);
SELECT * FROM idem_once_batch(ARRAY['b-new'], NULL);
SELECT records_digest() = :'d0' AS nothing_written;
-- 22023: empty or control-character keys and scopes, ttl <= 0.
SELECT * FROM idem_claim_batch(ARRAY['b-new', '']);
SELECT * FROM idem_claim_batch(ARRAY['b-new', E'b\nnew']);
SELECT * FROM idem_claim_batch(ARRAY['b-new'], scope => '');
SELECT * FROM idem_claim_batch(ARRAY['b-new'], ttl => '0 seconds');
SELECT * FROM idem_claim_batch(ARRAY['b-new'], ttl => '-1 minute');
SELECT idem_complete_batch(ARRAY['b-held', ''], tokens => ARRAY[:bheld, :bheld]);
SELECT idem_complete_batch(ARRAY['b-held'], scope => '', tokens => ARRAY[:bheld]);
SELECT * FROM idem_once_batch(ARRAY['b-new', '']);
SELECT * FROM idem_once_batch(ARRAY[E'\x01']);
SELECT * FROM idem_once_batch(ARRAY['b-new'], '');
-- 22023: payloads or tokens of another length than keys.
SELECT idem_complete_batch(ARRAY['b-held'], ARRAY['1', '2']::jsonb[], tokens => ARRAY[:bheld]);
SELECT idem_complete_batch(ARRAY['b-held'], '{}'::jsonb[], tokens => ARRAY[:bheld]);
SELECT idem_complete_batch(ARRAY['b-held'], tokens => ARRAY[:bheld, :bheld]);
SELECT idem_complete_batch(ARRAY['b-held'], tokens => '{}'::bigint[]);
SELECT records_digest() = :'d0' AS nothing_written;
-- 54000: a key or scope over idempotency.max_key_bytes.
SELECT * FROM idem_claim_batch(ARRAY['b-new', repeat('k', 513)]);
SELECT * FROM idem_claim_batch(ARRAY['b-new'], scope => repeat('s', 513));
SELECT idem_complete_batch(ARRAY['b-held', repeat('k', 513)], tokens => ARRAY[:bheld, :bheld]);
SELECT * FROM idem_once_batch(ARRAY[repeat('k', 513), 'b-new']);
-- In bytes, whatever the characters (the batches' single test measures each key with octet_length):
-- 514 and 516 bytes are refused, 512 taken.
SELECT * FROM idem_once_batch(ARRAY['b-new', repeat('é', 257)]);
SELECT * FROM idem_claim_batch(ARRAY['b-new', repeat('🙂', 129)]);
SELECT records_digest() = :'d0' AS nothing_written;
BEGIN;
SELECT count(*) FROM idem_once_batch(ARRAY[repeat('k', 512), repeat('é', 256), repeat('🙂', 128), 'b-new']);
ROLLBACK;

-----------------------------------------------------------------------------
-- 54000: more keys than idempotency.max_batch_keys (default 1000).
-----------------------------------------------------------------------------
SELECT count(*) FROM idem_claim_batch(ARRAY(SELECT 'big-' || i FROM generate_series(1, 1001) i));
SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'big-' || i FROM generate_series(1, 1001) i));
SELECT idem_complete_batch(ARRAY(SELECT 'big-' || i FROM generate_series(1, 1001) i));
SELECT records_digest() = :'d0' AS nothing_written;
-- The limit is a superuser GUC.
SET idempotency.max_batch_keys = 3;
SHOW idempotency.max_batch_keys;
SELECT * FROM idem_claim_batch(ARRAY['l-1', 'l-2', 'l-3', 'l-4']);
SELECT * FROM idem_once_batch(ARRAY['l-1', 'l-2', 'l-3', 'l-4']);
SELECT idem_complete_batch(ARRAY['l-1', 'l-2', 'l-3', 'l-4']);
SELECT records_digest() = :'d0' AS nothing_written;
-- At the limit it works.
BEGIN;
SELECT key, outcome FROM idem_claim_batch(ARRAY['l-1', 'l-2', 'l-3']);
SELECT idem_complete_batch(ARRAY['l-1', 'l-2', 'l-3']) AS completed;
COMMIT;
SELECT k FROM idem_once_batch(ARRAY['l-4', 'l-5', 'l-6']) AS t(k);
RESET idempotency.max_batch_keys;
SELECT count(*) AS rows FROM idem_claim_batch(ARRAY['l-1', 'l-2', 'l-3', 'l-4', 'l-5', 'l-6', 'l-7']);
-- Past the key locks a transaction keeps (idempotency.key_locks_per_transaction; 0 counts as 1), batches
-- go a group at a time and give the locks back: the same answers, and no key lock left.
SET idempotency.key_locks_per_transaction = 0;
BEGIN;
SELECT key, outcome FROM idem_claim_batch(ARRAY['g-3', 'g-1', 'g-2', 'g-1']);
SELECT idem_complete_batch(ARRAY['g-1', 'g-2', 'g-3']) AS completed;
SELECT k FROM idem_once_batch(ARRAY['g-1', 'g-4', 'g-5', 'g-4']) AS t(k);
SELECT count(*) AS key_locks FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
COMMIT;
SELECT key, outcome FROM idem_claim_batch(ARRAY['g-1', 'g-4', 'g-6']);
-- Claims of an earlier transaction completed a group at a time (two keys a group), in an order other than the
-- keys': each key gets its own payload, and the tokens are checked key by key.
SET idempotency.key_locks_per_transaction = 2;
CREATE TEMP TABLE gp AS SELECT key, token FROM idem_claim_batch(ARRAY['gp-3', 'gp-1', 'gp-5', 'gp-2', 'gp-4'], scope => 'gp');
SELECT idem_complete_batch(ARRAY['gp-4', 'gp-2', 'gp-5', 'gp-1', 'gp-3'],
                           ARRAY['{"n": 4}', '{"n": 2}', '{"n": 5}', NULL, '{"n": 3}']::jsonb[], 'gp',
                           ARRAY(SELECT g.token FROM unnest(ARRAY['gp-4', 'gp-2', 'gp-5', 'gp-1', 'gp-3'])
                                   WITH ORDINALITY AS u(k, i) JOIN gp g ON g.key = u.k ORDER BY u.i)) AS completed;
SELECT key, outcome, payload FROM idem_claim_batch(ARRAY['gp-1', 'gp-2', 'gp-3', 'gp-4', 'gp-5'], scope => 'gp');
-- A wrong token of a later group: an ERROR, and nothing of the earlier groups stays written.
CREATE TEMP TABLE gq AS SELECT key, token FROM idem_claim_batch(ARRAY['gq-1', 'gq-2', 'gq-3'], scope => 'gp');
SELECT idem_complete_batch(ARRAY['gq-1', 'gq-2', 'gq-3'], NULL, 'gp',
                           ARRAY(SELECT CASE WHEN g.key = 'gq-3' THEN g.token + 1000 ELSE g.token END
                                   FROM gq g ORDER BY g.key));
SELECT g.key, s.status FROM gq g, idem_status(g.key, 'gp') s ORDER BY g.key;
RESET idempotency.key_locks_per_transaction;

-----------------------------------------------------------------------------
-- Privileges: idempotency_consumer may call the batch functions; a plain role may not,
-- and may not change the batch limit.
-----------------------------------------------------------------------------
SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_batch_plain;
RESET client_min_messages;
CREATE ROLE idem_batch_plain;
SET ROLE idem_batch_plain;
SELECT * FROM idem_claim_batch(ARRAY['p-1']);
SELECT idem_complete_batch(ARRAY['p-1']);
SELECT * FROM idem_once_batch(ARRAY['p-2']);
RESET ROLE;
GRANT idempotency_consumer TO idem_batch_plain;
SET ROLE idem_batch_plain;
BEGIN;
SELECT key, outcome, attempts FROM idem_claim_batch(ARRAY['p-1']);
SELECT idem_complete_batch(ARRAY['p-1'], ARRAY['"plain"']::jsonb[]) AS completed;
COMMIT;
SELECT k FROM idem_once_batch(ARRAY['p-2', 'p-2']) AS t(k);
SELECT key, outcome, payload FROM idem_claim_batch(ARRAY['p-1']);
RESET ROLE;
DROP ROLE idem_batch_plain;
-- Without tokens, idem_complete_batch settles the claims this transaction made: those of a savepoint
-- released before (key by key) and the others (in one statement); not a claim another transaction made.
BEGIN;
SAVEPOINT s;
SELECT key, outcome FROM idem_claim_batch(ARRAY['bsp-1', 'bsp-2']) ORDER BY key;
RELEASE SAVEPOINT s;
SELECT key, outcome FROM idem_claim_batch(ARRAY['bsp-3']);
SELECT outcome FROM idem_claim('bsp-4');
SELECT idem_complete_batch(ARRAY['bsp-1', 'bsp-2', 'bsp-3', 'bsp-4']);
COMMIT;
SELECT key, status FROM (VALUES ('bsp-1'), ('bsp-2'), ('bsp-3'), ('bsp-4')) k(key), idem_status(k.key) ORDER BY key;
SELECT key, outcome FROM idem_claim_batch(ARRAY['bsp-5']);
SELECT idem_complete_batch(ARRAY['bsp-5']);
