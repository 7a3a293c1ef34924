-- What only the native extension has (the SQL edition's own rules: edition_settings): how the functions
-- run, and the idempotency.* GUCs, their defaults and who may change them.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;

-- The six functions of the contract live in the extension's schema (public). They are not
-- SECURITY DEFINER and set no GUC (that wrapper's cost is a tenth of a call): inside, the
-- storage runs as the extension's owner with pg_catalog as its only search path (the
-- privileges suite of tests/torture checks both, under a hostile search_path).
SELECT p.proname,
       n.nspname AS schema,
       p.prosecdef AS security_definer,
       EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%') AS pinned_search_path
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_heartbeat', 'idem_once', 'idem_status')
ORDER BY p.proname;

-- GUCs: defaults and contexts.
SHOW idempotency.lease_ttl;
SHOW idempotency.max_attempts;
SHOW idempotency.max_key_bytes;
SHOW idempotency.max_payload_bytes;
SHOW idempotency.partition_interval;
SHOW idempotency.premake;
SHOW idempotency.max_lease_ttl;
SELECT name, context FROM pg_settings
WHERE name IN ('idempotency.lease_ttl', 'idempotency.max_attempts', 'idempotency.max_key_bytes',
               'idempotency.max_payload_bytes', 'idempotency.partition_interval', 'idempotency.premake',
               'idempotency.max_lease_ttl', 'idempotency.filter_cache')
ORDER BY name;
-- sighup GUCs cannot be changed in a session.
SET idempotency.partition_interval = '2d';
SET idempotency.premake = 2;
SHOW idempotency.partition_interval;
SHOW idempotency.premake;

SHOW idempotency.max_batch_keys;

SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_plain;
RESET client_min_messages;
CREATE ROLE idem_plain;
GRANT idempotency_consumer TO idem_plain;
SET ROLE idem_plain;
-- superuser GUCs cannot be changed by a plain role: the limits and the policies.
SET idempotency.max_key_bytes = 16;
SET idempotency.max_payload_bytes = '1kB';
SET idempotency.max_attempts = 3;
SET idempotency.max_lease_ttl = '1000d';
SET idempotency.filter_cache = '1GB';
SHOW idempotency.max_attempts;
SET idempotency.max_batch_keys = 100000;
SHOW idempotency.max_batch_keys;
-- nor require scope grants.
SET idempotency.require_scope_grants = on;
RESET ROLE;

-- idempotency.edition_common_path (0.9.5): read-only, computed when read: under READ COMMITTED, read-write, with
-- max_key_bytes and require_scope_grants at their defaults, 'keys' and each group of the other limits the SQL
-- edition reads that has its defaults (lease, payload, batch), else 'off'; nobody sets it, not even a superuser.
SELECT name, setting, context, pg_settings_get_flags(name) AS flags FROM pg_settings
WHERE name = 'idempotency.edition_common_path';
SET idempotency.edition_common_path = on;
SET ROLE idem_plain;
SET idempotency.edition_common_path = on;
RESET ROLE;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SHOW idempotency.edition_common_path;
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SHOW idempotency.edition_common_path;
COMMIT;
BEGIN READ ONLY;
SHOW idempotency.edition_common_path;
COMMIT;
BEGIN;
SET LOCAL idempotency.lease_ttl = '30s';
SHOW idempotency.edition_common_path;
COMMIT;
SET idempotency.require_scope_grants = on;
SHOW idempotency.edition_common_path;
RESET idempotency.require_scope_grants;
SET idempotency.max_batch_keys = 10;
SHOW idempotency.edition_common_path;
SET idempotency.max_payload_bytes = '2MB';
SHOW idempotency.edition_common_path;
SET idempotency.max_key_bytes = 100;
SHOW idempotency.edition_common_path;
RESET idempotency.max_key_bytes;
RESET idempotency.max_payload_bytes;
-- A limit set to its default changes nothing.
SET idempotency.max_batch_keys = 1000;
SET idempotency.max_key_bytes = '512B';
SHOW idempotency.edition_common_path;
RESET ALL;

-- Without shared_preload_libraries, the statistics say why they are empty.
\set VERBOSITY terse
SELECT * FROM idempotency.stats;
SELECT idem_stats_reset() IS NOT NULL AS reset;
\set VERBOSITY sqlstate
DROP ROLE idem_plain;

-- A library whose SQL definition is another version's (before ALTER EXTENSION UPDATE): idem_claim's code
-- checks the declared columns before it forms its row, and raises 55000 rather than a row of another shape.
-- The check comes before the call's work: nothing is written, and no fencing token is drawn.
SELECT token AS token_before FROM idem_claim('old-0') \gset
CREATE FUNCTION old_claim(text, interval, text, text, boolean) RETURNS TABLE (outcome text)
    AS '$libdir/idempotency', 'idem_claim_wrapper' LANGUAGE c;
CREATE FUNCTION other_claim(text, interval, text, text, boolean)
    RETURNS TABLE (outcome text, token integer, attempts integer, payload jsonb, expires_at timestamptz)
    AS '$libdir/idempotency', 'idem_claim_wrapper' LANGUAGE c;
CREATE FUNCTION one_claim(text, interval, text, text, boolean, OUT outcome text, OUT token bigint,
    OUT attempts integer, OUT payload jsonb, OUT expires_at timestamptz)
    AS '$libdir/idempotency', 'idem_claim_wrapper' LANGUAGE c;
SELECT * FROM old_claim('old-1', NULL, 'default', NULL, true);
SELECT * FROM other_claim('old-2', NULL, 'default', NULL, true);
SELECT * FROM one_claim('old-4', NULL, 'default', NULL, true);
SELECT count(*) AS written FROM idem_status('old-1');
SELECT count(*) AS written FROM idem_status('old-2');
SELECT token - :token_before AS tokens_drawn_since FROM idem_claim('old-3');
DROP FUNCTION old_claim, other_claim, one_claim;
