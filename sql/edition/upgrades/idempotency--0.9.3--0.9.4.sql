-- The SQL edition, 0.9.3 -> 0.9.4 (issue 32: the common paths where the native library is loaded in the
-- cluster, and in sessions that ran them before a change of the state). Nothing stored changes.
-- idempotency.fast_version takes the idempotency.* limits as unset or, where the native library is loaded, at
-- its defaults, in one test (before, that case went through a second test, idempotency.fast_version_native),
-- and idempotency.batch_args_fast takes the library's default of max_batch_keys the same way (before, the
-- batches took the long way there). fast_version, fast_state, batch_args_fast and bad_keys take the state
-- from their callers, which name idempotency.cached_state() in their own expressions, so that replacing it
-- invalidates the callers' plans (read inside the helpers, its constants stayed in a session's cached plans).
-- A limit a session set to '' no longer lifts a value ALTER ROLE or ALTER DATABASE gave it (config, call_state,
-- limit_in_force, limit_value), nor does SET ROLE lift the login role's (configured_values), and the native
-- library's default texts count as changing nothing only where the library is loaded, in the state's writer
-- and in the caller's session (live_state's native_defaults_ok, fast_version, batch_args_fast; the state is
-- written again at the end).
-- The common paths read one state from their first guard to their write: idempotency.call_state gets a
-- generation (gen), which idempotency.write_call_cache gives each state it writes, and idem_claim, idem_once
-- and idem_once_batch compare the generation their write planned with against the one read first (before,
-- they compared sealed_upto's version only, which a maintenance round writing a key filter does not move:
-- a key held by a sealed partition could be answered as new). The state is written again at the end; until
-- then no call runs in this transaction.
-- The helpers have new arguments: the new ones are made, the calls replaced, then the old ones dropped. Run
-- by the 0.9.4 plain script over a 0.9.3 install, or by ALTER EXTENSION idempotency UPDATE after the 0.9.4
-- idempotency-tle.sql registered this path; in either case one transaction, in the schema of the install.

ALTER TYPE idempotency.call_state ADD ATTRIBUTE gen bigint;

-- Every function that changed in 0.9.4, from the sources.
-- (0.9.4's sql/edition/ 10-common.sql: idempotency.session_value idempotency.configured_values idempotency.limit_in_force idempotency.limit_value idempotency.config, as scripts/sql-edition --expand wrote it in)
-- A setting's text as the session gave it (SET idempotency.<name>), or NULL (never set, or set to '').
CREATE OR REPLACE FUNCTION idempotency.session_value(name text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NULLIF(pg_catalog.current_setting('idempotency.' OPERATOR(pg_catalog.||) name, true), '')
$$;

-- The values ALTER DATABASE ... SET and ALTER ROLE ... SET give a setting for this database and the calling
-- role or the session's login role (the floors a session must not loosen: SET ROLE to another role keeps the
-- login role's). Setting names are matched without regard to case, as PostgreSQL matches them.
CREATE OR REPLACE FUNCTION idempotency.configured_values(name text) RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN ARRAY(
        SELECT pg_catalog.substr(c, pg_catalog.length(name) OPERATOR(pg_catalog.+) 14)
          FROM pg_catalog.pg_db_role_setting d, pg_catalog.unnest(d.setconfig) AS c
         WHERE d.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0::oid, (SELECT b.oid FROM pg_catalog.pg_database b
                                                                         WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())])
           AND d.setrole OPERATOR(pg_catalog.=) ANY (ARRAY[0::oid, (SELECT r.oid FROM pg_catalog.pg_roles r
                                                                     WHERE r.rolname OPERATOR(pg_catalog.=) idempotency.caller()),
                                                        (SELECT r.oid FROM pg_catalog.pg_roles r
                                                          WHERE r.rolname OPERATOR(pg_catalog.=) SESSION_USER)])
           AND pg_catalog.starts_with(pg_catalog.lower(c), 'idempotency.' OPERATOR(pg_catalog.||) name OPERATOR(pg_catalog.||) '='));
END
$$;

-- One limit in force: the table's value, tightened by any ALTER DATABASE / ALTER ROLE value and by the
-- session's own (SET idempotency.<name>; NULL: set to ''); a superuser's session value stands as it is
-- (set to '': the table's). kind: 'n' (a number), 'b' (bytes), 's' (seconds, for an interval as
-- microseconds), 'g' (require_scope_grants: 0 on).
CREATE OR REPLACE FUNCTION idempotency.limit_in_force(name text, table_value bigint, session_value text, kind text) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    v bigint := table_value;
    c text;
BEGIN
    IF idempotency.session_is_superuser() THEN
        RETURN coalesce(idempotency.limit_value(session_value, kind), table_value);
    END IF;
    FOREACH c IN ARRAY idempotency.configured_values(name) || ARRAY[session_value] LOOP
        v := LEAST(v, idempotency.limit_value(c, kind));
    END LOOP;
    RETURN v;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.limit_value(value text, kind text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN CASE kind
        WHEN 'b' THEN idempotency.parse_bytes(value)
        WHEN 's' THEN (EXTRACT(epoch FROM idempotency.parse_interval(value, 's')) OPERATOR(pg_catalog.*) 1000000)::bigint
        WHEN 'g' THEN CASE value::boolean WHEN true THEN 0 WHEN false THEN 1 END   -- require_scope_grants: on is the tighter
        ELSE value::bigint END;
END
$$;

-- The settings in force for this call: idempotency.settings, where a session's SET idempotency.<name> (or
-- a value ALTER DATABASE / ALTER ROLE set) may tighten a limit (any role) or loosen it (a superuser's
-- session only); lease_ttl a session sets freely. Only a session that has an idempotency.* limit set pays
-- for more than the one row.
CREATE OR REPLACE FUNCTION idempotency.config() RETURNS idempotency.settings
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    s idempotency.settings;
    v text;
BEGIN
    SELECT * INTO STRICT s FROM idempotency.settings;
    v := idempotency.session_value('lease_ttl');
    IF v IS NOT NULL THEN s.lease_ttl := idempotency.parse_interval(v, 'ms'); END IF;
    -- A limit the session holds a value of, even '' (set and reset, or set to nothing: the session's own value
    -- is then none, but one that ALTER ROLE or ALTER DATABASE gave it still holds).
    IF pg_catalog.current_setting('idempotency.max_lease_ttl', true) IS NOT NULL THEN
        s.max_lease_ttl := pg_catalog.make_interval(secs => idempotency.limit_in_force('max_lease_ttl',
            (EXTRACT(epoch FROM s.max_lease_ttl) OPERATOR(pg_catalog.*) 1000000)::bigint,
            idempotency.session_value('max_lease_ttl'), 's')::pg_catalog.float8 OPERATOR(pg_catalog./) 1000000);
    END IF;
    IF pg_catalog.current_setting('idempotency.max_attempts', true) IS NOT NULL THEN
        s.max_attempts := idempotency.limit_in_force('max_attempts', s.max_attempts, idempotency.session_value('max_attempts'), 'n');
    END IF;
    IF pg_catalog.current_setting('idempotency.max_key_bytes', true) IS NOT NULL THEN
        s.max_key_bytes := idempotency.limit_in_force('max_key_bytes', s.max_key_bytes, idempotency.session_value('max_key_bytes'), 'b');
    END IF;
    IF pg_catalog.current_setting('idempotency.max_payload_bytes', true) IS NOT NULL THEN
        s.max_payload_bytes := idempotency.limit_in_force('max_payload_bytes', s.max_payload_bytes,
                                                          idempotency.session_value('max_payload_bytes'), 'b');
    END IF;
    IF pg_catalog.current_setting('idempotency.max_batch_keys', true) IS NOT NULL THEN
        s.max_batch_keys := idempotency.limit_in_force('max_batch_keys', s.max_batch_keys, idempotency.session_value('max_batch_keys'), 'n');
    END IF;
    IF pg_catalog.current_setting('idempotency.require_scope_grants', true) IS NOT NULL THEN
        s.require_scope_grants := idempotency.limit_in_force('require_scope_grants',
            CASE WHEN s.require_scope_grants THEN 0 ELSE 1 END, idempotency.session_value('require_scope_grants'), 'g')
            OPERATOR(pg_catalog.=) 0;
    END IF;
    RETURN s;
END
$$;

-- (0.9.4's sql/edition/ 15-state.sql: idempotency.live_state idempotency.write_call_cache idempotency.call_state idempotency.fast_state idempotency.fast_version, as scripts/sql-edition --expand wrote it in)
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
    -- (The body in force is 'SELECT ROW(<fields>, <gen>)::idempotency.call_state'.)
    IF NOT pg_catalog.starts_with((SELECT pg_catalog.btrim(p.prosrc, E' \n') FROM pg_catalog.pg_proc p
                                    WHERE p.oid OPERATOR(pg_catalog.=) 'idempotency.cached_state()'::pg_catalog.regprocedure),
                                   'SELECT ROW(' OPERATOR(pg_catalog.||) fields OPERATOR(pg_catalog.||) ', ') THEN
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION idempotency.cached_state() RETURNS idempotency.call_state '
                                  'LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                                  'SELECT ROW(' OPERATOR(pg_catalog.||) fields OPERATOR(pg_catalog.||) ', '
                                  OPERATOR(pg_catalog.||) pg_catalog.pg_current_xact_id()::text
                                  OPERATOR(pg_catalog.||) ')::idempotency.call_state');
    END IF;
END
$$;

-- The state of one call, the long way: fn names the call for the read-only error (NULL: a call that reads
-- only); writing: the write partition too, made when there is none (idempotency.write_partition). The
-- constants of idempotency.cached_state when they match sealed_upto (every call but those during a seal),
-- else the tables; under REPEATABLE READ and SERIALIZABLE, whether a seal committed after the snapshot; a
-- session that set an idempotency.* limit (or had one set by ALTER DATABASE / ALTER ROLE) gets the limits of
-- idempotency.config().
CREATE OR REPLACE FUNCTION idempotency.call_state(fn text, writing boolean) RETURNS idempotency.call_state
LANGUAGE plpgsql AS $$
DECLARE
    st idempotency.call_state := idempotency.cached_state();
    upto bigint := coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0);
    cfg idempotency.settings;
BEGIN
    IF fn IS NOT NULL AND pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
        PERFORM idempotency.check_writable(fn);
    END IF;
    IF st.upto IS DISTINCT FROM upto THEN
        st := idempotency.live_state();
    END IF;
    -- The write partition dropped by hand: forgotten (its row in partition_ranges), and made again below.
    IF writing AND st.w_name IS NOT NULL AND pg_catalog.to_regclass(st.w_name) IS NULL THEN
        PERFORM idempotency.sync_partition_ranges();
        st := idempotency.live_state();
    END IF;
    -- Nothing to write to, or a gap before the oldest unsealed partition: idempotency.write_partition makes
    -- the partitions (and waits for a seal under way), then the state is read again.
    IF writing AND (st.w_from IS NULL OR st.w_from OPERATOR(pg_catalog.>)
                    GREATEST(pg_catalog.now(), CASE WHEN st.upto OPERATOR(pg_catalog.<=) 0 THEN '-infinity'::timestamptz
                             ELSE pg_catalog.to_timestamp(st.upto::pg_catalog.float8 OPERATOR(pg_catalog./) 1000000) END)) THEN
        PERFORM idempotency.write_partition();
        st := idempotency.live_state();
    END IF;
    -- A seal the snapshot does not see (its rows may be missing from what this transaction reads).
    st.stale_seal := pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
        AND st.upto OPERATOR(pg_catalog.>) coalesce((SELECT (EXTRACT(epoch FROM pg_catalog.max(x.range_to)) OPERATOR(pg_catalog.*) 1000000)::bigint
                                                     FROM idempotency.sealed x), 0);
    -- A key filter written after the snapshot (REPEATABLE READ, SERIALIZABLE): the state counts its partition
    -- as filtered, and the batches' common write would look for a key there only in the filter, whose rows the
    -- snapshot does not see. Not this state's generation, then: the batches take their keys one by one
    -- (claim_one and once_one read the partitions themselves). (0.9.4; before, such a batch answered a key
    -- held by that partition as new.)
    IF st.filtered AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
       AND EXISTS (SELECT FROM idempotency.partition_ranges p
                    WHERE p.range_from OPERATOR(pg_catalog.<) coalesce(st.unfiltered_from, st.w_from)
                      AND NOT EXISTS (SELECT FROM idempotency.sealed x
                                       WHERE x.partition OPERATOR(pg_catalog.=) p.partition
                                         AND x.filtered_keys IS NOT NULL)) THEN
        st.gen := NULL;
    END IF;
    IF pg_catalog.num_nonnulls(pg_catalog.current_setting('idempotency.lease_ttl', true),
                               pg_catalog.current_setting('idempotency.max_lease_ttl', true),
                               pg_catalog.current_setting('idempotency.max_attempts', true),
                               pg_catalog.current_setting('idempotency.max_key_bytes', true),
                               pg_catalog.current_setting('idempotency.max_payload_bytes', true),
                               pg_catalog.current_setting('idempotency.max_batch_keys', true),
                               pg_catalog.current_setting('idempotency.require_scope_grants', true))
       OPERATOR(pg_catalog.>) 0 THEN
        cfg := idempotency.config();
        st.max_lease_ttl := cfg.max_lease_ttl; st.max_attempts := cfg.max_attempts; st.max_key_bytes := cfg.max_key_bytes;
        st.max_payload_bytes := cfg.max_payload_bytes; st.max_batch_keys := cfg.max_batch_keys; st.lease_ttl := cfg.lease_ttl;
        st.grants_enforced := cfg.require_scope_grants
            OR EXISTS (SELECT FROM idempotency.scope_grants g WHERE g.kind OPERATOR(pg_catalog.=) 'scope');
    END IF;
    RETURN st;
END
$$;

-- The state half of fast_version: the version (upto) of st, the constants of idempotency.cached_state(), or
-- -1 when a writing call would find the write partition dropped by hand, or not yet covering now. (Inlined,
-- as fast_version is.)
CREATE OR REPLACE FUNCTION idempotency.fast_state(writing boolean, st idempotency.call_state) RETURNS bigint
LANGUAGE sql AS $$
    SELECT CASE WHEN (NOT writing OR pg_catalog.to_regclass(st.w_name) IS NOT NULL)
                 AND (NOT writing OR st.w_at_seal OR st.w_from OPERATOR(pg_catalog.<=) pg_catalog.now())
                THEN st.upto ELSE -1 END
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
-- they must show the native extension's defaults (src/gucs.rs), and the library must be loaded in this
-- session too (its setting has no flag; a placeholder's is NO_SHOW_ALL): a placeholder may hold any text, the
-- library's settings only their canonical text, which only a superuser sets, so that their concatenation
-- reads as the defaults only if they are. st.native_defaults_ok is a constant: each call plans one branch.
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
    SELECT CASE WHEN CASE WHEN st.native_defaults_ok
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

-- (0.9.4's sql/edition/ 40-batch.sql: idempotency.batch_args_fast idempotency.bad_keys idem_claim_batch idem_once_batch, as scripts/sql-edition --expand wrote it in)
-- The common case of a batch's arguments, for the batches' single test (as idem_claim's with
-- idempotency.fast_version): no idempotency.max_batch_keys of the session (or the native library's default,
-- where it changes nothing, as fast_version takes it; not '', which the long way reads as no value of the
-- session but keeps a value of its role or database), the size and the scope within the limits of st (the
-- caller's idempotency.cached_state(), passed as fast_version's is), and no control character in the keys or
-- the scope (one pattern over the keys joined and the scope); with NOT EXISTS (SELECT FROM
-- idempotency.bad_keys(keys, max_key_bytes)) for the rest. Anything else takes the long way, which checks in
-- the native extension's order. (SQL without a subquery: inlined into the calls.)
CREATE OR REPLACE FUNCTION idempotency.batch_args_fast(keys text[], scope text, st idempotency.call_state) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN st.native_defaults_ok
                THEN pg_catalog.pg_settings_get_flags('idempotency.max_batch_keys') OPERATOR(pg_catalog.=) '{}'::text[]
                     AND pg_catalog.current_setting('idempotency.max_batch_keys', true) OPERATOR(pg_catalog.=) '1000'
                ELSE pg_catalog.current_setting('idempotency.max_batch_keys', true) IS NULL END
       AND pg_catalog.cardinality(keys) OPERATOR(pg_catalog.<=) st.max_batch_keys
       AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) st.max_key_bytes
       AND (pg_catalog.array_to_string(keys, '') OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) scope)
           OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]*\u0001[^\u0001-\u001f\u007f-\u009f]+$'
$$;

-- The keys of a batch that are NULL, empty or longer than max_bytes (the caller's
-- (idempotency.cached_state()).max_key_bytes, as fast_version's state). (A set-returning SQL function:
-- inlined into the calls' NOT EXISTS.)
CREATE OR REPLACE FUNCTION idempotency.bad_keys(keys text[], max_bytes integer) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT u.k FROM pg_catalog.unnest(keys) AS u(k)
     WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.=) ''
        OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) max_bytes
$$;

CREATE OR REPLACE FUNCTION idem_claim_batch(keys text[], ttl interval DEFAULT NULL, scope text DEFAULT 'default')
RETURNS TABLE (key text, outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, true, false, idempotency.cached_state());
    s idempotency.settings;
    t interval;
    st idempotency.call_state;
    c record;
    k text;
    answers idempotency.claim_answer[];
    w_from timestamptz;
    w_to timestamptz;
    wgen bigint;
BEGIN
    -- The common case, as idem_once_batch's, and a ttl within the limits.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_claim_batch.keys, idem_claim_batch.scope, idempotency.cached_state())
       AND (CASE WHEN idem_claim_batch.ttl IS NULL THEN (idempotency.cached_state()).lease_ttl_ok
                 ELSE idem_claim_batch.ttl OPERATOR(pg_catalog.>) '0'::interval
                      AND idem_claim_batch.ttl OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_lease_ttl END)
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_claim_batch.keys, (idempotency.cached_state()).max_key_bytes)) THEN
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
    -- (idempotency.cached_state, folded into the statement's plan) are st's (its generation); the write says
    -- the generation it planned with, and sealed_upto is checked after it (as idem_claim's). Otherwise, or when a seal
    -- moved past the write partition meanwhile (the rows deleted), every key goes the long way below.
    -- (st's generation, as in idem_once_batch: NULL when it came from the tables, or when the snapshot does
    -- not see a filter the state counts on.)
    IF st.gen OPERATOR(pg_catalog.=) (idempotency.cached_state()).gen THEN
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
              FROM fresh f
             -- (Written only with st's state: the statement is planned again at its first lock if the state
             -- was replaced since the test above, and may then hold another one, a filter the snapshot does
             -- not see, or one written under REPEATABLE READ, without a write partition.)
             WHERE (idempotency.cached_state()).gen OPERATOR(pg_catalog.=) st.gen
             ORDER BY f.k
            ON CONFLICT DO NOTHING
            RETURNING x.key, x.token, x.attempts, x.expires_at)
        SELECT pg_catalog.array_agg(ROW(wr.key, 'claimed', wr.token, wr.attempts, NULL, wr.expires_at)::idempotency.claim_answer),
               (idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to, (idempotency.cached_state()).gen
          INTO answers, w_from, w_to, wgen FROM written wr;
        IF wgen IS DISTINCT FROM st.gen
           OR (answers IS NOT NULL
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.<>) st.upto) THEN
            -- (A seal since st: under REPEATABLE READ and SERIALIZABLE the snapshot may miss its rows. Another
            -- change of the state: nothing was written, and the keys go one by one.)
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
                AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                    OPERATOR(pg_catalog.<>) st.upto;
            -- (The rows just written, found by key in the range of the partition written (the constants the
            -- write planned with; a row trigger may have moved a row's created_at, but not out of its partition)
            -- and as written by this transaction: each key's one such row. Not by key alone: while a seal is
            -- under way, the long way of an earlier call of this transaction may have written a key into the
            -- next partition. Their addresses are not collected for this rare case: that cost every batch 1,600
            -- instructions a key.)
            DELETE FROM idempotency.records x
             WHERE answers IS NOT NULL
               AND x.created_at OPERATOR(pg_catalog.>=) w_from AND x.created_at OPERATOR(pg_catalog.<) w_to
               AND x.key OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT a.key FROM pg_catalog.unnest(answers) a))
               AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope AND idempotency.written_here(x.xmin);
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
    ver bigint := idempotency.fast_version(true, false, false, idempotency.cached_state());
    st idempotency.call_state;
    fresh text[];
    w_from timestamptz;
    w_to timestamptz;
    wgen bigint;
    maybes text[];
    slow boolean := true;
    k text;
    one boolean;
BEGIN
    -- The common case, as idem_once's (idempotency.fast_version, and idempotency.batch_args_fast's test of
    -- idempotency.max_batch_keys): the arguments checked at once (the control characters by one pattern over the keys joined and
    -- the scope, the rest key by key in one statement), the state from idempotency.cached_state. Anything
    -- else, a bad argument included, takes the long way, which checks in the native extension's order.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_once_batch.keys, idem_once_batch.scope, idempotency.cached_state())
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_once_batch.keys, (idempotency.cached_state()).max_key_bytes)) THEN
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
    -- (st's generation: the state the guards read, or NULL when it came from the tables, or when the snapshot
    -- does not see a filter the state counts on: idempotency.call_state.)
    IF st.gen OPERATOR(pg_catalog.=) (idempotency.cached_state()).gen THEN
        -- (Apart from the write, and only where a filter exists: a list of the keys that both statements read
        -- would be materialized, which cost every batch 3,500 instructions a key.)
        IF (idempotency.cached_state()).filtered THEN
            -- (Each key's hash computed once, as in idem_claim_batch.)
            maybes := ARRAY(SELECT DISTINCT u.k
                              FROM (SELECT v.k, idempotency.key_hash(v.k, idem_once_batch.scope) AS h
                                      FROM pg_catalog.unnest(idem_once_batch.keys) AS v(k) OFFSET 0) u
                             WHERE EXISTS (SELECT FROM idempotency.sealed_key_matches(u.h)));
            -- (None matched, as in most batches: NULL, so that neither the write's test nor the long way runs.)
            IF pg_catalog.cardinality(maybes) OPERATOR(pg_catalog.=) 0 THEN
                maybes := NULL;
            END IF;
        END IF;
        WITH written AS (
            INSERT INTO idempotency.records AS x (scope, key, status, attempts, created_at, updated_at)
            SELECT idem_once_batch.scope, d.k, 'completed', 1,
                   idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                   pg_catalog.now()
              -- (DISTINCT by the sort that orders the write: hashing the keys, then sorting them, cost more)
              FROM (SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k) ORDER BY u.k) d
             -- (Written only with st's state, as in idem_claim_batch. maybes: a hashed subplan, built once:
             -- linear in the batch; not run without maybes.)
             WHERE (idempotency.cached_state()).gen OPERATOR(pg_catalog.=) st.gen
               AND (maybes IS NULL OR d.k NOT IN (SELECT m.k FROM pg_catalog.unnest(maybes) AS m(k)))
               AND (NOT ((idempotency.cached_state()).unfiltered_from IS NOT NULL OR (idempotency.cached_state()).probe_ahead)
                    OR NOT EXISTS (SELECT FROM idempotency.records o
                                    WHERE o.key OPERATOR(pg_catalog.=) d.k AND o.scope OPERATOR(pg_catalog.=) idem_once_batch.scope
                                      AND ((o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                                            AND o.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                                           OR ((idempotency.cached_state()).probe_ahead
                                               AND o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to))))
             ORDER BY d.k
            ON CONFLICT DO NOTHING
            RETURNING x.key)
        SELECT pg_catalog.array_agg(wr.key), (idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to,
               (idempotency.cached_state()).gen
          INTO fresh, w_from, w_to, wgen FROM written wr;
        -- (One state from st to the write, as in idem_claim: the filters' statement and the write may have
        -- been planned again after the state was replaced: edition_filter_race.spec.)
        IF wgen OPERATOR(pg_catalog.=) st.gen
           AND (fresh IS NULL
                OR coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.=) st.upto) THEN
            slow := false;
        ELSE
            -- (A seal since st: under REPEATABLE READ and SERIALIZABLE, the snapshot may miss its rows. Another
            -- change of the state: the keys go one by one.)
            PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
                AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                    OPERATOR(pg_catalog.<>) st.upto;
            -- (The rows just written, by key in the range written, as in idem_claim_batch; none when the
            -- generations differ.)
            DELETE FROM idempotency.records x
             WHERE fresh IS NOT NULL AND x.created_at OPERATOR(pg_catalog.>=) w_from AND x.created_at OPERATOR(pg_catalog.<) w_to
               AND x.key OPERATOR(pg_catalog.=) ANY (fresh) AND x.scope OPERATOR(pg_catalog.=) idem_once_batch.scope
               AND idempotency.written_here(x.xmin);
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

-- (0.9.4's sql/edition/ 30-keys.sql: idem_claim, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_claim(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default',
                           fingerprint text DEFAULT NULL, wait boolean DEFAULT true)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gen0 bigint := (idempotency.cached_state()).gen;   -- read first (below)
    ver bigint := idempotency.fast_version(true, true, false, idempotency.cached_state());
    planned bigint;
    st idempotency.call_state;
    t interval;
    conflicted boolean;
    elsewhere boolean;
    h bigint;
    written_at timestamptz;
    c record;
BEGIN
    -- The common case (idempotency.fast_version): arguments within the limits (key and scope not empty and
    -- without control characters: one pattern over both, joined by one; a NULL one fails it), no record of
    -- the key outside the write partition, and the new row written there. The state comes from
    -- idempotency.cached_state, folded into each statement's plan. The write returns what the claim answers
    -- and the generation of the state it planned with, which must be the one read first (gen0); then
    -- sealed_upto must still match the state's. (The claim is not remembered for idem_complete: in READ COMMITTED it finds the row by
    -- key, as written by this transaction.)
    IF ver OPERATOR(pg_catalog.>=) 0 AND idem_claim.wait
       AND GREATEST(pg_catalog.octet_length(idem_claim.key), pg_catalog.octet_length(idem_claim.scope),
                    pg_catalog.octet_length(idem_claim.fingerprint)) OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_key_bytes
       AND (idem_claim.key OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) idem_claim.scope)
           OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]+\u0001[^\u0001-\u001f\u007f-\u009f]+$'
       AND (CASE WHEN idem_claim.ttl IS NULL THEN (idempotency.cached_state()).lease_ttl_ok
                 ELSE idem_claim.ttl OPERATOR(pg_catalog.>) '0'::interval
                      AND idem_claim.ttl OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_lease_ttl END) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_claim.scope);
        END IF;
        -- Where else the key may be (a duplicate, or a print that matched: claim_one reads it): the key
        -- filters of the sealed partitions, then by index the partitions before the write partition without
        -- one (sealed in this round, or not sealed) and those after it that may hold rows.
        IF (idempotency.cached_state()).filtered THEN
            h := idempotency.key_hash(idem_claim.key, idem_claim.scope);
            elsewhere := EXISTS (SELECT FROM idempotency.sealed_key_matches(h));
        END IF;
        IF elsewhere IS NOT TRUE AND ((idempotency.cached_state()).unfiltered_from IS NOT NULL
                                      OR (idempotency.cached_state()).probe_ahead) THEN
            PERFORM FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) idem_claim.key AND x.scope OPERATOR(pg_catalog.=) idem_claim.scope
               AND ((x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                     AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                    OR ((idempotency.cached_state()).probe_ahead AND x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to));
            elsewhere := FOUND;
        END IF;
        IF elsewhere IS NOT TRUE THEN
            INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, fingerprint,
                                                  created_at, updated_at, expires_at)
            VALUES (idem_claim.scope, idem_claim.key, 'pending', pg_catalog.nextval('idempotency.token_seq'), 1,
                    idem_claim.fingerprint,
                    idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                    pg_catalog.clock_timestamp(),
                    pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) coalesce(idem_claim.ttl, (idempotency.cached_state()).lease_ttl))
            ON CONFLICT DO NOTHING
            RETURNING x.token, x.attempts, x.expires_at, x.created_at, (idempotency.cached_state()).gen
                 INTO idem_claim.token, idem_claim.attempts, idem_claim.expires_at, written_at, planned;
            conflicted := NOT FOUND;   -- the key is in the write partition: claim_one reads it
            -- One state throughout: each guard and statement folded cached_state() when it was planned, and a
            -- statement is planned again at its first lock after the state was replaced (a maintenance round
            -- that writes a key filter replaces it without moving sealed_upto: edition_filter_race.spec). A
            -- session never goes back to a state it replaced, and each state has its own generation, so the
            -- write's generation equal to the one read before everything else means every read between saw
            -- that state, ver's included. Then sealed_upto must still match it (a seal under way).
            IF planned OPERATOR(pg_catalog.=) gen0
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                   OPERATOR(pg_catalog.=) ver THEN
                outcome := 'claimed';
                RETURN NEXT;
                RETURN;
            END IF;
            IF conflicted THEN
                -- Settled there (a message delivered again): answered from its row, as claim_one answers it. A
                -- pending one (a lease, this transaction's own claim) goes the long way.
                SELECT x.status, x.token, x.attempts, x.payload, x.error, x.fingerprint INTO c FROM idempotency.records x
                 WHERE x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_from
                   AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_to
                   AND x.key OPERATOR(pg_catalog.=) idem_claim.key AND x.scope OPERATOR(pg_catalog.=) idem_claim.scope
                   AND x.status OPERATOR(pg_catalog.=) ANY ('{completed,failed}'::text[]);
                IF FOUND THEN
                    idem_claim.attempts := c.attempts; idem_claim.token := NULL; idem_claim.payload := NULL;
                    IF c.fingerprint IS NOT NULL AND idem_claim.fingerprint IS NOT NULL
                       AND c.fingerprint OPERATOR(pg_catalog.<>) idem_claim.fingerprint THEN
                        outcome := 'mismatch';
                    ELSIF c.status OPERATOR(pg_catalog.=) 'completed' THEN
                        outcome := 'completed'; idem_claim.token := c.token; idem_claim.payload := c.payload;
                    ELSE
                        outcome := 'failed'; idem_claim.payload := c.error;
                    END IF;
                    RETURN NEXT;
                    RETURN;
                END IF;
            ELSE
                -- A seal (or another change of the state) while this ran: the row may be where later claims of
                -- the key do not look. Deleted (found by key and created_at, as in idem_once); claimed again the
                -- long way.
                DELETE FROM idempotency.records x
                 WHERE x.created_at OPERATOR(pg_catalog.=) written_at
                   AND x.key OPERATOR(pg_catalog.=) idem_claim.key AND x.scope OPERATOR(pg_catalog.=) idem_claim.scope
                   AND idempotency.written_here(x.xmin);
            END IF;
        END IF;
    END IF;
    -- The long way: the state from idempotency.call_state, every argument checked in the native extension's
    -- order, the claim in idempotency.claim_one.
    st := idempotency.call_state('idem_claim', true);
    PERFORM idempotency.check_key_scope(idem_claim.key, idem_claim.scope, st.max_key_bytes);
    IF st.grants_enforced THEN
        PERFORM idempotency.authorize_enforced('scope', idem_claim.scope);
    END IF;
    t := idempotency.check_ttl(idem_claim.ttl, st.lease_ttl, st.max_lease_ttl);
    PERFORM idempotency.check_fingerprint(idem_claim.fingerprint, st.max_key_bytes);
    PERFORM idempotency.check_required('wait', idem_claim.wait);
    LOOP
        c := idempotency.claim_one(idem_claim.key, idem_claim.scope, t, idem_claim.fingerprint, idem_claim.wait, st,
                                   coalesce(conflicted, false));
        EXIT WHEN c.outcome OPERATOR(pg_catalog.<>) 'retry';
        st := idempotency.call_state('idem_claim', true);
        conflicted := false;
    END LOOP;
    outcome := c.outcome; token := c.token; attempts := c.attempts; payload := c.payload; expires_at := c.expires_at;
    RETURN NEXT;
END
$$;

-- (0.9.4's sql/edition/ 33-settle.sql: idem_complete, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_complete(key text, payload jsonb DEFAULT NULL, scope text DEFAULT 'default', token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m text;
    ver bigint := idempotency.fast_version(false, false, true, idempotency.cached_state());
    st idempotency.call_state;
    h record;
BEGIN
    -- The common case in one statement: the key's pending row in the write partition, held by the given token
    -- or, without one, written by this transaction (its claim, outside a subtransaction: the long way sees
    -- those). The limits and the write partition as in idem_claim's common case (idempotency.fast_version:
    -- READ COMMITTED only). Key and scope are tested for emptiness or control characters only where scope
    -- grants are enforced, whose test comes after theirs in the native extension's order: elsewhere a claim
    -- refused such a key, so no row matches one, and the long way then says what is wrong with it (the test
    -- folds away with the constants).
    IF ver OPERATOR(pg_catalog.>=) 0
       AND GREATEST(pg_catalog.octet_length(idem_complete.key), pg_catalog.octet_length(idem_complete.scope))
           OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_key_bytes
       AND (NOT (idempotency.cached_state()).grants_enforced
            OR (idem_complete.key OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) idem_complete.scope)
               OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]+\u0001[^\u0001-\u001f\u007f-\u009f]+$')
       -- (a payload whose stored size is plainly under the limit passes unmeasured; a compressed one is measured)
       AND (idem_complete.payload IS NULL
            OR (pg_catalog.pg_column_compression(idem_complete.payload) IS NULL
                AND pg_catalog.pg_column_size(idem_complete.payload) OPERATOR(pg_catalog.<) (idempotency.cached_state()).max_payload_bytes_4)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_complete.scope);
        END IF;
        -- (A token that is not positive matches no row; the long way then says why.)
        UPDATE idempotency.records x
           SET status = 'completed', payload = idem_complete.payload, updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
         WHERE x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_from
           AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_to
           AND x.key OPERATOR(pg_catalog.=) idem_complete.key AND x.scope OPERATOR(pg_catalog.=) idem_complete.scope
           AND x.status OPERATOR(pg_catalog.=) 'pending' AND x.token IS NOT NULL
           AND CASE WHEN idem_complete.token IS NULL
                    THEN x.xmin OPERATOR(pg_catalog.=) pg_catalog.xid(pg_catalog.pg_current_xact_id())
                    ELSE x.token OPERATOR(pg_catalog.=) idem_complete.token END;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- The long way: every argument checked in the native extension's order, the remembered claim looked for
    -- in every partition (by address: under SERIALIZABLE that takes no predicate lock on an index page),
    -- then the key's pending row, then what held_row says is wrong.
    st := idempotency.call_state('idem_complete', false);
    PERFORM idempotency.check_key_scope(idem_complete.key, idem_complete.scope, st.max_key_bytes);
    IF st.grants_enforced THEN
        PERFORM idempotency.authorize_enforced('scope', idem_complete.scope);
    END IF;
    PERFORM idempotency.check_document('payload', idem_complete.payload, st.max_payload_bytes);
    PERFORM idempotency.check_token(idem_complete.token);
    m := pg_catalog.current_setting('idempotency_edition.claimed_row', true);
    IF m OPERATOR(pg_catalog.~) '^[0-9]{1,18} \([0-9]{1,9},[0-9]{1,4}\) [0-9]{1,10}$' THEN
        UPDATE idempotency.records x
           SET status = 'completed', payload = idem_complete.payload, updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
         WHERE x.tableoid OPERATOR(pg_catalog.=) pg_catalog.split_part(m, ' ', 3)::oid
           AND x.ctid OPERATOR(pg_catalog.=) pg_catalog.split_part(m, ' ', 2)::tid
           AND x.key OPERATOR(pg_catalog.=) idem_complete.key AND x.scope OPERATOR(pg_catalog.=) idem_complete.scope
           AND x.status OPERATOR(pg_catalog.=) 'pending'
           AND x.token OPERATOR(pg_catalog.=) coalesce(idem_complete.token, pg_catalog.split_part(m, ' ', 1)::bigint);
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    UPDATE idempotency.records x
       SET status = 'completed', payload = idem_complete.payload, updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
     WHERE x.key OPERATOR(pg_catalog.=) idem_complete.key AND x.scope OPERATOR(pg_catalog.=) idem_complete.scope
       AND x.status OPERATOR(pg_catalog.=) 'pending' AND x.token IS NOT NULL
       AND CASE WHEN idem_complete.token IS NULL THEN idempotency.written_here(x.xmin)
                ELSE x.token OPERATOR(pg_catalog.=) idem_complete.token END;
    IF FOUND THEN
        RETURN;
    END IF;
    h := idempotency.held_row(idem_complete.key, idem_complete.scope, idem_complete.token);
    UPDATE idempotency.records x
       SET status = 'completed', payload = idem_complete.payload, updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
     WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid;
END
$$;

-- (0.9.4's sql/edition/ 35-once.sql: idem_once, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_once(key text, scope text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gen0 bigint := (idempotency.cached_state()).gen;   -- read first: see idem_claim
    ver bigint := idempotency.fast_version(true, false, false, idempotency.cached_state());
    planned bigint;
    written_at timestamptz;
    st idempotency.call_state;
    fresh boolean;
    h bigint;
    maybe boolean;
BEGIN
    -- The common case, as idem_claim's (idempotency.fast_version): the key looked for outside the write
    -- partition only where a partition can hold it, then written there.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND GREATEST(pg_catalog.octet_length(idem_once.key), pg_catalog.octet_length(idem_once.scope))
           OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_key_bytes
       AND (idem_once.key OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) idem_once.scope)
           OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]+\u0001[^\u0001-\u001f\u007f-\u009f]+$' THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_once.scope);
        END IF;
        -- Where else the key may be, as in idem_claim: a print that matched in the key filters of the sealed
        -- partitions sends the call the long way (once_one reads the partitions).
        IF (idempotency.cached_state()).filtered THEN
            h := idempotency.key_hash(idem_once.key, idem_once.scope);
            maybe := EXISTS (SELECT FROM idempotency.sealed_key_matches(h));
        END IF;
        IF maybe IS NOT TRUE THEN
            IF (idempotency.cached_state()).unfiltered_from IS NOT NULL OR (idempotency.cached_state()).probe_ahead THEN
                PERFORM FROM idempotency.records x
                 WHERE x.key OPERATOR(pg_catalog.=) idem_once.key AND x.scope OPERATOR(pg_catalog.=) idem_once.scope
                   AND ((x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                         AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                        OR ((idempotency.cached_state()).probe_ahead AND x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to));
                IF FOUND THEN
                    RETURN false;
                END IF;
            END IF;
            INSERT INTO idempotency.records AS x (scope, key, status, attempts, created_at, updated_at)
            VALUES (idem_once.scope, idem_once.key, 'completed', 1,
                    idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                    pg_catalog.now())
            ON CONFLICT DO NOTHING
            RETURNING x.created_at, (idempotency.cached_state()).gen INTO written_at, planned;
            IF NOT FOUND THEN
                RETURN false;   -- the key was there
            ELSIF planned OPERATOR(pg_catalog.=) gen0   -- (as idem_claim's)
                  AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                      OPERATOR(pg_catalog.=) ver THEN
                RETURN true;
            END IF;
            -- A seal (or another change of the state) while this ran: written again the long way. (The row just
            -- written, found by key, by the created_at it was written with and as written by this transaction:
            -- the key's one such row. Not by the key alone: while a seal is under way, the long way of an earlier
            -- call of this transaction may have written the key into the next partition, with another
            -- created_at. The row's address is not collected for this rare case: with its partition, that cost
            -- every call 5,000 instructions.)
            DELETE FROM idempotency.records x
             WHERE x.created_at OPERATOR(pg_catalog.=) written_at
               AND x.key OPERATOR(pg_catalog.=) idem_once.key AND x.scope OPERATOR(pg_catalog.=) idem_once.scope
               AND idempotency.written_here(x.xmin);
        END IF;
    END IF;
    st := idempotency.call_state('idem_once', true);
    PERFORM idempotency.check_key_scope(idem_once.key, idem_once.scope, st.max_key_bytes);
    IF st.grants_enforced THEN
        PERFORM idempotency.authorize_enforced('scope', idem_once.scope);
    END IF;
    LOOP
        fresh := idempotency.once_one(idem_once.key, idem_once.scope, st);
        EXIT WHEN fresh IS NOT NULL;
        st := idempotency.call_state('idem_once', true);
    END LOOP;
    RETURN fresh;
END
$$;

-- (0.9.4's sql/edition/ 42-complete-batch.sql: idem_complete_batch, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_complete_batch(keys text[], payloads jsonb[] DEFAULT NULL, scope text DEFAULT 'default',
                                    tokens bigint[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_nestloop = off AS $$
DECLARE
    ver bigint := idempotency.fast_version(false, false, true, idempotency.cached_state());
    s idempotency.settings;
    n integer := coalesce(pg_catalog.cardinality(idem_complete_batch.keys), 0);
    one record;
    h record;
    done integer;
    done_keys text[];
BEGIN
    -- The keys, the scope and the size at once in the common case, as in idem_once_batch; the rest below.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_complete_batch.keys, idem_complete_batch.scope, idempotency.cached_state())
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_complete_batch.keys, (idempotency.cached_state()).max_key_bytes)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_complete_batch.scope);
        END IF;
        s.max_payload_bytes := (idempotency.cached_state()).max_payload_bytes;
    ELSE
        s := idempotency.check_batch('idem_complete_batch', idem_complete_batch.keys, idem_complete_batch.scope);
    END IF;
    IF (SELECT pg_catalog.count(DISTINCT u.k) FROM pg_catalog.unnest(idem_complete_batch.keys) u(k)) OPERATOR(pg_catalog.<>) n THEN
        RAISE EXCEPTION 'idempotency: keys must not repeat a key in idem_complete_batch' USING ERRCODE = '22023';
    END IF;
    IF payloads IS NOT NULL THEN
        IF coalesce(pg_catalog.cardinality(payloads), 0) OPERATOR(pg_catalog.<>) n THEN
            RAISE EXCEPTION 'idempotency: payloads has % elements but keys has %', coalesce(pg_catalog.cardinality(payloads), 0), n
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.unnest(payloads) AS u(p)
                    WHERE pg_catalog.pg_column_compression(u.p) IS NOT NULL
                       OR pg_catalog.pg_column_size(u.p) OPERATOR(pg_catalog.>=) (s.max_payload_bytes OPERATOR(pg_catalog.-) 4)) THEN
            PERFORM idempotency.check_document('payload', p, s.max_payload_bytes) FROM pg_catalog.unnest(payloads) AS u(p);
        END IF;
    END IF;
    IF tokens IS NOT NULL THEN
        IF coalesce(pg_catalog.cardinality(tokens), 0) OPERATOR(pg_catalog.<>) n THEN
            RAISE EXCEPTION 'idempotency: tokens has % elements but keys has %', coalesce(pg_catalog.cardinality(tokens), 0), n
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.unnest(tokens) AS u(t) WHERE u.t OPERATOR(pg_catalog.<=) 0) THEN
            PERFORM idempotency.check_token(t) FROM pg_catalog.unnest(tokens) AS u(t);
        END IF;
    END IF;
    -- The keys held in the write partition in one statement: by the given token, or, without one, by a claim
    -- of this transaction (a row it wrote outside a subtransaction). The others key by key, in key order:
    -- held_row finds them (a claim made in a subtransaction too), or says why not.
    WITH updated AS (
        UPDATE idempotency.records x
           SET status = 'completed', payload = idem_complete_batch.payloads[v.i], updated_at = pg_catalog.clock_timestamp(),
               expires_at = NULL
          FROM pg_catalog.unnest(idem_complete_batch.keys) WITH ORDINALITY AS v(k, i)
         WHERE x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_from
           AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_to
           AND x.key OPERATOR(pg_catalog.=) v.k AND x.scope OPERATOR(pg_catalog.=) idem_complete_batch.scope
           -- (the keys again, as an index condition: the plan looks each one up whatever the statistics say, and
           -- joins them to their positions by hashing, enable_nestloop being off: time linear in the batch)
           AND x.key OPERATOR(pg_catalog.=) ANY (idem_complete_batch.keys)
           AND x.status OPERATOR(pg_catalog.=) 'pending'
           AND CASE WHEN idem_complete_batch.tokens[v.i] IS NOT NULL THEN x.token OPERATOR(pg_catalog.=) idem_complete_batch.tokens[v.i]
                    ELSE x.token IS NOT NULL
                         AND x.xmin OPERATOR(pg_catalog.=) pg_catalog.xid(pg_catalog.pg_current_xact_id()) END
        RETURNING x.key)
    SELECT pg_catalog.count(*)::integer, pg_catalog.array_agg(u.key) INTO done, done_keys FROM updated u;
    IF done OPERATOR(pg_catalog.<) n THEN
        FOR one IN SELECT v.k, v.i FROM pg_catalog.unnest(idem_complete_batch.keys) WITH ORDINALITY AS v(k, i)
                    WHERE v.k NOT IN (SELECT d.k FROM pg_catalog.unnest(done_keys) AS d(k)) ORDER BY v.k LOOP
            h := idempotency.held_row(one.k, idem_complete_batch.scope, tokens[one.i]);
            UPDATE idempotency.records x
               SET status = 'completed', payload = payloads[one.i], updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
             WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid;
            done := done OPERATOR(pg_catalog.+) 1;
        END LOOP;
    END IF;
    RETURN done;
END
$$;

DROP FUNCTION idempotency.fast_version_native(boolean, boolean, boolean);
DROP FUNCTION idempotency.fast_version(boolean, boolean, boolean);
DROP FUNCTION idempotency.fast_state(boolean);
DROP FUNCTION idempotency.batch_args_fast(text[], text);
DROP FUNCTION idempotency.bad_keys(text[]);
SELECT FROM idempotency.write_call_cache();
-- (0.9.4's sql/edition/ 90-finalize.sql, as scripts/sql-edition --expand wrote it in)
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
