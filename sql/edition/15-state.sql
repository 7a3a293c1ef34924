-- The SQL edition: what a key call reads before it works (issue 32: each extra statement, helper call or
-- relation on a call's path costs as much as a row write). The limits in force, whether scope grants are
-- enforced, the write partition and which other partitions a lookup must read: kept in one row,
-- idempotency.call_cache, that the tables it is made from keep up to date (statement triggers), and checked
-- at each call against idempotency.sealed_upto, which a seal moves before it commits.

CREATE TYPE idempotency.call_state AS (
    max_lease_ttl     interval,
    max_attempts      integer,
    max_key_bytes     integer,
    max_payload_bytes integer,
    max_batch_keys    integer,
    lease_ttl         interval,
    grants_enforced   boolean,       -- a scope grant exists, or require_scope_grants
    upto              bigint,        -- idempotency.sealed_upto when the state was read
    w_from            timestamptz,
    w_to              timestamptz,
    w_to_us           bigint,        -- w_to in microseconds since 1970, as idempotency.sealed_upto counts
    probe_before      boolean,       -- a partition before the write partition exists: a new key is looked for there
    probe_ahead       boolean,       -- a partition after it may hold rows (a move, a restore): looked for there too
    stale_seal        boolean,       -- REPEATABLE READ / SERIALIZABLE: a seal committed after the snapshot
    w_at_seal         boolean,       -- the write partition starts where the seals end (so it is current whatever now() is)
    lease_ttl_ok      boolean,       -- lease_ttl is positive and within max_lease_ttl
    max_payload_bytes_4 integer,     -- max_payload_bytes - 4: a stored size under it is under the limit whatever its header
    native_defaults_ok boolean,      -- the native extension's settings at their defaults change nothing here (see fast_version)
    w_name            text,          -- the write partition's qualified name (a partition dropped by hand is seen)
    filtered          boolean,       -- a partition before the write partition has its key filter (idempotency.sealed_keys)
    unfiltered_from   timestamptz,   -- the start of the oldest partition before it without one (read by index), or NULL
    gen               bigint,        -- the cached state's generation: the transaction that wrote it (NULL from live_state)
    common_path_guc   boolean        -- native_defaults_ok, and the library has idempotency.edition_common_path (0.9.5)
);

-- The state as the tables say it now (the partitions, the seals, the settings, the grants): the one
-- source of idempotency.call_cache, and what a call reads when the cache does not match sealed_upto.
CREATE FUNCTION idempotency.live_state() RETURNS idempotency.call_state
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

-- The state as of the last change to its tables, as constants: a SQL function that the calls inline, so
-- that reading it costs no table access (idempotency.write_call_cache writes it again after each change).
-- Until then, and whenever idempotency.sealed_upto has moved since (upto -1 never matches), the calls read
-- idempotency.live_state.
CREATE FUNCTION idempotency.cached_state() RETURNS idempotency.call_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.call_state
$$;

-- Writes idempotency.cached_state from the tables. One writer at a time, reading the tables after the
-- previous one committed (READ COMMITTED); under REPEATABLE READ or SERIALIZABLE the snapshot may be older
-- than the last writer's, so the state is marked out of date (upto -1) instead, and calls read the tables
-- until the next maintenance round writes it again. The constants are written so that they read back the
-- same under any DateStyle, TimeZone or IntervalStyle (timestamps as microseconds since 1970). A state that
-- differs from the one in force is written with a new generation (gen: this transaction's id, which no other
-- writer shares, and only the last state a transaction writes is seen by others): a call that reads the same
-- generation before its guards and in its write read one state throughout (idem_claim, idem_once).
CREATE FUNCTION idempotency.write_call_cache() RETURNS void
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

-- After a statement changed one of the tables the state comes from.
CREATE FUNCTION idempotency.refresh_call_cache() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.write_call_cache();
    RETURN NULL;
END
$$;

-- The tables the state comes from (partition_ranges: 20-partitions.sql). A paragraph apart from the function:
-- an upgrade script includes functions (scripts/sql-edition's --@include) and makes triggers itself.
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.settings
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scope_grants
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.sealed
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();

-- The state of one call, the long way: fn names the call for the read-only error (NULL: a call that reads
-- only); writing: the write partition too, made when there is none (idempotency.write_partition). The
-- constants of idempotency.cached_state when they match sealed_upto (every call but those during a seal),
-- else the tables; under REPEATABLE READ and SERIALIZABLE, whether a seal committed after the snapshot; a
-- session that set an idempotency.* limit (or had one set by ALTER DATABASE / ALTER ROLE) gets the limits of
-- idempotency.config().
CREATE FUNCTION idempotency.call_state(fn text, writing boolean) RETURNS idempotency.call_state
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
CREATE FUNCTION idempotency.fast_state(writing boolean, st idempotency.call_state) RETURNS bigint
LANGUAGE sql AS $$
    SELECT CASE WHEN (NOT writing OR pg_catalog.to_regclass(st.w_name) IS NOT NULL)
                 AND (NOT writing OR st.w_at_seal OR st.w_from OPERATOR(pg_catalog.<=) pg_catalog.now())
                THEN st.upto ELSE -1 END
$$;

-- Whether the native library's idempotency.edition_common_path (0.9.5) says, in this session, that the groups
-- of limits that pattern names are at their defaults (a LIKE pattern over its value: 'keys,lease%', '%,batch').
-- The flags test tells the library's setting from a placeholder of that name, which a session without the
-- library may set to anything. For fast_version and batch_args_fast (inlined, as they are: the pattern is a
-- constant of each call).
CREATE FUNCTION idempotency.common_path_says(pattern text) RETURNS boolean
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
CREATE FUNCTION idempotency.fast_version(writing boolean, lease boolean, payload boolean, st idempotency.call_state)
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

-- 22004 / 22023 / 54000 for a key call's key and scope, in the native extension's order, after a single
-- test of the common case found one of them wrong.
CREATE FUNCTION idempotency.check_key_scope(key text, scope text, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    PERFORM idempotency.check_ident('key', key, max_bytes);
    PERFORM idempotency.check_ident('scope', scope, max_bytes);
END
$$;
