-- The SQL edition: runs after everything else. No function of the edition is executable by PUBLIC (a
-- function is executable by PUBLIC when it is created), then each role gets what the native extension
-- grants it (sql/surface/, shared with the native extension, and the edition's own files grant them
-- already; this is the one list, applied again, so that a function whose grant was forgotten still gets
-- it). The internal helpers need no grant: only the edition's SECURITY DEFINER functions, which run as the
-- owner, call them.
--
-- The public functions live where idem_claim lives: the extension's schema under pg_tle (pg_extension has a
-- row for idempotency during CREATE EXTENSION and ALTER EXTENSION UPDATE), the first schema of search_path
-- under the plain script (which has no pg_extension row, and sets search_path to that schema while it runs).
DO $$
DECLARE
    target oid;
    f regprocedure;
    g record;
BEGIN
    SELECT e.extnamespace INTO target FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency';
    IF target IS NULL THEN
        SELECT n.oid INTO target FROM pg_catalog.pg_namespace n
         WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema();
    END IF;
    IF target IS NULL OR NOT EXISTS (
        SELECT FROM pg_catalog.pg_proc p
         WHERE p.proname OPERATOR(pg_catalog.=) 'idem_claim' AND p.pronamespace OPERATOR(pg_catalog.=) target) THEN
        RAISE EXCEPTION 'idempotency: idem_claim is not in the schema the edition installs into (%)',
            coalesce(target::pg_catalog.regnamespace::text, 'none');
    END IF;

    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace::oid
            OR (p.pronamespace OPERATOR(pg_catalog.=) target AND p.proname OPERATOR(pg_catalog.~~) 'idem\_%')
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;

    -- What each role may call: the native extension's grants.
    FOR g IN
        SELECT v.schema_name, v.fn, v.roles
          FROM (VALUES
            -- idempotency_consumer: the key calls, the batches, the derivations, the offsets (not the reset).
            (NULL, 'idem_claim', 'idempotency_consumer'),
            (NULL, 'idem_complete', 'idempotency_consumer'),
            (NULL, 'idem_fail', 'idempotency_consumer'),
            (NULL, 'idem_heartbeat', 'idempotency_consumer'),
            (NULL, 'idem_once', 'idempotency_consumer'),
            (NULL, 'idem_status', 'idempotency_consumer'),
            (NULL, 'idem_claim_batch', 'idempotency_consumer'),
            (NULL, 'idem_complete_batch', 'idempotency_consumer'),
            (NULL, 'idem_once_batch', 'idempotency_consumer'),
            (NULL, 'idem_key', 'idempotency_consumer'),
            (NULL, 'idem_fingerprint', 'idempotency_consumer'),
            (NULL, 'idem_record_offset', 'idempotency_consumer'),
            (NULL, 'idem_next_offset', 'idempotency_consumer'),
            (NULL, 'idem_offsets', 'idempotency_consumer'),
            -- idempotency_admin: keys by hand, grants, statistics; pg_monitor reads.
            (NULL, 'idem_redrive', 'idempotency_admin'),
            (NULL, 'idem_redrive_scope', 'idempotency_admin'),
            (NULL, 'idem_forget', 'idempotency_admin'),
            (NULL, 'idem_grant_scope', 'idempotency_admin'),
            (NULL, 'idem_revoke_scope', 'idempotency_admin'),
            (NULL, 'idem_grant_group', 'idempotency_admin'),
            (NULL, 'idem_revoke_group', 'idempotency_admin'),
            (NULL, 'idem_stats_reset', 'idempotency_admin'),
            (NULL, 'idem_stats', 'idempotency_admin, pg_monitor'),
            (NULL, 'idem_metrics', 'idempotency_admin, pg_monitor'),
            ('idempotency', 'scope_stats', 'idempotency_admin, pg_monitor'),
            ('idempotency', 'stats_totals', 'idempotency_admin, pg_monitor'),
            ('idempotency', 'maintenance_state', 'idempotency_admin, pg_monitor'),
            ('idempotency', 'partition_range', 'idempotency_admin, pg_monitor')
          ) AS v(schema_name, fn, roles)
    LOOP
        FOR f IN
            SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
             WHERE p.proname OPERATOR(pg_catalog.=) g.fn
               AND p.pronamespace OPERATOR(pg_catalog.=)
                   CASE WHEN g.schema_name IS NULL THEN target
                        ELSE g.schema_name::pg_catalog.regnamespace::oid END
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, g.roles);
        END LOOP;
    END LOOP;
END
$$;
