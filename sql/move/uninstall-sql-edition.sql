-- Removes the SQL edition installed by its plain script (idempotency.sql), which has no DROP EXTENSION:
--
--   psql -X -v ON_ERROR_STOP=1 -d DB -f sql/move/uninstall-sql-edition.sql
--
-- Run by the edition's owner (the role that ran idempotency.sql) or a superuser. One transaction, which drops
--   * the edition's public functions: the idem_* functions in the schema where idem_claim lives (public,
--     unless the install ran with another search_path) that the edition's owner owns;
--   * the schema idempotency and everything in it (DROP SCHEMA idempotency CASCADE): records, offsets, scope
--     grants, the token sequence, settings, partitions, and whatever of yours depends on them (a view, say).
-- It keeps the roles idempotency_consumer and idempotency_admin (they are the cluster's, other databases may
-- use them), pgcrypto, and a schema idempotency_move (an export, sql/move/export.sql). Remove a pg_cron job
-- that calls idem_maintenance() yourself (SELECT cron.unschedule(...)).
--
-- It refuses a database where the native extension or the pg_tle edition is installed: those go with
-- DROP EXTENSION idempotency. It also refuses while the edition holds records or offsets that were not
-- exported (no schema idempotency_move): export them first (moving to the native extension: docs/managed.md,
-- "Moving between editions"), or TRUNCATE idempotency.records, idempotency.offsets if they are to be lost.
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL search_path = pg_catalog, pg_temp;

DO $uninstall$
DECLARE
    owner_oid oid;
    api_schema oid;
    f record;
    dropped integer := 0;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'pg_tle')
           AND pg_catalog.to_regprocedure('pgtle."idempotency.control"()') IS NOT NULL THEN
            RAISE EXCEPTION 'the pg_tle edition of idempotency is installed in database "%"', pg_catalog.current_database()
                USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'It goes with DROP EXTENSION idempotency.';
        END IF;
        RAISE EXCEPTION 'the native idempotency extension is installed in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'It goes with DROP EXTENSION idempotency.';
    END IF;
    IF pg_catalog.to_regprocedure('idempotency.edition_version()') IS NULL THEN
        RAISE EXCEPTION 'no SQL edition of idempotency in database "%" (no idempotency.edition_version())', pg_catalog.current_database()
            USING ERRCODE = 'undefined_object';
    END IF;
    IF pg_catalog.to_regnamespace('idempotency_move') IS NULL
       AND (EXISTS (SELECT FROM idempotency.records) OR EXISTS (SELECT FROM idempotency.offsets)) THEN
        RAISE EXCEPTION 'the SQL edition in database "%" holds records or offsets that were not exported', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run sql/move/export.sql first, or TRUNCATE idempotency.records, idempotency.offsets to lose them.';
    END IF;

    SELECT n.nspowner INTO STRICT owner_oid FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency';
    SELECT p.pronamespace INTO api_schema FROM pg_catalog.pg_proc p
     WHERE p.proname OPERATOR(pg_catalog.=) 'idem_claim' AND p.proowner OPERATOR(pg_catalog.=) owner_oid
     ORDER BY p.oid LIMIT 1;
    IF api_schema IS NOT NULL THEN
        FOR f IN SELECT p.oid::pg_catalog.regprocedure AS fn FROM pg_catalog.pg_proc p
                  WHERE p.pronamespace OPERATOR(pg_catalog.=) api_schema
                    AND p.proowner OPERATOR(pg_catalog.=) owner_oid
                    AND p.proname OPERATOR(pg_catalog.~~) 'idem\_%'
                  ORDER BY p.proname
        LOOP
            EXECUTE pg_catalog.format('DROP FUNCTION %s', f.fn);
            dropped := dropped OPERATOR(pg_catalog.+) 1;
        END LOOP;
    END IF;
    DROP SCHEMA idempotency CASCADE;
    RAISE NOTICE 'the SQL edition of idempotency is removed from database "%": % idem_* functions of schema %, and the schema idempotency',
        pg_catalog.current_database(), dropped, coalesce(api_schema::pg_catalog.regnamespace::text, '(none)');
END
$uninstall$;

COMMIT;
