-- What only the SQL edition has (docs/managed.md; the native extension's: native_settings): how its
-- functions run, its settings table, and what a session may change.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;

-- The consumer functions are SECURITY DEFINER with search_path pinned to pg_catalog, pg_temp: they reach
-- the storage as the edition's owner, and no schema of the caller can shadow what they run.
SELECT p.proname,
       n.nspname AS schema,
       p.prosecdef AS security_definer,
       p.proconfig AS settings
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_heartbeat', 'idem_once', 'idem_status')
ORDER BY p.proname;
SELECT idempotency.edition_version() ~ '^[0-9]+\.[0-9]+\.[0-9]+' AS has_version;

-- The settings, one row: the native extension's GUCs and their defaults.
SELECT * FROM idempotency.settings;

-- A consumer may tighten a limit for its session, never loosen it.
SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_plain;
RESET client_min_messages;
CREATE ROLE idem_plain;
GRANT idempotency_consumer TO idem_plain;
SET ROLE idem_plain;
SET idempotency.max_key_bytes = 16;
SELECT outcome FROM idem_claim(repeat('k', 17));
SELECT outcome FROM idem_claim(repeat('k', 16));
SET idempotency.max_key_bytes = 100000;
SELECT outcome FROM idem_claim(repeat('k', 513));
SET idempotency.max_lease_ttl = '1000d';
SELECT outcome FROM idem_claim('long-lease', ttl => '25 hours');
SET idempotency.max_attempts = 1000;
SET idempotency.max_batch_keys = 100000;
SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'b-' || i FROM generate_series(1, 1001) i));
SET idempotency.require_scope_grants = on;
SELECT idem_once('strict');
SET idempotency.require_scope_grants = off;
RESET ROLE;
-- A limit or policy a DBA set for the role (ALTER ROLE ... SET) is a floor its sessions cannot loosen.
ALTER ROLE idem_plain SET idempotency.require_scope_grants = on;
ALTER ROLE idem_plain SET idempotency.max_key_bytes = 16;
SET ROLE idem_plain;
SET idempotency.require_scope_grants = off;
SELECT idem_once('strict-again');
SET idempotency.max_key_bytes = 512;
SELECT idem_once(repeat('k', 17));
-- Nor by setting it to nothing, or to the text the native library shows for its default (where the library
-- is not loaded, a session's placeholder may hold any text).
SET idempotency.max_key_bytes = '';
SELECT idem_once(repeat('k', 17));
SELECT count(*) FROM idem_once_batch(ARRAY[repeat('k', 17)]);
SET idempotency.max_key_bytes = '512B';
SELECT idem_once(repeat('k', 17));
SET idempotency.require_scope_grants = '';
SELECT idem_once('strict-empty');
RESET ROLE;
ALTER ROLE idem_plain RESET ALL;
SET ROLE idem_plain;
RESET idempotency.max_key_bytes;
SELECT idem_once(repeat('k', 17)) AS long_key_again;
-- No access to the settings themselves.
SELECT * FROM idempotency.settings;
UPDATE idempotency.settings SET max_key_bytes = 100000;
RESET ROLE;
-- A floor given at login holds too: the database's value, on the common path as well (a session holding
-- only that limit, set to ''), and the login role's after SET ROLE (here the superuser running the test).
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idempotency.max_key_bytes = 16', current_database()); END $$;
\c
SET ROLE idem_plain;
SET idempotency.max_key_bytes = '';
SELECT idem_once(repeat('k', 17));
RESET ROLE;
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET idempotency.max_key_bytes', current_database()); END $$;
DO $$ BEGIN EXECUTE format('ALTER ROLE %I IN DATABASE %I SET idempotency.require_scope_grants = on', current_user, current_database()); END $$;
\c
SET ROLE idem_plain;
SET idempotency.require_scope_grants = '';
SELECT idem_once('login-floor');
RESET ROLE;
DO $$ BEGIN EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET idempotency.require_scope_grants', current_user, current_database()); END $$;
\c

-- A superuser may loosen one for its session.
SET idempotency.max_key_bytes = 1000;
SELECT outcome FROM idem_claim(repeat('k', 600));
RESET idempotency.max_key_bytes;
SELECT outcome FROM idem_claim(repeat('x', 600));
RESET ALL;
-- A session's limit that reads as the native library's default ('1000', as it shows where the library is
-- loaded) still holds where the table is looser: the common path takes that value as changing nothing only
-- where the table is no looser.
UPDATE idempotency.settings SET max_batch_keys = 2000;
SET idempotency.max_batch_keys = 1000;
SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'nb-' || i FROM generate_series(1, 1001) i));
RESET idempotency.max_batch_keys;
SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'nb-' || i FROM generate_series(1, 1001) i));
UPDATE idempotency.settings SET max_batch_keys = DEFAULT;

-- The edition's owner changes them for everyone.
UPDATE idempotency.settings SET max_attempts = 2;
SELECT token AS t FROM idem_claim('poison', ttl => '1 second') \gset
SELECT idem_fail('poison', '"boom"', token => :t) AS first_failure;
BEGIN;
SELECT outcome, attempts FROM idem_claim('poison');
SELECT idem_fail('poison', '"boom again"') AS second_failure;
COMMIT;
SELECT status, error FROM idem_status('poison');
UPDATE idempotency.settings SET max_attempts = DEFAULT;

DROP ROLE idem_plain;
