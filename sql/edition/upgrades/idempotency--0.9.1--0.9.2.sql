-- The SQL edition, 0.9.1 -> 0.9.2 (issue 32: a week of keys). Nothing stored changes: idem_once_batch and
-- idem_claim_batch are replaced. Where the sealed partitions have key filters, they compute each key's hash
-- once, in a subquery of its own, instead of once for the filters' index condition and again for every row
-- of the key's bucket (the hash inlined into both). Run by the 0.9.2 plain script over a 0.9.1 install, or by
-- ALTER EXTENSION idempotency UPDATE after the 0.9.2 idempotency-tle.sql registered this path; in either case
-- one transaction, in the schema of the install.

-- Every function that changed in 0.9.2, from the sources.
-- (0.9.2's sql/edition/ 40-batch.sql: idem_claim_batch idem_once_batch, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_claim_batch(keys text[], ttl interval DEFAULT NULL, scope text DEFAULT 'default')
RETURNS TABLE (key text, outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, true, false);
    s idempotency.settings;
    t interval;
    st idempotency.call_state;
    c record;
    k text;
    answers idempotency.claim_answer[];
    parts oid[];
    ctids tid[];
    iver bigint;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(true, true, false);
    END IF;
    -- The common case, as idem_once_batch's, and a ttl within the limits.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_claim_batch.keys, idem_claim_batch.scope)
       AND (CASE WHEN idem_claim_batch.ttl IS NULL THEN (idempotency.cached_state()).lease_ttl_ok
                 ELSE idem_claim_batch.ttl OPERATOR(pg_catalog.>) '0'::interval
                      AND idem_claim_batch.ttl OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_lease_ttl END)
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_claim_batch.keys)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_claim_batch.scope);
        END IF;
        t := coalesce(idem_claim_batch.ttl, (idempotency.cached_state()).lease_ttl);
        st := idempotency.cached_state();
    ELSE
        s := idempotency.check_batch('idem_claim_batch', idem_claim_batch.keys, idem_claim_batch.scope);
        t := idempotency.check_ttl(idem_claim_batch.ttl, s.lease_ttl, s.max_lease_ttl);
        st := idempotency.call_state(NULL, true);
        IF st.stale_seal THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope);
        END IF;
    END IF;
    -- The keys no other partition holds, written at once, in key order, when the state's constants
    -- (idempotency.cached_state, folded into the statement's plan) are current; the write says the version
    -- it planned with, checked against sealed_upto after it (as idem_claim's). Otherwise, or when a seal
    -- moved past the write partition meanwhile (the rows deleted), every key goes the long way below.
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        WITH fresh AS (
            -- (Each key's hash computed once, in a subquery that OFFSET 0 keeps apart: inlined into the filters'
            -- lookup, it was computed again for the index condition and for every row of the key's bucket.)
            SELECT DISTINCT u.k
              FROM (SELECT v.k, CASE WHEN (idempotency.cached_state()).filtered
                                     THEN idempotency.key_hash(v.k, idem_claim_batch.scope) END AS h
                      FROM pg_catalog.unnest(idem_claim_batch.keys) AS v(k) OFFSET 0) u
             WHERE NOT ((idempotency.cached_state()).filtered
                        AND EXISTS (SELECT FROM idempotency.sealed_key_matches(u.h)))
               AND (NOT ((idempotency.cached_state()).unfiltered_from IS NOT NULL OR (idempotency.cached_state()).probe_ahead)
                    OR NOT EXISTS (SELECT FROM idempotency.records x
                                    WHERE x.key OPERATOR(pg_catalog.=) u.k AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope
                                      AND ((x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                                            AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                                           OR ((idempotency.cached_state()).probe_ahead
                                               AND x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to))))),
        written AS (
            INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, created_at, updated_at, expires_at)
            SELECT idem_claim_batch.scope, f.k, 'pending', pg_catalog.nextval('idempotency.token_seq'), 1,
                   idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                   pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) t
              FROM fresh f ORDER BY f.k
            ON CONFLICT DO NOTHING
            RETURNING x.key, x.token, x.attempts, x.expires_at, x.tableoid, x.ctid)
        SELECT pg_catalog.array_agg(ROW(wr.key, 'claimed', wr.token, wr.attempts, NULL, wr.expires_at)::idempotency.claim_answer),
               pg_catalog.array_agg(wr.tableoid), pg_catalog.array_agg(wr.ctid), (idempotency.cached_state()).upto
          INTO answers, parts, ctids, iver FROM written wr;
        IF answers IS NOT NULL
           AND (iver OPERATOR(pg_catalog.<>) st.upto
                OR coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.<>) iver) THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
            DELETE FROM idempotency.records x USING ROWS FROM (pg_catalog.unnest(parts), pg_catalog.unnest(ctids)) AS d(part, row_ctid)
             WHERE x.tableoid OPERATOR(pg_catalog.=) d.part AND x.ctid OPERATOR(pg_catalog.=) d.row_ctid;
            answers := NULL;
            st := idempotency.call_state(NULL, true);
        END IF;
        -- Keys whose record in the write partition is settled (a batch delivered again): answered from those rows
        -- in one read, as idempotency.claim_one answers them (a seal since changes no row: the answers stand).
        -- Not when every key was written.
        IF coalesce(pg_catalog.cardinality(answers), 0) OPERATOR(pg_catalog.<) pg_catalog.cardinality(idem_claim_batch.keys) THEN
            answers := coalesce(answers, '{}') OPERATOR(pg_catalog.||) ARRAY(
                SELECT ROW(x.key, x.status, CASE WHEN x.status OPERATOR(pg_catalog.=) 'completed' THEN x.token END, x.attempts,
                           CASE WHEN x.status OPERATOR(pg_catalog.=) 'completed' THEN x.payload ELSE x.error END,
                           NULL)::idempotency.claim_answer
                  FROM idempotency.records x
                 WHERE x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_from
                   AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_to
                   AND x.key OPERATOR(pg_catalog.=) ANY (idem_claim_batch.keys)
                   AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope
                   AND x.status OPERATOR(pg_catalog.=) ANY ('{completed,failed}'::text[]));
        END IF;
    END IF;
    answers := coalesce(answers, '{}');
    -- The others, one by one in key order: what the single claim answers. (None when there are as many
    -- answers as keys.)
    IF pg_catalog.cardinality(answers) OPERATOR(pg_catalog.<) pg_catalog.cardinality(idem_claim_batch.keys) THEN
        FOR k IN SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_claim_batch.keys) AS u(k)
                  WHERE NOT EXISTS (SELECT FROM pg_catalog.unnest(answers) a WHERE a.key OPERATOR(pg_catalog.=) u.k)
                  ORDER BY u.k LOOP
            LOOP
                c := idempotency.claim_one(k, idem_claim_batch.scope, t, NULL, true, st, false);
                EXIT WHEN c.outcome OPERATOR(pg_catalog.<>) 'retry';
                st := idempotency.call_state(NULL, true);
            END LOOP;
            answers := answers OPERATOR(pg_catalog.||)
                       ROW(k, c.outcome, c.token, c.attempts, c.payload, c.expires_at)::idempotency.claim_answer;
        END LOOP;
    END IF;
    -- In input order; a repeated key gets its first occurrence's answer, but only the first owns a claim.
    -- (As many answers as keys: the keys are all different.)
    IF pg_catalog.cardinality(answers) OPERATOR(pg_catalog.=) pg_catalog.cardinality(idem_claim_batch.keys) THEN
        RETURN QUERY
        SELECT a.key, a.outcome, a.token, a.attempts, a.payload, a.expires_at
          FROM pg_catalog.unnest(idem_claim_batch.keys) WITH ORDINALITY AS u(k, i)
          JOIN pg_catalog.unnest(answers) a ON a.key OPERATOR(pg_catalog.=) u.k
         ORDER BY u.i;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.k,
           CASE WHEN NOT u.first AND a.outcome OPERATOR(pg_catalog.=) 'claimed' THEN 'in_progress' ELSE a.outcome END,
           CASE WHEN NOT u.first AND a.outcome OPERATOR(pg_catalog.=) 'claimed' THEN NULL ELSE a.token END,
           a.attempts, a.payload, a.expires_at
      FROM (SELECT v.k, v.i, pg_catalog.row_number() OVER (PARTITION BY v.k ORDER BY v.i) OPERATOR(pg_catalog.=) 1 AS first
              FROM pg_catalog.unnest(idem_claim_batch.keys) WITH ORDINALITY AS v(k, i)) u
      JOIN pg_catalog.unnest(answers) a ON a.key OPERATOR(pg_catalog.=) u.k
     ORDER BY u.i;
END
$$;

CREATE OR REPLACE FUNCTION idem_once_batch(keys text[], scope text DEFAULT 'default') RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, false, false);
    st idempotency.call_state;
    fresh text[];
    parts oid[];
    ctids tid[];
    iver bigint;
    maybes text[];
    slow boolean := true;
    k text;
    one boolean;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(true, false, false);
    END IF;
    -- The common case, as idem_once's (idempotency.fast_version, and no idempotency.max_batch_keys of the
    -- session): the arguments checked at once (the control characters by one pattern over the keys joined and
    -- the scope, the rest key by key in one statement), the state from idempotency.cached_state. Anything
    -- else, a bad argument included, takes the long way, which checks in the native extension's order.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_once_batch.keys, idem_once_batch.scope)
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_once_batch.keys)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_once_batch.scope);
        END IF;
        st := idempotency.cached_state();
    ELSE
        PERFORM idempotency.check_batch('idem_once_batch', idem_once_batch.keys, idem_once_batch.scope);
        st := idempotency.call_state(NULL, true);
        IF st.stale_seal THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope);
        END IF;
    END IF;
    -- As idem_claim_batch: the new keys in one write with the state's constants when they are current, else
    -- (or when a seal moved past the write partition meanwhile) key by key the long way (idempotency.once_one).
    -- A key whose print matched in the key filters of the sealed partitions is not written here: it goes
    -- the long way, after the others.
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        -- (Apart from the write, and only where a filter exists: a list of the keys that both statements read
        -- would be materialized, which cost every batch 3,500 instructions a key.)
        IF (idempotency.cached_state()).filtered THEN
            -- (Each key's hash computed once, as in idem_claim_batch.)
            maybes := ARRAY(SELECT DISTINCT u.k
                              FROM (SELECT v.k, idempotency.key_hash(v.k, idem_once_batch.scope) AS h
                                      FROM pg_catalog.unnest(idem_once_batch.keys) AS v(k) OFFSET 0) u
                             WHERE EXISTS (SELECT FROM idempotency.sealed_key_matches(u.h)));
        END IF;
        WITH written AS (
            INSERT INTO idempotency.records AS x (scope, key, status, attempts, created_at, updated_at)
            SELECT idem_once_batch.scope, d.k, 'completed', 1,
                   idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                   pg_catalog.now()
              FROM (SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k)) d
             -- (a hashed subplan, built once: linear in the batch)
             WHERE d.k NOT IN (SELECT m.k FROM pg_catalog.unnest(maybes) AS m(k))
               AND (NOT ((idempotency.cached_state()).unfiltered_from IS NOT NULL OR (idempotency.cached_state()).probe_ahead)
                    OR NOT EXISTS (SELECT FROM idempotency.records o
                                    WHERE o.key OPERATOR(pg_catalog.=) d.k AND o.scope OPERATOR(pg_catalog.=) idem_once_batch.scope
                                      AND ((o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                                            AND o.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                                           OR ((idempotency.cached_state()).probe_ahead
                                               AND o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to))))
             ORDER BY d.k
            ON CONFLICT DO NOTHING
            RETURNING x.key, x.tableoid, x.ctid)
        SELECT pg_catalog.array_agg(wr.key), pg_catalog.array_agg(wr.tableoid), pg_catalog.array_agg(wr.ctid),
               (idempotency.cached_state()).upto
          INTO fresh, parts, ctids, iver FROM written wr;
        IF fresh IS NULL
           OR (iver OPERATOR(pg_catalog.=) st.upto
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.=) iver) THEN
            slow := false;
        ELSE
            PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
            DELETE FROM idempotency.records x USING ROWS FROM (pg_catalog.unnest(parts), pg_catalog.unnest(ctids)) AS d(part, row_ctid)
             WHERE x.tableoid OPERATOR(pg_catalog.=) d.part AND x.ctid OPERATOR(pg_catalog.=) d.row_ctid;
            fresh := NULL;
            st := idempotency.call_state(NULL, true);
        END IF;
    END IF;
    IF slow OR maybes IS NOT NULL THEN
        FOR k IN SELECT DISTINCT u.k FROM pg_catalog.unnest(CASE WHEN slow THEN idem_once_batch.keys ELSE maybes END) AS u(k)
                  ORDER BY u.k LOOP
            LOOP
                one := idempotency.once_one(k, idem_once_batch.scope, st);
                EXIT WHEN one IS NOT NULL;
                st := idempotency.call_state(NULL, true);
            END LOOP;
            IF one THEN
                fresh := fresh OPERATOR(pg_catalog.||) k;
            END IF;
        END LOOP;
    END IF;
    -- Keys that were there were read, not written: under SERIALIZABLE, read them as a query does (see
    -- idempotency.once_one).
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'serializable' THEN
        PERFORM FROM idempotency.records x
         WHERE x.scope OPERATOR(pg_catalog.=) idem_once_batch.scope AND x.key OPERATOR(pg_catalog.=) ANY (idem_once_batch.keys)
           AND x.created_at OPERATOR(pg_catalog.>=) st.w_from AND x.created_at OPERATOR(pg_catalog.<) st.w_to;
    END IF;
    -- In input order, each new key once. (Every key new: a key is written once, so the keys are all different,
    -- and they are the answer as given.)
    IF pg_catalog.cardinality(fresh) OPERATOR(pg_catalog.=) pg_catalog.cardinality(idem_once_batch.keys) THEN
        RETURN QUERY SELECT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT v.k FROM (SELECT u.k, pg_catalog.min(u.i) AS i
                       FROM pg_catalog.unnest(idem_once_batch.keys) WITH ORDINALITY AS u(k, i)
                       JOIN pg_catalog.unnest(fresh) AS f(k) ON f.k OPERATOR(pg_catalog.=) u.k
                      GROUP BY u.k) v
     ORDER BY v.i;
END
$$;

-- (0.9.2's sql/edition/ 90-finalize.sql, as scripts/sql-edition --expand wrote it in)
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
