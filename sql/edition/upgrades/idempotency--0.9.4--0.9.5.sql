-- The SQL edition, 0.9.4 -> 0.9.5 (issue 32: the common paths' first test where the native library is loaded in
-- the cluster). Nothing stored changes. A native library of 0.9.5 or later has one read-only setting,
-- idempotency.edition_common_path: under READ COMMITTED, read-write, which groups of the idempotency.* limits the
-- calls read are at its defaults ('keys', then ',lease', ',payload', ',batch'), else 'off'.
-- idempotency.fast_version reads it (four function calls, through idempotency.common_path_says) in place of the
-- concatenation of seven settings (eleven), and idempotency.batch_args_fast reads its ',batch'. Whether the
-- library has it is part of the state: idempotency.call_state gets an attribute, common_path_guc, which
-- idempotency.live_state computes and idempotency.write_call_cache writes; an older library keeps 0.9.4's test.
-- The state is written again at the end; until then no call runs in this transaction. Run by the 0.9.5 plain
-- script over a 0.9.4 install, or by ALTER EXTENSION idempotency UPDATE after the 0.9.5 idempotency-tle.sql
-- registered this path; in either case one transaction, in the schema of the install.

ALTER TYPE idempotency.call_state ADD ATTRIBUTE common_path_guc boolean;

-- Every function that changed in 0.9.5, from the sources.
-- (0.9.5's sql/edition/ 15-state.sql: idempotency.live_state idempotency.write_call_cache idempotency.common_path_says idempotency.fast_version, as scripts/sql-edition --expand wrote it in)
-- The state as the tables say it now (the partitions, the seals, the settings, the grants): the one
-- source of idempotency.call_cache, and what a call reads when the cache does not match sealed_upto.
CREATE OR REPLACE FUNCTION idempotency.live_state() RETURNS idempotency.call_state
LANGUAGE plpgsql AS $$
DECLARE
    st idempotency.call_state;
BEGIN
    -- sealed_upto is read before the partitions: a seal that moves it later is caught after the write
    -- (idempotency.claim_one, once_one), one that moved it before is seen here.
    st.upto := coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0);
    SELECT s.max_lease_ttl, s.max_attempts, s.max_key_bytes, s.max_payload_bytes, s.max_batch_keys, s.lease_ttl,
           s.require_scope_grants OR EXISTS (SELECT FROM idempotency.scope_grants g WHERE g.kind OPERATOR(pg_catalog.=) 'scope'),
           w.range_from, w.range_to, (EXTRACT(epoch FROM w.range_to) OPERATOR(pg_catalog.*) 1000000)::bigint,
           EXISTS (SELECT FROM idempotency.partition_ranges b WHERE b.range_from OPERATOR(pg_catalog.<) w.range_from),
           EXISTS (SELECT FROM idempotency.partition_ranges a
                    WHERE a.range_from OPERATOR(pg_catalog.>=) w.range_to AND NOT a.known_empty),
           st.upto OPERATOR(pg_catalog.>) coalesce((SELECT (EXTRACT(epoch FROM pg_catalog.max(x.range_to)) OPERATOR(pg_catalog.*) 1000000)::bigint
                                                      FROM idempotency.sealed x), 0),
           st.upto OPERATOR(pg_catalog.>) 0
             AND (EXTRACT(epoch FROM w.range_from) OPERATOR(pg_catalog.*) 1000000)::bigint OPERATOR(pg_catalog.=) st.upto,
           'idempotency.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(w.partition_name)   -- (NULL without one)
      INTO st.max_lease_ttl, st.max_attempts, st.max_key_bytes, st.max_payload_bytes, st.max_batch_keys, st.lease_ttl,
           st.grants_enforced, st.w_from, st.w_to, st.w_to_us, st.probe_before, st.probe_ahead, st.stale_seal, st.w_at_seal,
           st.w_name
      FROM idempotency.settings s
      LEFT JOIN LATERAL (
           SELECT p.range_from, p.range_to, p.partition_name FROM idempotency.partition_ranges p
            WHERE p.range_from OPERATOR(pg_catalog.>=) CASE WHEN st.upto OPERATOR(pg_catalog.=) 0 THEN '-infinity'::timestamptz
                   ELSE pg_catalog.to_timestamp(st.upto::pg_catalog.float8 OPERATOR(pg_catalog./) 1000000) END
            ORDER BY p.range_from LIMIT 1) w ON true;
    -- The partitions before the write partition that a new key is looked for in through the key filters
    -- (idempotency.filters_usable: not where this server hashes keys otherwise than the one that wrote them),
    -- and from where the others begin, which are read through their indexes.
    st.filtered := idempotency.filters_usable()
        AND EXISTS (SELECT FROM idempotency.sealed x
                     WHERE x.filtered_keys IS NOT NULL AND x.range_from OPERATOR(pg_catalog.<) st.w_from);
    SELECT pg_catalog.min(p.range_from) INTO st.unfiltered_from FROM idempotency.partition_ranges p
     WHERE p.range_from OPERATOR(pg_catalog.<) st.w_from
       AND NOT (st.filtered AND EXISTS (SELECT FROM idempotency.sealed x
                                         WHERE x.partition OPERATOR(pg_catalog.=) p.partition
                                           AND x.filtered_keys IS NOT NULL));
    st.lease_ttl_ok := st.lease_ttl OPERATOR(pg_catalog.>) '0'::interval AND st.lease_ttl OPERATOR(pg_catalog.<=) st.max_lease_ttl;
    st.max_payload_bytes_4 := st.max_payload_bytes OPERATOR(pg_catalog.-) 4;
    -- What the old path would make of the native extension's settings at their defaults (as a session sees
    -- them where the native library is loaded, in another database of the cluster): limits no looser than
    -- those defaults, and the lease at its default, so that reading the defaults as session values changes
    -- nothing (idempotency.limit_in_force keeps the tighter of each). Only where the library is loaded (its
    -- setting has no flag, where a placeholder's is NO_SHOW_ALL; only a superuser sets it): without it, a
    -- consumer may set a placeholder to a default's text, and a value ALTER ROLE gave the session is a floor
    -- that the text must not lift. (fast_version tests it again in the calling session: the library may be
    -- loaded in the session that wrote the state and not in the caller's.)
    st.native_defaults_ok := st.max_key_bytes OPERATOR(pg_catalog.<=) 512
        AND st.max_payload_bytes OPERATOR(pg_catalog.<=) 1048576 AND st.max_lease_ttl OPERATOR(pg_catalog.<=) '1 day'::interval
        AND st.lease_ttl OPERATOR(pg_catalog.=) '5 min'::interval AND st.max_batch_keys OPERATOR(pg_catalog.<=) 1000
        AND st.max_attempts OPERATOR(pg_catalog.<=) 5
        AND pg_catalog.pg_settings_get_flags('idempotency.max_key_bytes') OPERATOR(pg_catalog.=) '{}'::text[];
    -- (A library of 0.9.5 or later also says in one setting whether a session's limits are at its defaults:
    -- see fast_version.)
    st.common_path_guc := st.native_defaults_ok
        AND pg_catalog.pg_settings_get_flags('idempotency.edition_common_path') OPERATOR(pg_catalog.=) '{}'::text[];
    RETURN st;
END
$$;

-- Writes idempotency.cached_state from the tables. One writer at a time, reading the tables after the
-- previous one committed (READ COMMITTED); under REPEATABLE READ or SERIALIZABLE the snapshot may be older
-- than the last writer's, so the state is marked out of date (upto -1) instead, and calls read the tables
-- until the next maintenance round writes it again. The constants are written so that they read back the
-- same under any DateStyle, TimeZone or IntervalStyle (timestamps as microseconds since 1970). A state that
-- differs from the one in force is written with a new generation (gen: this transaction's id, which no other
-- writer shares, and only the last state a transaction writes is seen by others): a call that reads the same
-- generation before its guards and in its write read one state throughout (idem_claim, idem_once).
CREATE OR REPLACE FUNCTION idempotency.write_call_cache() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET intervalstyle = 'postgres' AS $$
DECLARE
    st idempotency.call_state;
    fields text;
    tail text;
    body text;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency.call_cache')::bigint);
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        st := idempotency.live_state();
    ELSE
        st.upto := -1;
    END IF;
    fields := pg_catalog.format(
        '%L::interval, %s, %s, %s, %s, %L::interval, %s, %s, %s, %s, %s, %s, %s, false, %s, %s, %s, %s, %L, %s, %s',
        st.max_lease_ttl, coalesce(st.max_attempts::text, 'NULL'), coalesce(st.max_key_bytes::text, 'NULL'),
        coalesce(st.max_payload_bytes::text, 'NULL'), coalesce(st.max_batch_keys::text, 'NULL'), st.lease_ttl,
        coalesce(st.grants_enforced::text, 'NULL'), st.upto,
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.w_from))::text OPERATOR(pg_catalog.||) ')', 'NULL'),
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.w_to))::text OPERATOR(pg_catalog.||) ')', 'NULL'),
        coalesce(st.w_to_us::text, 'NULL'), coalesce(st.probe_before::text, 'NULL'), coalesce(st.probe_ahead::text, 'NULL'),
        coalesce(st.w_at_seal::text, 'NULL'), coalesce(st.lease_ttl_ok::text, 'NULL'), coalesce(st.max_payload_bytes_4::text, 'NULL'),
        coalesce(st.native_defaults_ok::text, 'NULL'), st.w_name, coalesce(st.filtered::text, 'NULL'),
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.unfiltered_from))::text OPERATOR(pg_catalog.||) ')', 'NULL'));
    tail := ', ' OPERATOR(pg_catalog.||) coalesce(st.common_path_guc::text, 'NULL') OPERATOR(pg_catalog.||) ')::idempotency.call_state';
    -- (The body in force is 'SELECT ROW(<fields>, <gen>, <common_path_guc>)::idempotency.call_state'.)
    body := (SELECT pg_catalog.btrim(p.prosrc, E' \n') FROM pg_catalog.pg_proc p
              WHERE p.oid OPERATOR(pg_catalog.=) 'idempotency.cached_state()'::pg_catalog.regprocedure);
    IF NOT (pg_catalog.starts_with(body, 'SELECT ROW(' OPERATOR(pg_catalog.||) fields OPERATOR(pg_catalog.||) ', ')
            AND pg_catalog.right(body, pg_catalog.length(tail)) OPERATOR(pg_catalog.=) tail) THEN
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION idempotency.cached_state() RETURNS idempotency.call_state '
                                  'LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                                  'SELECT ROW(' OPERATOR(pg_catalog.||) fields OPERATOR(pg_catalog.||) ', '
                                  OPERATOR(pg_catalog.||) pg_catalog.pg_current_xact_id()::text OPERATOR(pg_catalog.||) tail);
    END IF;
END
$$;

-- Whether the native library's idempotency.edition_common_path (0.9.5) says, in this session, that the groups
-- of limits that pattern names are at their defaults (a LIKE pattern over its value: 'keys,lease%', '%,batch').
-- The flags test tells the library's setting from a placeholder of that name, which a session without the
-- library may set to anything. For fast_version and batch_args_fast (inlined, as they are: the pattern is a
-- constant of each call).
CREATE OR REPLACE FUNCTION idempotency.common_path_says(pattern text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.pg_settings_get_flags('idempotency.edition_common_path') OPERATOR(pg_catalog.=) '{}'::text[]
       AND pg_catalog.current_setting('idempotency.edition_common_path', true) OPERATOR(pg_catalog.~~) pattern
$$;

-- Whether a key call may take its common path, which reads the state as the constants of
-- idempotency.cached_state (folded into each statement's plan, so that a statement reads only the partitions
-- they name): their version (upto) when the call may, else -1 and the call takes the long way
-- (idempotency.call_state). It may in a READ COMMITTED, read-write transaction where the idempotency.* limits
-- the call reads (lease: lease_ttl and max_lease_ttl; payload: max_payload_bytes; always max_key_bytes and
-- require_scope_grants) change nothing. Where the native library is not loaded (st.native_defaults_ok
-- false: see live_state), none of them may have been set in the session (not even to '', as a limit set and
-- reset leaves it: a value that ALTER ROLE or ALTER DATABASE gave the session is a floor, and '' must not lift
-- it; the long way applies it). Where it is loaded, and its defaults are no looser than the settings table,
-- they must show the native extension's defaults (src/gucs/mod.rs), and the library must be loaded in this
-- session too (its setting has no flag; a placeholder's is NO_SHOW_ALL): a placeholder may hold any text, the
-- library's settings only their canonical text, which only a superuser sets, so that their concatenation
-- reads as the defaults only if they are. A library of 0.9.5 or later (st.common_path_guc) says all of that in
-- one read-only setting, idempotency.edition_common_path (src/gucs/common_path.rs): under READ COMMITTED,
-- read-write, with max_key_bytes and require_scope_grants at its defaults, 'keys', followed by ',lease',
-- ',payload' and ',batch' for each group of limits at its defaults, else 'off'; a call matches the groups it
-- reads with one LIKE. Nobody can set it (internal), and a placeholder of that name, in a session without the
-- library, has other flags. (The eleven function calls of the concatenation's test cost a claim 25,000
-- instructions; this one's four, a few thousand.) st.native_defaults_ok and st.common_path_guc are constants:
-- each call plans one branch.
-- (Before 0.9.4 a first test took the unset case and '', and the library's defaults cost each call a second
-- test, a tenth of its instructions, comparing a concatenation that a session could match with placeholder
-- texts such as '512Boff', having the table's limits instead of its role's.) st is
-- idempotency.cached_state(), named in the caller's expression: a plan is invalidated when cached_state is
-- replaced only if the planner met that call in the plan's own expression. Called inside an inlined helper,
-- its constants were folded in without that dependency, and a session's cached plans kept them (before
-- 0.9.4: a batch took a limit the owner had tightened as it was before, and after a seal every claim and
-- idem_once of a session that had called before went its long way, its version test failing). writing:
-- when the write partition is there and covers now. Whether the constants still match sealed_upto a writing
-- call learns after its write (after the write partition's lock): a seal that committed before this transaction began has replaced the constants already
-- (a change of cached_state invalidates the plans that folded them), so only a seal during the call can make
-- them stale. Inlined into the calls, with constant arguments: one expression of the fewest function calls
-- (PostgreSQL builds each call's state, with its EXECUTE privilege check, once per transaction: each costs a
-- key call's transaction about 1,000 instructions, and the whole call about 300,000).
CREATE OR REPLACE FUNCTION idempotency.fast_version(writing boolean, lease boolean, payload boolean, st idempotency.call_state)
RETURNS bigint
LANGUAGE sql AS $$
    SELECT CASE WHEN CASE WHEN st.common_path_guc
                          THEN idempotency.common_path_says('keys' OPERATOR(pg_catalog.||) CASE WHEN lease THEN ',lease' ELSE '' END
                                                            OPERATOR(pg_catalog.||) '%'
                                                            OPERATOR(pg_catalog.||) CASE WHEN payload THEN 'payload%' ELSE '' END)
                          WHEN st.native_defaults_ok
                          THEN pg_catalog.pg_settings_get_flags('idempotency.max_key_bytes') OPERATOR(pg_catalog.=) '{}'::text[]
                               AND pg_catalog.concat(pg_catalog.current_setting('transaction_isolation'),
                                                     pg_catalog.current_setting('transaction_read_only'),
                                                     pg_catalog.current_setting('idempotency.max_key_bytes', true),
                                                     pg_catalog.current_setting('idempotency.require_scope_grants', true),
                                                     CASE WHEN lease THEN pg_catalog.current_setting('idempotency.lease_ttl', true) END,
                                                     CASE WHEN lease THEN pg_catalog.current_setting('idempotency.max_lease_ttl', true) END,
                                                     CASE WHEN payload THEN pg_catalog.current_setting('idempotency.max_payload_bytes', true) END)
                                   OPERATOR(pg_catalog.=) ('read committedoff512Boff' OPERATOR(pg_catalog.||) CASE WHEN lease THEN '5min1d' ELSE '' END
                                                          OPERATOR(pg_catalog.||) CASE WHEN payload THEN '1MB' ELSE '' END)
                          ELSE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
                               AND pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off'
                               AND pg_catalog.num_nonnulls(pg_catalog.current_setting('idempotency.max_key_bytes', true),
                                                           pg_catalog.current_setting('idempotency.require_scope_grants', true),
                                                           CASE WHEN lease THEN pg_catalog.current_setting('idempotency.lease_ttl', true) END,
                                                           CASE WHEN lease THEN pg_catalog.current_setting('idempotency.max_lease_ttl', true) END,
                                                           CASE WHEN payload THEN pg_catalog.current_setting('idempotency.max_payload_bytes', true) END)
                                   OPERATOR(pg_catalog.=) 0 END
                THEN idempotency.fast_state(writing, st) ELSE -1 END
$$;

-- (0.9.5's sql/edition/ 40-batch.sql: idempotency.batch_args_fast, as scripts/sql-edition --expand wrote it in)
-- The common case of a batch's arguments, for the batches' single test (as idem_claim's with
-- idempotency.fast_version): no idempotency.max_batch_keys of the session (or the native library's default,
-- where it changes nothing, as fast_version takes it; not '', which the long way reads as no value of the
-- session but keeps a value of its role or database), the size and the scope within the limits of st (the
-- caller's idempotency.cached_state(), passed as fast_version's is), and no control character in the keys or
-- the scope (one pattern over the keys joined and the scope); with NOT EXISTS (SELECT FROM
-- idempotency.bad_keys(keys, max_key_bytes)) for the rest. Anything else takes the long way, which checks in
-- the native extension's order. Where the library has idempotency.edition_common_path (st.common_path_guc),
-- that setting says whether max_batch_keys has its default (read here, in this expression's own plan: the
-- callers' fast_version was planned apart, possibly with another state). (SQL without a subquery: inlined
-- into the calls.)
CREATE OR REPLACE FUNCTION idempotency.batch_args_fast(keys text[], scope text, st idempotency.call_state) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN st.common_path_guc
                THEN idempotency.common_path_says('%,batch')
                WHEN st.native_defaults_ok
                THEN pg_catalog.pg_settings_get_flags('idempotency.max_batch_keys') OPERATOR(pg_catalog.=) '{}'::text[]
                     AND pg_catalog.current_setting('idempotency.max_batch_keys', true) OPERATOR(pg_catalog.=) '1000'
                ELSE pg_catalog.current_setting('idempotency.max_batch_keys', true) IS NULL END
       AND pg_catalog.cardinality(keys) OPERATOR(pg_catalog.<=) st.max_batch_keys
       AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) st.max_key_bytes
       AND (pg_catalog.array_to_string(keys, '') OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) scope)
           OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]*\u0001[^\u0001-\u001f\u007f-\u009f]+$'
$$;

SELECT FROM idempotency.write_call_cache();
-- (0.9.5's sql/edition/ 90-finalize.sql, as scripts/sql-edition --expand wrote it in)
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
