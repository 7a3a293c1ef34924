-- idem_once: a single-statement "first time?" check.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;

SELECT idem_once('evt-1') AS first;
SELECT idem_once('evt-1') AS second;
SELECT idem_once('evt-1', 'default') AS third;
-- Written as completed directly, without a token.
SELECT status, attempts, token IS NULL AS no_token, payload IS NULL AS no_payload, error IS NULL AS no_error
FROM idem_status('evt-1');
-- A claim of the same key sees it completed.
SELECT outcome, payload IS NULL AS no_payload FROM idem_claim('evt-1');

-- Scopes are separate.
SELECT idem_once('evt-1', 'other-scope') AS other_scope_first;
SELECT idem_once('evt-1', scope => 'other-scope') AS other_scope_second;

-- Twice in one transaction: true then false.
BEGIN;
SELECT idem_once('evt-2') AS first;
SELECT idem_once('evt-2') AS second;
COMMIT;
SELECT idem_once('evt-2') AS after_commit;

-- Rolled back: as if it never happened.
BEGIN;
SELECT idem_once('evt-3') AS first;
ROLLBACK;
SELECT count(*) AS rows FROM idem_status('evt-3');
SELECT idem_once('evt-3') AS first_again;

-- On a key that was claimed, completed or failed: not the first time.
SELECT outcome FROM idem_claim('evt-4');
SELECT idem_once('evt-4') AS claimed_key;
BEGIN;
SELECT outcome FROM idem_claim('evt-5');
SELECT idem_fail('evt-5', '"x"', retryable => false) AS result;
COMMIT;
SELECT idem_once('evt-5') AS failed_key;

-- Once-keys are terminal for the worker API.
SELECT idem_complete('evt-1', '"late"');
SELECT idem_heartbeat('evt-1');
SELECT idem_fail('evt-1');
SELECT status FROM idem_status('evt-1');

-- Many keys in one statement.
SELECT count(*) FILTER (WHERE idem_once('batch-' || i)) AS new_keys FROM generate_series(1, 10) i;
SELECT count(*) FILTER (WHERE idem_once('batch-' || i)) AS new_keys FROM generate_series(1, 15) i;
