-- Observability and steering: idempotency.stats without the library preloaded (this suite's cluster
-- does not preload it; tests/multisession/test_stats.py checks the counters), idem_metrics(), the views
-- of keys in flight and dead letters, idem_redrive, idem_redrive_scope, idem_forget and who may call them.
\set VERBOSITY sqlstate
-- (the SQL edition's PL/pgSQL adds a CONTEXT line to the errors shown in full below)
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

-- Without shared_preload_libraries (and in the SQL edition): no row, a NOTICE that says why (its text:
-- native_settings); idem_stats() says "not enabled"; idem_stats_reset() has nothing to reset and says so
-- with the same NOTICE.
SELECT * FROM idempotency.stats;
SELECT idem_stats_reset() IS NOT NULL AS reset;
SELECT claims, completes, scopes, enabled, stats_reset FROM idem_stats();

-- Nothing yet: one row, no scope, the partitions that the first call makes are not there either.
SELECT scope, retained_keys, in_flight, dead_letters, partitions, rounds, last_error, worker_running
  FROM idem_metrics();

-- Fixtures in scope 'obs': completed, leased, expired, released (retryable failure), dead (terminal).
BEGIN;
SELECT outcome FROM idem_claim('done', scope => 'obs');
SELECT idem_complete('done', scope => 'obs');
COMMIT;
SELECT outcome FROM idem_claim('leased', ttl => '1 hour', scope => 'obs');
SELECT outcome FROM idem_claim('expired', ttl => '1 millisecond', scope => 'obs');
SELECT outcome FROM idem_claim('released', scope => 'obs');
SELECT idem_fail('released', '{"e": "transient"}', scope => 'obs',
                 token => (SELECT token FROM idem_status('released', 'obs')));
BEGIN;
SELECT outcome FROM idem_claim('dead', scope => 'obs');
SELECT idem_fail('dead', '{"e": "fatal"}', retryable => false, scope => 'obs');
COMMIT;
SELECT idem_once('other', scope => 'obs2');
SELECT pg_sleep(0.01);

SELECT scope, key, state, token IS NOT NULL AS has_token, attempts, age >= interval '0'
  FROM idempotency.in_flight ORDER BY scope, key;
SELECT scope, key, error, attempts, failed_at >= created_at AS ordered FROM idempotency.dead_letters;

SELECT scope, retained_keys, completed_keys, in_flight, oldest_lease_age > interval '0' AS aged,
       expired_leases, awaiting_retry, dead_letters, last_dead_letter_at IS NOT NULL AS dead_at,
       partitions, sealed_partitions, premade_ahead > interval '3 days' AS premade,
       rounds, failed_rounds, last_round_at, last_error, worker_running
  FROM idem_metrics();

-- idem_redrive: a dead letter becomes claimable again, from attempt 1; other states are left alone.
SELECT idem_redrive('dead', scope => 'obs') AS redriven;
SELECT idem_redrive('dead', scope => 'obs') AS again;
SELECT idem_redrive('leased', scope => 'obs') AS pending_left_alone;
SELECT idem_redrive('done', scope => 'obs') AS completed_left_alone;
SELECT state, token, attempts FROM idempotency.in_flight WHERE key = 'dead';
SELECT status, attempts, error FROM idem_status('dead', 'obs');
SELECT outcome, attempts FROM idem_claim('dead', scope => 'obs');
SELECT count(*) AS dead_letters FROM idempotency.dead_letters;

-- idem_redrive_scope: bounded, by failure time; call again until 0.
BEGIN;
SELECT outcome FROM idem_claim_batch(ARRAY['d1', 'd2', 'd3'], scope => 'bulk');
SELECT idem_fail(k, '{"e": 1}', retryable => false, scope => 'bulk') FROM unnest(ARRAY['d1', 'd2', 'd3']) k;
COMMIT;
SELECT idem_redrive_scope('bulk', failed_since => now() + interval '1 hour') AS none_that_recent;
SELECT idem_redrive_scope('bulk', max_keys => 2) AS first_two;
SELECT idem_redrive_scope('bulk') AS the_rest;
SELECT idem_redrive_scope('bulk') AS nothing_left;
SELECT key, state, attempts FROM idempotency.in_flight WHERE scope = 'bulk' ORDER BY key;

-- idem_forget: the key is gone, whatever its state; its next claim starts from scratch.
SELECT idem_forget('done', scope => 'obs') AS forgotten;
SELECT idem_forget('done', scope => 'obs') AS unknown;
SELECT count(*) FROM idem_status('done', 'obs');
SELECT outcome, attempts FROM idem_claim('done', scope => 'obs');

-- Bad input: a clear ERROR, nothing written.
SELECT count(*) AS records_before FROM idempotency.records;
\set VERBOSITY default
SELECT idem_redrive('never', scope => 'obs');
\set VERBOSITY sqlstate
SELECT idem_redrive(NULL);
SELECT idem_redrive_scope(NULL);
SELECT idem_redrive_scope('bulk', max_keys => 0);
SELECT idem_redrive_scope('bulk', max_keys => NULL);
SELECT idem_redrive_scope('bulk', max_keys => 1000000);
SELECT idem_forget('', scope => 'obs');
SELECT idem_forget('k', scope => NULL);
SELECT count(*) AS records_after FROM idempotency.records;
BEGIN READ ONLY;
SELECT idem_redrive('dead', scope => 'obs');
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_forget('dead', scope => 'obs');
ROLLBACK;

-- Who may: idempotency_admin steers and reads, pg_monitor reads, consumers neither.
CREATE ROLE obs_consumer IN ROLE idempotency_consumer;
CREATE ROLE obs_monitor IN ROLE pg_monitor;
CREATE ROLE obs_admin IN ROLE idempotency_admin;
SET ROLE obs_consumer;
SELECT idem_forget('leased', scope => 'obs');
SELECT idem_redrive('dead', scope => 'obs');
SELECT count(*) FROM idempotency.dead_letters;
SELECT count(*) FROM idem_metrics();
RESET ROLE;
SET ROLE obs_monitor;
-- pg_monitor reads counts and partitions; keys, live tokens and stored errors stay with idempotency_admin.
SELECT count(*) FROM idempotency.in_flight;
SELECT count(*) FROM idempotency.dead_letters;
SELECT count(*) > 0 FROM idempotency.partitions;
SELECT count(*) FROM idempotency.stats;
SELECT count(*) > 0 FROM idem_metrics();
SELECT idem_forget('leased', scope => 'obs');
SELECT idem_stats_reset();
RESET ROLE;
SET ROLE obs_admin;
SELECT count(*) FROM idempotency.dead_letters;
SELECT idem_forget('leased', scope => 'obs') AS admin_forgets;
SELECT count(*) FROM idempotency.in_flight WHERE key = 'leased';
SELECT idem_claim('x') IS NULL;
RESET ROLE;
DROP ROLE obs_consumer, obs_monitor, obs_admin;
