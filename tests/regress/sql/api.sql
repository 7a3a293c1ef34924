-- Public surface: extension objects, signatures, privileges, GUCs, partitioned storage.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;

-- Exact argument lists and results of the public contract.
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments
FROM pg_proc p
WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_heartbeat', 'idem_once', 'idem_status')
ORDER BY p.proname;
SELECT p.proname, pg_get_function_result(p.oid) AS result
FROM pg_proc p
WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_heartbeat', 'idem_once', 'idem_status')
ORDER BY p.proname;

-- idem_claim returns exactly one row; idem_status zero or one.
SELECT count(*) AS claim_rows FROM idem_claim('api-1');
SELECT count(*) AS status_rows_missing FROM idem_status('api-missing');
SELECT count(*) AS status_rows_present FROM idem_status('api-1');

-- idempotency.lease_ttl is the lease length when ttl is NULL.
SET idempotency.lease_ttl = '1h';
SELECT outcome, expires_at > now() + interval '59 minutes'
                AND expires_at < clock_timestamp() + interval '61 minutes' AS about_one_hour
FROM idem_claim('api-lease-guc');
SELECT outcome, expires_at > now() + interval '59 minutes'
                AND expires_at < clock_timestamp() + interval '61 minutes' AS about_one_hour
FROM idem_claim('api-lease-guc-2', ttl => NULL);
RESET idempotency.lease_ttl;
-- An explicit ttl wins over the GUC.
SELECT outcome, expires_at > now() + interval '9 minutes'
                AND expires_at < clock_timestamp() + interval '11 minutes' AS about_ten_minutes
FROM idem_claim('api-lease-arg', ttl => '10 minutes');
-- Default lease is 5 minutes.
SELECT outcome, expires_at > now() + interval '4 minutes'
                AND expires_at < clock_timestamp() + interval '6 minutes' AS about_five_minutes
FROM idem_claim('api-lease-default');

-- Storage is a partitioned table with daily partitions named records_pYYYY_MM_DD.
SELECT c.relkind FROM pg_class c WHERE c.oid = 'idempotency.records'::regclass;
SELECT count(*) >= 5 AS at_least_today_plus_premake,
       bool_and(c.relname ~ '^records_p[0-9]{4}_[0-9]{2}_[0-9]{2}$') AS all_named_by_day,
       count(*) FILTER (WHERE to_date(substr(c.relname, 10), 'YYYY_MM_DD')
                              >= (now() AT TIME ZONE 'UTC')::date) >= 5 AS premade_ahead
FROM pg_partition_tree('idempotency.records') t
JOIN pg_class c ON c.oid = t.relid
WHERE t.isleaf;
-- Rows land in a day partition close to today.
SELECT DISTINCT c.relname ~ '^records_p[0-9]{4}_[0-9]{2}_[0-9]{2}$' AS in_day_partition,
       abs(to_date(substr(c.relname, 10), 'YYYY_MM_DD') - (now() AT TIME ZONE 'UTC')::date) <= 1 AS near_today
FROM idempotency.records r JOIN pg_class c ON c.oid = r.tableoid;

-- PUBLIC cannot read or write the storage.
SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_plain;
RESET client_min_messages;
CREATE ROLE idem_plain;
SET ROLE idem_plain;
SELECT count(*) FROM idempotency.records;
DELETE FROM idempotency.records;
INSERT INTO idempotency.records SELECT * FROM idempotency.records;
-- The API itself is not granted to PUBLIC: it comes with the role idempotency_consumer.
SELECT outcome FROM idem_claim('api-plain');
SELECT idem_once('api-plain-once');
RESET ROLE;
GRANT idempotency_consumer TO idem_plain;
SET ROLE idem_plain;
-- Still no direct access to the storage, but the API works.
SELECT count(*) FROM idempotency.records;
BEGIN;
SELECT outcome, attempts FROM idem_claim('api-plain');
SELECT idem_complete('api-plain', '{"by": "plain"}');
COMMIT;
SELECT outcome, attempts, payload FROM idem_claim('api-plain');
SELECT token AS plain_tok FROM idem_claim('api-plain-2') \gset
SELECT idem_heartbeat('api-plain-2', ttl => '1 hour', token => :plain_tok) > now() AS heartbeat_ok;
SELECT idem_fail('api-plain-2', '"boom"', retryable => false, token => :plain_tok) AS fail_result;
SELECT idem_once('api-plain-once') AS first, idem_once('api-plain-once') AS second;
SELECT status, payload FROM idem_status('api-plain');
-- user GUCs can.
SET idempotency.lease_ttl = '30s';
SHOW idempotency.lease_ttl;
RESET idempotency.lease_ttl;
-- A lease longer than idempotency.max_lease_ttl is refused, taken or renewed.
SELECT outcome FROM idem_claim('api-plain-long', ttl => '25 hours');
SELECT outcome FROM idem_claim('api-plain-long', ttl => '290000 years');
SET idempotency.lease_ttl = '2d';
SELECT outcome FROM idem_claim('api-plain-long');
RESET idempotency.lease_ttl;
RESET ROLE;
DROP ROLE idem_plain;
