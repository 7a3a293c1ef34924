-- Maintenance: idem_maintenance, idempotency.premake_partitions, idempotency.partitions,
-- retention by dropping partitions, reclaim of stuck leases, idem_partman_handover.
-- (The background worker, when the library is preloaded, maintains only the databases in
-- idempotency.database, 'postgres' by default: it never acts on this test's database.)
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
-- Every partition as (day relative to today's UTC midnight, named after its range, a day wide, dropped_after).
CREATE FUNCTION partition_days() RETURNS TABLE (day integer, named_by_range boolean, one_day boolean,
                                                 dropped_after_ok boolean)
LANGUAGE sql AS $$
  SELECT (extract(epoch FROM p.range_from - date_bin('1 day', now(), timestamptz '2000-01-01 00:00:00+00'))
          / 86400)::integer,
         c.relname = 'records_p' || to_char(p.range_from AT TIME ZONE 'UTC', 'YYYY_MM_DD'),
         p.range_to - p.range_from = interval '1 day',
         p.dropped_after = p.range_to + interval '7 days'
  FROM idempotency.partitions p JOIN pg_class c ON c.oid = p.partition
  ORDER BY p.range_from
$$;
-- The day (relative to today) of the partition a key's record lives in.
CREATE FUNCTION key_day(k text) RETURNS integer LANGUAGE sql AS $$
  SELECT (extract(epoch FROM p.range_from - date_bin('1 day', now(), timestamptz '2000-01-01 00:00:00+00'))
          / 86400)::integer
  FROM idempotency.records r JOIN idempotency.partitions p ON p.partition = r.tableoid
  WHERE r.scope = 'default' AND r.key = k
$$;

-- Exact argument lists and results of the maintenance contract.
SELECT p.oid::regprocedure AS function, pg_get_function_arguments(p.oid) AS arguments
FROM pg_proc p
WHERE p.proname IN ('idem_maintenance', 'idem_partman_handover', 'premake_partitions')
ORDER BY p.proname;
SELECT p.proname, pg_get_function_result(p.oid) AS result
FROM pg_proc p
WHERE p.proname IN ('idem_maintenance', 'idem_partman_handover', 'premake_partitions')
ORDER BY p.proname;
-- The columns of the idempotency.partitions view.
SELECT attnum, attname FROM pg_attribute
WHERE attrelid = 'idempotency.partitions'::regclass AND attnum > 0 AND NOT attisdropped
ORDER BY attnum;
-- The GUCs of retention, their defaults and contexts (postgresql.conf + reload).
SHOW idempotency.retention;
SHOW idempotency.reclaim_after;
SHOW idempotency.partition_manager;
SHOW idempotency.premake;
SHOW idempotency.partition_interval;
SHOW idempotency.drop_lock_timeout;
SHOW idempotency.maintenance_interval;
SELECT name, context FROM pg_settings
WHERE name IN ('idempotency.retention', 'idempotency.reclaim_after', 'idempotency.partition_manager',
               'idempotency.drop_lock_timeout', 'idempotency.maintenance_interval', 'idempotency.database')
ORDER BY name;
-- Every setting of the extension says what it is for, in both descriptions.
SELECT count(*) AS settings, count(*) FILTER (WHERE coalesce(short_desc, '') = '' OR coalesce(extra_desc, '') = '')
       AS without_description
FROM pg_settings WHERE name LIKE 'idempotency.%';

-----------------------------------------------------------------------------
-- After CREATE EXTENSION: no partition (a restored dump brings its own); the
-- first round makes the current partition and premake (4) more, then has
-- nothing to do. The record table has no index: each partition has its own.
-----------------------------------------------------------------------------
SELECT count(*) AS partitions_after_create FROM idempotency.partitions;
SELECT count(*) AS parent_indexes FROM pg_index WHERE indrelid = 'idempotency.records'::regclass;
SELECT * FROM idem_maintenance(now());
SELECT * FROM partition_days();
SELECT regexp_replace(pg_get_indexdef(i.indexrelid), 'records_p[0-9_]+', 'records_pDAY', 'g') AS every_partition_has,
       count(*) AS partitions
FROM idempotency.partitions p JOIN pg_index i ON i.indrelid = p.partition
GROUP BY 1 ORDER BY 1;
SELECT count(*) AS current_partitions FROM idempotency.partitions
WHERE range_from <= now() AND now() < range_to;
SELECT bool_and(row_estimate >= 0) AS row_estimate_ok, bool_and(total_bytes >= 0) AS total_bytes_ok,
       bool_and(size IS NOT NULL) AS size_ok, bool_and(dropped_after > now()) AS none_due
FROM idempotency.partitions;
SELECT * FROM idem_maintenance(now());
SELECT * FROM idem_maintenance();
SELECT idempotency.premake_partitions() AS created;
SELECT idempotency.premake_partitions(now()) AS created;

-----------------------------------------------------------------------------
-- premake_partitions for past timestamps: from as_of's slot to premake intervals ahead,
-- only what is missing.
-----------------------------------------------------------------------------
SELECT idempotency.premake_partitions(now() - interval '10 days') AS created;
SELECT idempotency.premake_partitions(now() - interval '10 days') AS created;
SELECT idempotency.premake_partitions(now() - interval '20 days') AS created;
-- Overlaps the partitions made above: only the two missing ones are created.
SELECT idempotency.premake_partitions(now() - interval '12 days') AS created;
SELECT * FROM partition_days();

-----------------------------------------------------------------------------
-- Records in old partitions. (Claims write created_at = now(); the test ages a few records
-- by moving their created_at, which moves them to the partition of that day.)
-----------------------------------------------------------------------------
SELECT idem_once('old-once') AS first;
BEGIN;
SELECT outcome FROM idem_claim('old-done');
SELECT idem_complete('old-done', '"old"');
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim('recent-done');
SELECT idem_complete('recent-done', '"recent"');
COMMIT;
SELECT idem_once('today-once') AS first;
BEGIN;
SELECT outcome FROM idem_claim('today-done');
SELECT idem_complete('today-done', '"today"');
COMMIT;
UPDATE idempotency.records SET created_at = created_at - interval '9 days'
WHERE key IN ('old-once', 'old-done');
UPDATE idempotency.records SET created_at = created_at - interval '6 days'
WHERE key = 'recent-done';
SELECT k, key_day(k) AS day
FROM unnest(ARRAY['old-once', 'old-done', 'recent-done', 'today-once', 'today-done']) AS k;
-- Still deduplicated while their partitions exist.
SELECT idem_once('old-once') AS old_once_again;
SELECT outcome, payload FROM idem_claim('old-done');

-----------------------------------------------------------------------------
-- idem_maintenance(now()) drops the partitions whose whole range is older than retention
-- (7 days) and keeps the rest, the current one included.
-----------------------------------------------------------------------------
SELECT count(*) AS due FROM idempotency.partitions WHERE dropped_after <= now();
SELECT * FROM idem_maintenance(now());
SELECT * FROM partition_days();
SELECT count(*) AS due FROM idempotency.partitions WHERE dropped_after <= now();
SELECT count(*) AS current_partitions FROM idempotency.partitions
WHERE range_from <= now() AND now() < range_to;
-- Nothing left to do.
SELECT * FROM idem_maintenance(now());
-- A key in a dropped partition counts as new; a key in a kept partition still deduplicates.
SELECT count(*) AS rows FROM idem_status('old-once');
SELECT count(*) AS rows FROM idem_status('old-done');
SELECT idem_once('old-once') AS old_once_is_new;
SELECT outcome, attempts, payload IS NULL AS no_payload FROM idem_claim('old-done');
SELECT outcome, payload FROM idem_claim('recent-done');
SELECT idem_once('today-once') AS today_once_again;
SELECT outcome, payload FROM idem_claim('today-done');
SELECT status, payload FROM idem_status('today-done');

-----------------------------------------------------------------------------
-- Reclaim: keys whose lease expired more than idempotency.reclaim_after ago and that
-- nobody took over are deleted; live leases and settled keys are kept.
-----------------------------------------------------------------------------
SELECT token AS stuck FROM idem_claim('stuck', ttl => '1 millisecond') \gset
SELECT outcome FROM idem_claim('live', ttl => '1 hour');
BEGIN;
SELECT outcome FROM idem_claim('dead');
SELECT idem_fail('dead', '"fatal"', retryable => false) AS result;
COMMIT;
SELECT pg_sleep(0.05);
SELECT status, expires_at < now() AS expired FROM idem_status('stuck');
-- The default grace (1h) has not passed.
SELECT * FROM idem_maintenance(now());
SELECT status FROM idem_status('stuck');
-- reclaim_after is a sighup GUC: not settable in a session.
SET idempotency.reclaim_after = 0;
ALTER SYSTEM SET idempotency.reclaim_after = '10s';
SELECT pg_reload_conf();
SELECT pg_sleep(0.2);
SHOW idempotency.reclaim_after;
-- Expired less than 10s ago: kept.
SELECT * FROM idem_maintenance(now());
SELECT status FROM idem_status('stuck');
ALTER SYSTEM SET idempotency.reclaim_after = 0;
SELECT pg_reload_conf();
SELECT pg_sleep(0.2);
SHOW idempotency.reclaim_after;
-- Now it is reclaimed; the live lease and the settled keys are kept.
SELECT * FROM idem_maintenance(now());
SELECT k, s.status
FROM unnest(ARRAY['stuck', 'live', 'dead', 'today-done', 'today-once', 'recent-done']) AS k
LEFT JOIN LATERAL idem_status(k) s ON true
ORDER BY k;
SELECT * FROM idem_maintenance(now());
-- The old holder's key no longer exists (P0002); the key is new again, with a larger token.
SELECT idem_complete('stuck', '"late"', token => :stuck);
SELECT idem_heartbeat('stuck', token => :stuck);
SELECT outcome, attempts, token > :stuck AS bigger FROM idem_claim('stuck');
ALTER SYSTEM RESET idempotency.reclaim_after;
SELECT pg_reload_conf();
SELECT pg_sleep(0.2);
SHOW idempotency.reclaim_after;

-----------------------------------------------------------------------------
-- A future as_of ages the data: premake ahead of as_of, drop what is older than
-- as_of - retention (today's partition included).
-----------------------------------------------------------------------------
SELECT * FROM idem_maintenance(now() + interval '8 days');
SELECT * FROM partition_days();
SELECT count(*) AS rows FROM idem_status('today-done');
-- A claim whose time has no partition any more creates it on the spot.
SELECT outcome, attempts FROM idem_claim('today-done');
SELECT idem_once('today-once') AS today_once_is_new;
SELECT * FROM partition_days();

-----------------------------------------------------------------------------
-- idem_partman_handover() is refused under the builtin manager (55000).
-----------------------------------------------------------------------------
SHOW idempotency.partition_manager;
SELECT count(*) AS partitions_before FROM idempotency.partitions \gset
SELECT idem_partman_handover();
SELECT count(*) = :partitions_before AS unchanged FROM idempotency.partitions;

-----------------------------------------------------------------------------
-- Bad input and privileges.
-----------------------------------------------------------------------------
SELECT * FROM idem_maintenance(NULL);
SELECT idempotency.premake_partitions(NULL);
SELECT count(*) = :partitions_before AS unchanged FROM idempotency.partitions;
-- Maintenance stays with the owner: idempotency_consumer cannot run it or read the view.
SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_maint_plain;
RESET client_min_messages;
CREATE ROLE idem_maint_plain;
GRANT idempotency_consumer TO idem_maint_plain;
SET ROLE idem_maint_plain;
SELECT * FROM idem_maintenance(now());
SELECT * FROM idem_maintenance();
SELECT idempotency.premake_partitions(now());
SELECT idem_partman_handover();
SELECT count(*) FROM idempotency.partitions;
-- The consumer API still works for it.
SELECT idem_once('plain-once') AS first;
RESET ROLE;
DROP ROLE idem_maint_plain;
SELECT count(*) = :partitions_before AS unchanged FROM idempotency.partitions;
