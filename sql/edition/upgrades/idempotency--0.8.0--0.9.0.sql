-- The SQL edition, 0.8.0 -> 0.9.0 (issue 32: a new key is looked for in the key filters of the sealed
-- partitions, one index for all of them, instead of in each sealed partition's index). Added: the table
-- idempotency.sealed_keys (the filters), the column idempotency.sealed.filtered_keys (NULL until a
-- filter is written), and two fields of the type idempotency.call_state. Nothing stored changes: the
-- filters of the partitions sealed before the upgrade are written by the next maintenance round (about 3 s
-- for 600,000 keys; until then those partitions are read through their indexes, as by 0.8.0). Run by the
-- 0.9.0 plain script over a 0.8.0 install, or by ALTER EXTENSION idempotency UPDATE after the 0.9.0
-- idempotency-tle.sql registered this path; in either case one transaction, in the schema of the install.
-- It takes an ACCESS EXCLUSIVE lock on partition_ranges and sealed, so it waits for the transactions that
-- called the edition and they wait for it (it takes a moment).

-- Storage. partition_ranges first, as in 0.7.0 -> 0.8.0: once its lock is held no seal is under way.
LOCK TABLE idempotency.partition_ranges IN ACCESS EXCLUSIVE MODE;
ALTER TABLE idempotency.sealed ADD COLUMN filtered_keys bigint;

CREATE TABLE idempotency.sealed_keys (
    bucket    integer NOT NULL,
    partition regclass NOT NULL,
    chunk     integer NOT NULL,
    prints    integer[] NOT NULL,
    PRIMARY KEY (bucket, partition, chunk) INCLUDE (prints)
) WITH (autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0);
COMMENT ON TABLE idempotency.sealed_keys IS
'Key filters of the sealed partitions of idempotency.records (written by maintenance): where a new key is looked for first.';
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.sealed_keys', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$$;

ALTER TYPE idempotency.call_state ADD ATTRIBUTE filtered boolean, ADD ATTRIBUTE unfiltered_from timestamptz;

-- Every function that changed or is new in 0.9.0, from the sources.
-- (0.9.0's sql/edition/ 15-state.sql: idempotency.live_state idempotency.cached_state idempotency.write_call_cache idempotency.refresh_call_cache idempotency.call_state idempotency.fast_version idempotency.check_key_scope, as scripts/sql-edition --expand wrote it in)
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
    -- nothing (idempotency.limit_in_force keeps the tighter of each).
    st.native_defaults_ok := st.max_key_bytes OPERATOR(pg_catalog.<=) 512
        AND st.max_payload_bytes OPERATOR(pg_catalog.<=) 1048576 AND st.max_lease_ttl OPERATOR(pg_catalog.<=) '1 day'::interval
        AND st.lease_ttl OPERATOR(pg_catalog.=) '5 min'::interval AND st.max_batch_keys OPERATOR(pg_catalog.<=) 1000
        AND st.max_attempts OPERATOR(pg_catalog.<=) 5;
    RETURN st;
END
$$;

-- The state as of the last change to its tables, as constants: a SQL function that the calls inline, so
-- that reading it costs no table access (idempotency.write_call_cache writes it again after each change).
-- Until then, and whenever idempotency.sealed_upto has moved since (upto -1 never matches), the calls read
-- idempotency.live_state.
CREATE OR REPLACE FUNCTION idempotency.cached_state() RETURNS idempotency.call_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.call_state
$$;

-- Writes idempotency.cached_state from the tables. One writer at a time, reading the tables after the
-- previous one committed (READ COMMITTED); under REPEATABLE READ or SERIALIZABLE the snapshot may be older
-- than the last writer's, so the state is marked out of date (upto -1) instead, and calls read the tables
-- until the next maintenance round writes it again. The constants are written so that they read back the
-- same under any DateStyle, TimeZone or IntervalStyle (timestamps as microseconds since 1970).
CREATE OR REPLACE FUNCTION idempotency.write_call_cache() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET intervalstyle = 'postgres' AS $$
DECLARE
    st idempotency.call_state;
    body text;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency.call_cache')::bigint);
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        st := idempotency.live_state();
    ELSE
        st.upto := -1;
    END IF;
    body := pg_catalog.format(
        'SELECT ROW(%L::interval, %s, %s, %s, %s, %L::interval, %s, %s, %s, %s, %s, %s, %s, false, %s, %s, %s, %s, %L, %s, %s)::idempotency.call_state',
        st.max_lease_ttl, coalesce(st.max_attempts::text, 'NULL'), coalesce(st.max_key_bytes::text, 'NULL'),
        coalesce(st.max_payload_bytes::text, 'NULL'), coalesce(st.max_batch_keys::text, 'NULL'), st.lease_ttl,
        coalesce(st.grants_enforced::text, 'NULL'), st.upto,
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.w_from))::text OPERATOR(pg_catalog.||) ')', 'NULL'),
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.w_to))::text OPERATOR(pg_catalog.||) ')', 'NULL'),
        coalesce(st.w_to_us::text, 'NULL'), coalesce(st.probe_before::text, 'NULL'), coalesce(st.probe_ahead::text, 'NULL'),
        coalesce(st.w_at_seal::text, 'NULL'), coalesce(st.lease_ttl_ok::text, 'NULL'), coalesce(st.max_payload_bytes_4::text, 'NULL'),
        coalesce(st.native_defaults_ok::text, 'NULL'), st.w_name, coalesce(st.filtered::text, 'NULL'),
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.unfiltered_from))::text OPERATOR(pg_catalog.||) ')', 'NULL'));
    IF body OPERATOR(pg_catalog.<>) (SELECT pg_catalog.btrim(p.prosrc, E' \n') FROM pg_catalog.pg_proc p
                                      WHERE p.oid OPERATOR(pg_catalog.=) 'idempotency.cached_state()'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION idempotency.cached_state() RETURNS idempotency.call_state '
                                  'LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L', body);
    END IF;
END
$$;

-- After a statement changed one of the tables the state comes from.
CREATE OR REPLACE FUNCTION idempotency.refresh_call_cache() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.write_call_cache();
    RETURN NULL;
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
    IF coalesce(NULLIF(pg_catalog.current_setting('idempotency.lease_ttl', true), ''),
                NULLIF(pg_catalog.current_setting('idempotency.max_lease_ttl', true), ''),
                NULLIF(pg_catalog.current_setting('idempotency.max_attempts', true), ''),
                NULLIF(pg_catalog.current_setting('idempotency.max_key_bytes', true), ''),
                NULLIF(pg_catalog.current_setting('idempotency.max_payload_bytes', true), ''),
                NULLIF(pg_catalog.current_setting('idempotency.max_batch_keys', true), ''),
                NULLIF(pg_catalog.current_setting('idempotency.require_scope_grants', true), '')) IS NOT NULL THEN
        cfg := idempotency.config();
        st.max_lease_ttl := cfg.max_lease_ttl; st.max_attempts := cfg.max_attempts; st.max_key_bytes := cfg.max_key_bytes;
        st.max_payload_bytes := cfg.max_payload_bytes; st.max_batch_keys := cfg.max_batch_keys; st.lease_ttl := cfg.lease_ttl;
        st.grants_enforced := cfg.require_scope_grants
            OR EXISTS (SELECT FROM idempotency.scope_grants g WHERE g.kind OPERATOR(pg_catalog.=) 'scope');
    END IF;
    RETURN st;
END
$$;

-- Whether a key call may take its common path, which reads the state as the constants of
-- idempotency.cached_state (folded into each statement's plan, so that a statement reads only the partitions
-- they name): their version (upto) when the call may, else -1 and the call takes the long way
-- (idempotency.call_state). It may in a READ COMMITTED, read-write transaction whose session set none of the
-- idempotency.* limits the call reads (lease: lease_ttl and max_lease_ttl; payload: max_payload_bytes;
-- always max_key_bytes and require_scope_grants); writing: when the write partition is there and covers now.
-- Whether the constants still match sealed_upto a writing call learns after its write (in its RETURNING,
-- after the write partition's lock): a seal that committed before this transaction began has replaced the
-- constants already (a change of cached_state invalidates the plans that folded them), so only a seal
-- during the call can make them stale. Inlined into the calls, with constant arguments: one expression of
-- the few function calls the call needs (each costs a key call's transaction about as much as its row lookup).
CREATE OR REPLACE FUNCTION idempotency.fast_version(writing boolean, lease boolean, payload boolean) RETURNS bigint
LANGUAGE sql AS $$
    SELECT CASE WHEN pg_catalog.concat(pg_catalog.current_setting('transaction_isolation'),
                                       pg_catalog.current_setting('transaction_read_only'),
                                       pg_catalog.current_setting('idempotency.max_key_bytes', true),
                                       pg_catalog.current_setting('idempotency.require_scope_grants', true),
                                       CASE WHEN lease THEN pg_catalog.concat(pg_catalog.current_setting('idempotency.lease_ttl', true),
                                                                              pg_catalog.current_setting('idempotency.max_lease_ttl', true)) END,
                                       CASE WHEN payload THEN pg_catalog.current_setting('idempotency.max_payload_bytes', true) END)
                     -- unset (no native library in this cluster), or the native extension's defaults as its
                     -- library shows them (src/gucs.rs) when they change nothing here
                     OPERATOR(pg_catalog.=) ANY (ARRAY['read committedoff',
                         CASE WHEN (idempotency.cached_state()).native_defaults_ok
                              THEN 'read committedoff512Boff' OPERATOR(pg_catalog.||) CASE WHEN lease THEN '5min1d' ELSE '' END
                                   OPERATOR(pg_catalog.||) CASE WHEN payload THEN '1MB' ELSE '' END END])
                 AND (NOT writing OR pg_catalog.to_regclass((idempotency.cached_state()).w_name) IS NOT NULL)
                 AND (NOT writing OR (idempotency.cached_state()).w_at_seal
                      OR (idempotency.cached_state()).w_from OPERATOR(pg_catalog.<=) pg_catalog.now())
                THEN (idempotency.cached_state()).upto ELSE -1 END
$$;

-- 22004 / 22023 / 54000 for a key call's key and scope, in the native extension's order, after a single
-- test of the common case found one of them wrong.
CREATE OR REPLACE FUNCTION idempotency.check_key_scope(key text, scope text, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    PERFORM idempotency.check_ident('key', key, max_bytes);
    PERFORM idempotency.check_ident('scope', scope, max_bytes);
END
$$;

-- (0.9.0's sql/edition/ 20-partitions.sql: idempotency.sync_partition_ranges idempotency.drop_partition, as scripts/sql-edition --expand wrote it in)
-- Registers in partition_ranges the partitions of the record table it does not know (attached by hand or
-- by pg_partman), and forgets those that are gone; the ranges come from the bounds' own text, printed
-- with DateStyle and TimeZone pinned by this function's SET clauses.
CREATE OR REPLACE FUNCTION idempotency.sync_partition_ranges() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET datestyle = 'ISO, YMD' SET timezone = 'UTC' AS $$
DECLARE
    gone regclass[];
BEGIN
    DELETE FROM idempotency.partition_ranges p
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                        WHERE i.inhrelid OPERATOR(pg_catalog.=) p.partition::oid
                          AND i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid);
    WITH forgotten AS (
        DELETE FROM idempotency.sealed x
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                            WHERE i.inhrelid OPERATOR(pg_catalog.=) x.partition::oid
                              AND i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid)
        RETURNING x.partition)
    SELECT pg_catalog.array_agg(f.partition) INTO gone FROM forgotten f;
    IF gone IS NOT NULL THEN
        PERFORM idempotency.forget_sealed_keys(gone);
    END IF;
    INSERT INTO idempotency.partition_ranges (partition, partition_name, range_from, range_to)
    SELECT c.oid::pg_catalog.regclass, c.relname, b[1]::timestamptz, b[2]::timestamptz
      FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid,
           LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                           '^FOR VALUES FROM \(''([^'']+)''\) TO \(''([^'']+)''\)$') AS b
     WHERE i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid
       AND b IS NOT NULL
    ON CONFLICT (partition) DO NOTHING;
END
$$;

-- Drops one partition if its lock comes within wait_ms; false (nothing done) otherwise.
CREATE OR REPLACE FUNCTION idempotency.drop_partition(part regclass, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    saved text := pg_catalog.current_setting('lock_timeout');
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', wait_ms OPERATOR(pg_catalog.||) 'ms', true);
    EXECUTE pg_catalog.format('DROP TABLE %s', part);
    PERFORM pg_catalog.set_config('lock_timeout', saved, true);
    DELETE FROM idempotency.partition_ranges p WHERE p.partition OPERATOR(pg_catalog.=) part;
    DELETE FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) part;
    PERFORM idempotency.forget_sealed_keys(ARRAY[part]);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;

-- (0.9.0's sql/edition/ 22-sealed-keys.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: the key filters of the sealed partitions (idempotency.sealed_keys, 0.9.0). A new key is
-- looked for in every partition before the write partition. Each such partition's index costs a call as
-- much as the call's own write (its lock, its scan, its descent), so at a week of daily partitions the
-- lookups cost more than the rest of the call; the filters answer for all the sealed partitions with one
-- descent of one index, and the partitions' indexes are read only when a print matches.

-- A key's 64-bit hash: its bucket is the top 16 bits (idempotency.sealed_keys.bucket), its print the low 31.
-- (Immutable throughout, so that the planner inlines it.)
CREATE OR REPLACE FUNCTION idempotency.key_hash(key text, scope text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.hashtextextended(key OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) scope, 0)
$$;

-- Whether this server hashes keys as the filters were written (the hash of text depends on the machine's
-- byte order): a database restored on a machine of the other kind reads its sealed partitions through their
-- indexes, and maintenance writes no filter there.
CREATE OR REPLACE FUNCTION idempotency.filters_usable() RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT idempotency.key_hash('idempotency', 'sealed_keys') OPERATOR(pg_catalog.=) 7267811164439816630
$$;

-- The filtered sealed partitions that may hold a key of hash h (a print of its bucket matches): none when
-- the key is in none of them. A set-returning SQL function, so that the planner inlines it into the calls'
-- statements (EXISTS (SELECT FROM idempotency.sealed_key_matches(h))), which a scalar one holding a
-- subquery it would not.
CREATE OR REPLACE FUNCTION idempotency.sealed_key_matches(h bigint) RETURNS SETOF regclass
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT f.partition FROM idempotency.sealed_keys f
     WHERE f.bucket OPERATOR(pg_catalog.=) (h OPERATOR(pg_catalog.>>) 48)
       AND (h OPERATOR(pg_catalog.&) 2147483647) OPERATOR(pg_catalog.=) ANY (f.prints)
$$;

-- Writes the filter of a sealed partition: the prints of all its keys, by bucket, at most per_row of them
-- in a row (idempotency.sealed_keys: the index holds them too), in one statement (about 3 s for 600,000
-- keys). NULL when the partition is not sealed or has its filter already. A sealed partition takes no new
-- rows (the seal waited for every transaction that wrote there), so the filter holds every key it will
-- hold; a key deleted later only makes the filter answer "maybe".
CREATE OR REPLACE FUNCTION idempotency.filter_sealed(part regclass, per_row integer DEFAULT 256) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    IF per_row IS NULL OR per_row OPERATOR(pg_catalog.<) 1 OR per_row OPERATOR(pg_catalog.>) 512 THEN
        RAISE EXCEPTION 'idempotency: per_row must be between 1 and 512'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('per_row is %s.', coalesce(per_row::text, 'NULL'));
    END IF;
    PERFORM FROM idempotency.sealed x
      WHERE x.partition OPERATOR(pg_catalog.=) part AND x.filtered_keys IS NULL
        FOR UPDATE;
    IF NOT FOUND OR NOT idempotency.filters_usable() THEN
        RETURN NULL;
    END IF;
    DELETE FROM idempotency.sealed_keys f WHERE f.partition OPERATOR(pg_catalog.=) part;
    EXECUTE pg_catalog.format(
        'WITH written AS (
             INSERT INTO idempotency.sealed_keys (bucket, partition, chunk, prints)
             SELECT k.b, $1, (k.n OPERATOR(pg_catalog./) $2)::integer, pg_catalog.array_agg(k.p)
               FROM (SELECT y.b, y.p, pg_catalog.row_number() OVER (PARTITION BY y.b) OPERATOR(pg_catalog.-) 1 AS n
                       FROM (SELECT (x.h OPERATOR(pg_catalog.>>) 48)::integer AS b,
                                    (x.h OPERATOR(pg_catalog.&) 2147483647)::integer AS p
                               FROM (SELECT idempotency.key_hash(r.key, r.scope) AS h FROM %s r) x) y) k
              GROUP BY k.b, k.n OPERATOR(pg_catalog./) $2
             RETURNING pg_catalog.cardinality(prints) AS c)
         SELECT coalesce(pg_catalog.sum(w.c), 0)::bigint FROM written w', part)
      INTO n USING part, per_row;
    UPDATE idempotency.sealed x SET filtered_keys = n WHERE x.partition OPERATOR(pg_catalog.=) part;
    RETURN n;
END
$$;

-- Forgets the filters of partitions that are no longer sealed partitions of the record table.
CREATE OR REPLACE FUNCTION idempotency.forget_sealed_keys(parts regclass[]) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM idempotency.sealed_keys f WHERE f.partition OPERATOR(pg_catalog.=) ANY (parts)
$$;
-- (0.9.0's sql/edition/ 25-maintenance.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: maintenance. idem_maintenance() makes partitions ahead, seals past ones, drops expired
-- ones and reclaims stuck leases (20-partitions.sql has the pieces); pg_cron or any scheduler calls it.

-- One maintenance round: partitions made ahead, past ones sealed, expired ones dropped, stuck leases
-- reclaimed. What the native extension's worker does every maintenance_interval; here pg_cron or any
-- scheduler calls it (every minute is right: each round does only what is due).
CREATE OR REPLACE FUNCTION idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now())
RETURNS TABLE (partitions_created integer, partitions_dropped integer, partitions_deferred integer, leases_reclaimed bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings;
    p record;
    started timestamptz := pg_catalog.clock_timestamp();
    wait_ms integer;
    next_seal regclass;
    failure text;
    errors text[] := '{}';
BEGIN
    PERFORM idempotency.check_writable('idem_maintenance');
    IF as_of IS NULL THEN
        RAISE EXCEPTION 'idempotency: as_of must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT pg_catalog.isfinite(as_of) THEN
        RAISE EXCEPTION 'idempotency: as_of must be a finite timestamp' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO STRICT s FROM idempotency.settings;
    wait_ms := GREATEST(1, (EXTRACT(epoch FROM s.drop_lock_timeout) OPERATOR(pg_catalog.*) 1000)::integer);
    -- One round at a time; a round that finds another under way does nothing.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('idempotency.maintenance')::bigint) THEN
        RETURN QUERY SELECT 0, 0, 0, 0::bigint;
        RETURN;
    END IF;
    partitions_created := 0; partitions_dropped := 0; partitions_deferred := 0; leases_reclaimed := 0;
    -- Each step in a subtransaction of its own: one that fails (a partition a view depends on, say) is undone
    -- alone, reported (WARNING, and idempotency.maintenance_state()), and the others still run.
    BEGIN
        PERFORM idempotency.sync_partition_ranges();
        IF s.partition_manager OPERATOR(pg_catalog.=) 'builtin' THEN
            partitions_created := idempotency.premake_partitions(as_of);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('premake: ' OPERATOR(pg_catalog.||) failure);
    END;
    IF s.partition_manager OPERATOR(pg_catalog.<>) 'none' THEN
        -- Seal the past partitions, the oldest unsealed first, while the next one is there; stop at the first
        -- whose writers take longer than drop_lock_timeout (the next round tries again).
        LOOP
            SELECT r.partition INTO next_seal FROM idempotency.partition_ranges r
             WHERE r.range_from OPERATOR(pg_catalog.>=) idempotency.sealed_until()
               AND NOT EXISTS (SELECT FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) r.partition)
             ORDER BY r.range_from LIMIT 1;
            EXIT WHEN next_seal IS NULL OR NOT EXISTS (
                SELECT FROM idempotency.partition_ranges r JOIN idempotency.partition_ranges n
                    ON n.range_from OPERATOR(pg_catalog.=) r.range_to
                 WHERE r.partition OPERATOR(pg_catalog.=) next_seal AND r.range_to OPERATOR(pg_catalog.<=) as_of);
            BEGIN
                EXIT WHEN NOT idempotency.seal_partition_within(next_seal, wait_ms);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
                errors := errors OPERATOR(pg_catalog.||) ('seal: ' OPERATOR(pg_catalog.||) failure);
                EXIT;
            END;
            next_seal := NULL;
        END LOOP;
    END IF;
    -- The key filters of partitions sealed before this round (idempotency.filter_sealed): not of those it
    -- sealed itself, whose writers would wait for the filter behind the seal's lock.
    BEGIN
        PERFORM idempotency.filter_sealed(x.partition) FROM idempotency.sealed x
          WHERE x.filtered_keys IS NULL AND x.sealed_at OPERATOR(pg_catalog.<) pg_catalog.now()
          ORDER BY x.range_from;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('filter: ' OPERATOR(pg_catalog.||) failure);
    END;
    BEGIN
        PERFORM idempotency.mark_empty_ahead();
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('mark empty: ' OPERATOR(pg_catalog.||) failure);
    END;
    IF s.partition_manager OPERATOR(pg_catalog.=) 'builtin' THEN
        -- A partition is dropped a retention after its end, or after its seal when it holds keys written
        -- after its end: new keys go to the oldest unsealed partition, their created_at at its last
        -- microsecond, so each keeps its full retention (tests/clock/test_retention.py).
        FOR p IN SELECT r.partition FROM idempotency.partition_ranges r
                   JOIN idempotency.sealed x ON x.partition OPERATOR(pg_catalog.=) r.partition
                  WHERE r.range_to OPERATOR(pg_catalog.<=) (as_of OPERATOR(pg_catalog.-) s.retention)
                    AND (x.sealed_at OPERATOR(pg_catalog.<=) (as_of OPERATOR(pg_catalog.-) s.retention)
                         OR NOT idempotency.written_after_end(r.partition, r.range_to))
                  ORDER BY r.range_from
        LOOP
            BEGIN
                IF idempotency.drop_partition(p.partition, wait_ms) THEN
                    partitions_dropped := partitions_dropped OPERATOR(pg_catalog.+) 1;
                ELSE
                    partitions_deferred := partitions_deferred OPERATOR(pg_catalog.+) 1;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
                errors := errors OPERATOR(pg_catalog.||) ('drop ' OPERATOR(pg_catalog.||) p.partition::text
                                                          OPERATOR(pg_catalog.||) ': ' OPERATOR(pg_catalog.||) failure);
            END;
        END LOOP;
    END IF;
    BEGIN
        leases_reclaimed := idempotency.reclaim(as_of OPERATOR(pg_catalog.-) s.reclaim_after);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('reclaim: ' OPERATOR(pg_catalog.||) failure);
    END;
    -- The key calls' cached state, written again (after a restore, or a change made under REPEATABLE READ).
    PERFORM idempotency.write_call_cache();
    FOREACH failure IN ARRAY errors LOOP
        RAISE WARNING 'idempotency maintenance: %', failure;
    END LOOP;
    UPDATE idempotency.maintenance_rounds m
       SET last_round_at = pg_catalog.clock_timestamp(),
           last_round_micros = (EXTRACT(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started)
                                OPERATOR(pg_catalog.*) 1000000)::bigint,
           rounds = m.rounds OPERATOR(pg_catalog.+) 1,
           failed_rounds = m.failed_rounds OPERATOR(pg_catalog.+) CASE WHEN pg_catalog.cardinality(errors) OPERATOR(pg_catalog.>) 0 THEN 1 ELSE 0 END,
           last_error = coalesce(errors[1], m.last_error),
           last_error_at = CASE WHEN pg_catalog.cardinality(errors) OPERATOR(pg_catalog.>) 0 THEN pg_catalog.clock_timestamp() ELSE m.last_error_at END;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION idem_maintenance(timestamptz) IS
'Runs one maintenance round now: creates the partitions due, drops expired ones and reclaims stuck leases. Returns what it did.';

-- True when the partition holds a key written after its end (created_at at its last microsecond: see
-- idempotency.created_at), which then keeps its retention from the partition's seal.
CREATE OR REPLACE FUNCTION idempotency.written_after_end(part regclass, range_to timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found_late boolean;
BEGIN
    EXECUTE pg_catalog.format('SELECT EXISTS (SELECT FROM %s x WHERE x.created_at OPERATOR(pg_catalog.>=) %s)',
                              part, idempotency.ts_literal(range_to OPERATOR(pg_catalog.-) '1 microsecond'::interval))
       INTO found_late;
    RETURN found_late;
END
$$;

-- Marks the partitions ahead of the write partition that hold no row as known_empty, so that a key call
-- does not look for its key there (idempotency.call_state's probe_ahead). Only a write partition takes new
-- rows, and a partition ahead of it becomes one only after every partition before it is sealed, when key
-- calls no longer count it as ahead; a move (sql/move/import.sql) clears the marks.
CREATE OR REPLACE FUNCTION idempotency.mark_empty_ahead() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p record;
    empty boolean;
BEGIN
    FOR p IN SELECT r.partition, r.partition_name FROM idempotency.partition_ranges r
              WHERE NOT r.known_empty
                AND r.range_from OPERATOR(pg_catalog.>=) (
                    SELECT w.range_to FROM idempotency.partition_ranges w
                     WHERE w.range_from OPERATOR(pg_catalog.>=) idempotency.sealed_until()
                     ORDER BY w.range_from LIMIT 1)
    LOOP
        EXECUTE pg_catalog.format('SELECT NOT EXISTS (SELECT FROM idempotency.%I)', p.partition_name) INTO empty;
        IF empty THEN
            UPDATE idempotency.partition_ranges r SET known_empty = true
             WHERE r.partition OPERATOR(pg_catalog.=) p.partition;
        END IF;
    END LOOP;
END
$$;

-- Deletes up to 1,000 keys whose lease expired before cutoff and that nobody took over; a row another
-- transaction is writing (locked) is left for the next round.
CREATE OR REPLACE FUNCTION idempotency.reclaim(cutoff timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    WITH stuck AS (
        SELECT r.tableoid, r.ctid FROM idempotency.records r
         WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.expires_at OPERATOR(pg_catalog.<) cutoff
         ORDER BY r.expires_at LIMIT 1000
           FOR UPDATE SKIP LOCKED)
    DELETE FROM idempotency.records r USING stuck
     WHERE r.tableoid OPERATOR(pg_catalog.=) stuck.tableoid AND r.ctid OPERATOR(pg_catalog.=) stuck.ctid
       AND r.status OPERATOR(pg_catalog.=) 'pending' AND r.expires_at OPERATOR(pg_catalog.<) cutoff;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION idem_partman_handover() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.check_writable('idem_partman_handover');
    RAISE EXCEPTION 'idempotency: the SQL edition keeps its partitions itself (idem_maintenance)'
        USING ERRCODE = '55000', HINT = 'Schedule SELECT idem_maintenance() with pg_cron or an outside scheduler.';
END
$$;
COMMENT ON FUNCTION idem_partman_handover() IS
'Native extension only: hands the record table''s partitions to pg_partman. The SQL edition raises 55000.';
-- (0.9.0's sql/edition/ 30-keys.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: the key calls. No key lock: a new key is inserted with ON CONFLICT DO NOTHING into the
-- write partition (idempotency.write_partition), whose unique index makes a second claimer wait for the
-- first one's transaction, as in a hand-written keys table; a key settled in a sealed partition is found
-- there, and an existing row is changed under its row lock (SELECT ... FOR UPDATE). Under REPEATABLE READ
-- and SERIALIZABLE, PostgreSQL itself raises 40001 where the row was written after the snapshot (ON
-- CONFLICT meeting an invisible row, FOR UPDATE of a row changed since).

-- The created_at of a new row: the transaction's start, moved into the write partition's range.
CREATE OR REPLACE FUNCTION idempotency.created_at(w_from timestamptz, w_to timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT LEAST(GREATEST(pg_catalog.now(), w_from),
                            w_to OPERATOR(pg_catalog.-) '1 microsecond'::interval)
$$;

-- True when this transaction (or one of its subtransactions) wrote the row version whose xmin is x, for
-- a row this transaction can see: a visible row whose writer is still in progress is this transaction's.
CREATE OR REPLACE FUNCTION idempotency.written_here(x xid) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    cur numeric := pg_catalog.pg_current_xact_id_if_assigned()::text::numeric;
    fullx numeric;
BEGIN
    IF cur IS NULL THEN
        RETURN false;
    END IF;
    fullx := pg_catalog.floor(cur OPERATOR(pg_catalog./) 4294967296) OPERATOR(pg_catalog.*) 4294967296
            OPERATOR(pg_catalog.+) x::text::numeric;
    -- The epoch of x: the one within 2^31 of this transaction's (a subtransaction's xid is a little larger
    -- than its top-level one, an older row's smaller).
    IF fullx OPERATOR(pg_catalog.>) (cur OPERATOR(pg_catalog.+) 2147483648) THEN
        fullx := fullx OPERATOR(pg_catalog.-) 4294967296;
    ELSIF fullx OPERATOR(pg_catalog.<) (cur OPERATOR(pg_catalog.-) 2147483648) THEN
        fullx := fullx OPERATOR(pg_catalog.+) 4294967296;
    END IF;
    IF fullx OPERATOR(pg_catalog.<) 0 THEN
        RETURN false;
    END IF;
    RETURN pg_catalog.pg_xact_status(fullx::text::xid8) OPERATOR(pg_catalog.=) 'in progress';
END
$$;

-- The claim this transaction made last, for idem_complete to update its row by address: a scan by address
-- takes no predicate lock on a row this transaction wrote, where a lookup by key locks the index page under
-- SERIALIZABLE (issue 29's scenario: 9x the hand-written pattern's failures), and it reads one partition.
-- Kept in a transaction-local setting (undone with a rolled-back subtransaction, as the claim is) as
-- "<token> <ctid> <partition oid>": the token stands for the holder (a caller who sets the setting by hand
-- learns nothing a token argument would not give). idem_complete still matches key, scope, status and token,
-- so a wrong value only sends it to the lookup by key.
CREATE OR REPLACE FUNCTION idempotency.remember_claim(token bigint, row_ctid tid, part oid) RETURNS text
LANGUAGE sql AS $$
    SELECT pg_catalog.set_config('idempotency_edition.claimed_row', pg_catalog.concat_ws(' ', token, row_ctid, part), true)
$$;

-- 40001 under REPEATABLE READ and SERIALIZABLE when a seal committed after this transaction's snapshot,
-- which may then miss rows of the newly sealed partition (idempotency.call_state's stale_seal; raised before
-- a new key's row is written).
CREATE OR REPLACE FUNCTION idempotency.seal_conflict(key text, scope text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: could not serialize access to key % in scope % due to a concurrent claim',
                    idempotency.quoted(key), idempotency.quoted(scope)
        USING ERRCODE = '40001', DETAIL = 'A partition was sealed after this transaction''s snapshot was taken.',
              HINT = 'The transaction should be retried.';
END
$$;

-- After a write into the write partition of st: true when a seal moved past that partition meanwhile (this
-- transaction's lock on it came after the seal's, so the row went into a sealed partition, where later
-- claims of the key do not look). Under REPEATABLE READ and SERIALIZABLE that is 40001; under READ
-- COMMITTED the caller deletes what it wrote there and writes again with a new state.
CREATE OR REPLACE FUNCTION idempotency.sealed_under(st idempotency.call_state, key text, scope text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
       OPERATOR(pg_catalog.<) st.w_to_us THEN
        RETURN false;
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        PERFORM idempotency.seal_conflict(key, scope);
    END IF;
    RETURN true;
END
$$;

-- One claim, for idem_claim and idem_claim_batch: arguments checked by the caller, st its
-- idempotency.call_state. conflicted: the caller's insert of a new row met one in the write partition (the
-- first round reads it). outcome 'retry': the write partition was sealed under the claim (READ COMMITTED),
-- nothing was written, and the caller claims again with a new state.
CREATE OR REPLACE FUNCTION idempotency.claim_one(k text, sc text, ttl interval, fp text, wait boolean,
                                      st idempotency.call_state, conflicted boolean,
                                      OUT outcome text, OUT token bigint, OUT attempts integer,
                                      OUT payload jsonb, OUT expires_at timestamptz)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    r record;
    found_row boolean := false;
    busy boolean := false;
    inserted boolean := false;
    saved text;
    at_ctid tid;
    at_part oid;
BEGIN
    FOR round IN 1..3 LOOP
        -- A record of the key outside the write partition: in a sealed one (no new rows go there), or, after a
        -- restore or a move, in one ahead of it. Then one in the write partition, where new keys meet.
        IF round OPERATOR(pg_catalog.=) 1 AND conflicted THEN
            NULL;   -- the caller's insert met a row: read it below
        ELSIF st.probe_ahead THEN
            SELECT x.tableoid, x.ctid, x.xmin, x.status, x.token, x.attempts, x.fingerprint, x.payload, x.error, x.expires_at, x.created_at
              INTO r FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
               AND (x.created_at OPERATOR(pg_catalog.<) st.w_from OR x.created_at OPERATOR(pg_catalog.>=) st.w_to);
            found_row := FOUND;
        ELSIF st.probe_before THEN
            SELECT x.tableoid, x.ctid, x.xmin, x.status, x.token, x.attempts, x.fingerprint, x.payload, x.error, x.expires_at, x.created_at
              INTO r FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
               AND x.created_at OPERATOR(pg_catalog.<) st.w_from;
            found_row := FOUND;
        END IF;
        IF NOT found_row AND NOT (round OPERATOR(pg_catalog.=) 1 AND conflicted) THEN
            IF st.stale_seal THEN
                PERFORM idempotency.seal_conflict(k, sc);
            END IF;
            token := pg_catalog.nextval('idempotency.token_seq');
            IF wait THEN
                INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, fingerprint,
                                                      created_at, updated_at, expires_at)
                VALUES (sc, k, 'pending', claim_one.token, 1, fp,
                        idempotency.created_at(st.w_from, st.w_to),
                        pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) ttl)
                ON CONFLICT DO NOTHING
                RETURNING x.attempts, x.expires_at, x.ctid, x.tableoid INTO attempts, expires_at, at_ctid, at_part;
                inserted := FOUND;
            ELSE
                -- Not waiting for another transaction's uncommitted row of the key: in_progress.
                saved := pg_catalog.current_setting('lock_timeout');
                BEGIN
                    PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
                    INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, fingerprint,
                                                          created_at, updated_at, expires_at)
                    VALUES (sc, k, 'pending', claim_one.token, 1, fp,
                            idempotency.created_at(st.w_from, st.w_to),
                            pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) ttl)
                    ON CONFLICT DO NOTHING
                    RETURNING x.attempts, x.expires_at, x.ctid, x.tableoid INTO attempts, expires_at, at_ctid, at_part;
                    inserted := FOUND;
                    PERFORM pg_catalog.set_config('lock_timeout', saved, true);
                EXCEPTION WHEN lock_not_available THEN
                    busy := true;
                END;
                IF busy THEN
                    outcome := 'in_progress'; token := NULL; attempts := NULL; expires_at := NULL;
                    RETURN;
                END IF;
            END IF;
            -- A seal that moved past the write partition while this waited for its lock: the row (if any)
            -- went where later claims of the key do not look. Deleted; the caller claims again.
            IF coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
               OPERATOR(pg_catalog.>=) st.w_to_us AND inserted AND idempotency.sealed_under(st, k, sc) THEN
                DELETE FROM idempotency.records x
                 WHERE x.tableoid OPERATOR(pg_catalog.=) at_part AND x.ctid OPERATOR(pg_catalog.=) at_ctid;
                outcome := 'retry'; token := NULL; attempts := NULL; expires_at := NULL;
                RETURN;
            END IF;
            IF inserted THEN
                saved := idempotency.remember_claim(token, at_ctid, at_part);
                outcome := 'claimed';
                RETURN;
            END IF;
        END IF;
        IF NOT found_row THEN
            token := NULL;
            -- Another transaction wrote the key there and committed (ON CONFLICT waited for it), or this one did.
            SELECT x.tableoid, x.ctid, x.xmin, x.status, x.token, x.attempts, x.fingerprint, x.payload, x.error, x.expires_at, x.created_at
              INTO r FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
               AND x.created_at OPERATOR(pg_catalog.>=) st.w_from AND x.created_at OPERATOR(pg_catalog.<) st.w_to;
            CONTINUE WHEN NOT FOUND;   -- deleted in between (forgotten, reclaimed): look again
        END IF;
        found_row := false;
        attempts := r.attempts;
        IF r.fingerprint IS NOT NULL AND fp IS NOT NULL AND r.fingerprint OPERATOR(pg_catalog.<>) fp THEN
            outcome := 'mismatch';
            RETURN;
        END IF;
        IF r.status OPERATOR(pg_catalog.=) 'completed' THEN
            outcome := 'completed'; token := r.token; payload := r.payload;
            RETURN;
        ELSIF r.status OPERATOR(pg_catalog.=) 'failed' THEN
            outcome := 'failed'; payload := r.error;
            RETURN;
        END IF;
        -- pending: a live lease (or this transaction's own claim) is in progress
        IF (r.token IS NOT NULL AND (r.expires_at IS NULL OR r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()))
           OR idempotency.written_here(r.xmin) THEN
            IF r.token IS NOT NULL AND r.expires_at IS NULL AND NOT idempotency.written_here(r.xmin) THEN
                NULL;  -- a lease without an end: taken over below like an expired one
            ELSE
                outcome := 'in_progress'; payload := r.error; expires_at := r.expires_at;
                RETURN;
            END IF;
        END IF;
        -- Expired or released: take it over under the row's lock, deciding again on what the lock shows.
        IF wait THEN
            SELECT x.status, x.token, x.attempts, x.expires_at, x.fingerprint INTO r FROM idempotency.records x
             WHERE x.created_at OPERATOR(pg_catalog.=) r.created_at AND x.ctid OPERATOR(pg_catalog.=) r.ctid
               AND x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
               FOR UPDATE;
        ELSE
            BEGIN
                SELECT x.status, x.token, x.attempts, x.expires_at, x.fingerprint INTO r FROM idempotency.records x
                 WHERE x.created_at OPERATOR(pg_catalog.=) r.created_at AND x.ctid OPERATOR(pg_catalog.=) r.ctid
                   AND x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
                   FOR UPDATE NOWAIT;
            EXCEPTION WHEN lock_not_available THEN
                outcome := 'in_progress'; expires_at := r.expires_at;
                RETURN;
            END;
        END IF;
        -- Changed under us (completed, taken over, forgotten): decide again on the latest row.
        CONTINUE WHEN NOT FOUND OR r.status OPERATOR(pg_catalog.<>) 'pending'
                   OR (r.token IS NOT NULL AND r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp());
        IF r.attempts OPERATOR(pg_catalog.>=) st.max_attempts THEN
            UPDATE idempotency.records x
               SET status = 'failed', updated_at = pg_catalog.clock_timestamp(), expires_at = NULL,
                   error = pg_catalog.jsonb_build_object('error', 'max_attempts_exceeded', 'attempts', x.attempts,
                                                         'last_error', x.error)
             WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
            RETURNING x.attempts, x.error INTO attempts, payload;
            outcome := 'failed';
            RETURN;
        END IF;
        UPDATE idempotency.records x
           SET status = 'pending', token = pg_catalog.nextval('idempotency.token_seq'),
               attempts = x.attempts OPERATOR(pg_catalog.+) 1, fingerprint = coalesce(x.fingerprint, fp),
               updated_at = pg_catalog.clock_timestamp(), expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) ttl
         WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
        RETURNING x.token, x.attempts, x.expires_at, x.ctid, x.tableoid INTO token, attempts, expires_at, at_ctid, at_part;
        saved := idempotency.remember_claim(token, at_ctid, at_part);
        outcome := 'claimed';
        RETURN;
    END LOOP;
    RAISE EXCEPTION 'idempotency: could not serialize access to key % in scope % due to a concurrent claim',
                    idempotency.quoted(k), idempotency.quoted(sc)
        USING ERRCODE = '40001', DETAIL = 'The key''s record kept changing under the claim.',
              HINT = 'The transaction should be retried.';
END
$$;

CREATE OR REPLACE FUNCTION idem_claim(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default',
                           fingerprint text DEFAULT NULL, wait boolean DEFAULT true)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, true, false);
    ok boolean;
    st idempotency.call_state;
    t interval;
    conflicted boolean;
    elsewhere boolean;
    h bigint;
    remembered text;
    at_ctid tid;
    at_part oid;
    c record;
BEGIN
    -- The common case (idempotency.fast_version): arguments within the limits (key and scope not empty and
    -- without control characters: one pattern over both, joined by one), no record of the key outside the
    -- write partition, and the new row written there. The state comes from idempotency.cached_state, folded
    -- into each statement's plan. The write returns what the claim answers, remembers the claim, and says
    -- whether sealed_upto still matches the constants it planned with and those of the first test.
    IF ver OPERATOR(pg_catalog.>=) 0 AND idem_claim.wait
       AND GREATEST(pg_catalog.octet_length(idem_claim.key), pg_catalog.octet_length(idem_claim.scope),
                    pg_catalog.octet_length(idem_claim.fingerprint)) OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_key_bytes
       AND pg_catalog.concat(idem_claim.key, E'\u0001', idem_claim.scope)
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
            RETURNING 'claimed', x.token, x.attempts, x.expires_at, x.ctid, x.tableoid,
                      idempotency.remember_claim(x.token, x.ctid, x.tableoid),
                      coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                          OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto
                      AND (idempotency.cached_state()).upto OPERATOR(pg_catalog.=) ver
                 INTO outcome, idem_claim.token, idem_claim.attempts, idem_claim.expires_at, at_ctid, at_part, remembered, ok;
            IF ok THEN
                RETURN NEXT;
                RETURN;
            END IF;
            conflicted := ok IS NULL;   -- the key is in the write partition: claim_one reads it
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
                -- the key do not look. Deleted; claimed again the long way.
                DELETE FROM idempotency.records x
                 WHERE x.tableoid OPERATOR(pg_catalog.=) at_part AND x.ctid OPERATOR(pg_catalog.=) at_ctid;
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

-- (0.9.0's sql/edition/ 33-settle.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: settling a key the caller holds (idem_complete, idem_fail, idem_heartbeat) and the row
-- they change (idempotency.held_row). The claims are in 30-keys.sql.

-- The row of a key the caller holds, locked: 55006 / 55000 / P0002 as the native extension decides.
CREATE OR REPLACE FUNCTION idempotency.held_row(k text, sc text, given bigint,
                                     OUT part oid, OUT row_ctid tid, OUT attempts integer)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT x.tableoid, x.ctid, x.xmin, x.status, x.token, x.attempts INTO r FROM idempotency.records x
     WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency: key % in scope % does not exist', idempotency.quoted(k), idempotency.quoted(sc)
            USING ERRCODE = 'P0002',
                  HINT = 'Claim the key with idem_claim first; a claim made in a rolled-back transaction leaves no record.';
    END IF;
    IF given IS NOT NULL AND r.token IS DISTINCT FROM given THEN
        RAISE EXCEPTION 'idempotency: lease lost on key % in scope %: token % is not the current holder''s',
                        idempotency.quoted(k), idempotency.quoted(sc), given
            USING ERRCODE = '55006', HINT = 'Another consumer owns this key now; abandon this attempt without side effects.';
    END IF;
    IF r.status OPERATOR(pg_catalog.<>) 'pending' THEN
        RAISE EXCEPTION 'idempotency: key % in scope % is already %', idempotency.quoted(k), idempotency.quoted(sc), r.status
            USING ERRCODE = '55000';
    END IF;
    IF r.token IS NULL THEN
        RAISE EXCEPTION 'idempotency: lease lost on key % in scope %: the key was released after a retryable failure',
                        idempotency.quoted(k), idempotency.quoted(sc)
            USING ERRCODE = '55006', HINT = 'Another consumer owns this key now; abandon this attempt without side effects.';
    END IF;
    IF given IS NULL AND NOT idempotency.written_here(r.xmin) THEN
        RAISE EXCEPTION 'idempotency: lease lost on key % in scope %: no token given and the claim was made by another transaction',
                        idempotency.quoted(k), idempotency.quoted(sc)
            USING ERRCODE = '55006', HINT = 'Another consumer owns this key now; abandon this attempt without side effects.';
    END IF;
    part := r.tableoid; row_ctid := r.ctid; attempts := r.attempts;
END
$$;

CREATE OR REPLACE FUNCTION idem_complete(key text, payload jsonb DEFAULT NULL, scope text DEFAULT 'default', token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m text;
    st idempotency.call_state;
    h record;
BEGIN
    -- The common case in one statement: the key's pending row in the write partition, held by the given token
    -- or, without one, by this transaction's last claim (idempotency.remember_claim). The limits and the
    -- write partition as in idem_claim's common case (idempotency.fast_version: READ COMMITTED only).
    IF idempotency.fast_version(false, false, true) OPERATOR(pg_catalog.>=) 0
       AND GREATEST(pg_catalog.octet_length(idem_complete.key), pg_catalog.octet_length(idem_complete.scope))
           OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_key_bytes
       AND pg_catalog.concat(idem_complete.key, E'\u0001', idem_complete.scope)
           OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]+\u0001[^\u0001-\u001f\u007f-\u009f]+$'
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
           AND x.status OPERATOR(pg_catalog.=) 'pending'
           AND x.token::text OPERATOR(pg_catalog.=) coalesce(idem_complete.token::text,
               pg_catalog.split_part(pg_catalog.current_setting('idempotency_edition.claimed_row', true), ' ', 1));
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

CREATE OR REPLACE FUNCTION idem_fail(key text, error jsonb DEFAULT NULL, retryable boolean DEFAULT true,
                          scope text DEFAULT 'default', token bigint DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    h record;
BEGIN
    PERFORM idempotency.check_writable('idem_fail');
    PERFORM idempotency.check_ident('key', idem_fail.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_fail.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_fail.scope, s);
    PERFORM idempotency.check_document('error', idem_fail.error, s.max_payload_bytes);
    PERFORM idempotency.check_required('retryable', idem_fail.retryable);
    PERFORM idempotency.check_token(idem_fail.token);
    h := idempotency.held_row(idem_fail.key, idem_fail.scope, idem_fail.token);
    IF idem_fail.retryable AND h.attempts OPERATOR(pg_catalog.<) s.max_attempts THEN
        UPDATE idempotency.records x
           SET token = NULL, error = idem_fail.error, updated_at = pg_catalog.clock_timestamp(),
               expires_at = pg_catalog.clock_timestamp()
         WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid;
        RETURN 'released';
    END IF;
    UPDATE idempotency.records x
       SET status = 'failed', error = idem_fail.error, updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
     WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid;
    RETURN 'failed';
END
$$;

CREATE OR REPLACE FUNCTION idem_heartbeat(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default', token bigint DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    t interval;
    h record;
    e timestamptz;
BEGIN
    PERFORM idempotency.check_writable('idem_heartbeat');
    PERFORM idempotency.check_ident('key', idem_heartbeat.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_heartbeat.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_heartbeat.scope, s);
    t := idempotency.check_ttl(idem_heartbeat.ttl, s.lease_ttl, s.max_lease_ttl);
    PERFORM idempotency.check_token(idem_heartbeat.token);
    h := idempotency.held_row(idem_heartbeat.key, idem_heartbeat.scope, idem_heartbeat.token);
    UPDATE idempotency.records x
       SET expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) t, updated_at = pg_catalog.clock_timestamp()
     WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid
    RETURNING x.expires_at INTO e;
    RETURN e;
END
$$;

-- (0.9.0's sql/edition/ 35-once.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: idem_once (and the one-key step idem_once_batch shares) and idem_status. New keys meet in
-- the write partition's unique index, as in 30-keys.sql.

-- One once-key, the long way (idem_once outside its common case, idem_once_batch's keys that met a row): st
-- is the caller's idempotency.call_state. true when new (written completed), false when seen before, NULL when
-- the write partition was sealed under the write (READ COMMITTED; nothing written): the caller tries again.
CREATE OR REPLACE FUNCTION idempotency.once_one(k text, sc text, st idempotency.call_state) RETURNS boolean
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    at_ctid tid;
    at_part oid;
BEGIN
    IF (st.probe_before OR st.probe_ahead)
       AND EXISTS (SELECT FROM idempotency.records x
                    WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
                      AND (x.created_at OPERATOR(pg_catalog.<) st.w_from
                           OR (st.probe_ahead AND x.created_at OPERATOR(pg_catalog.>=) st.w_to))) THEN
        RETURN false;
    END IF;
    IF st.stale_seal THEN
        PERFORM idempotency.seal_conflict(k, sc);
    END IF;
    INSERT INTO idempotency.records AS x (scope, key, status, attempts, created_at, updated_at)
    VALUES (sc, k, 'completed', 1,
            idempotency.created_at(st.w_from, st.w_to),
            pg_catalog.now())
    ON CONFLICT DO NOTHING
    RETURNING x.ctid, x.tableoid INTO at_ctid, at_part;
    IF FOUND THEN
        IF coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.>=) st.w_to_us
           AND idempotency.sealed_under(st, k, sc) THEN
            DELETE FROM idempotency.records x
             WHERE x.tableoid OPERATOR(pg_catalog.=) at_part AND x.ctid OPERATOR(pg_catalog.=) at_ctid;
            RETURN NULL;
        END IF;
        RETURN true;
    END IF;
    -- The key was there: it was read, not written. Under SERIALIZABLE, read its row as a query does (ON
    -- CONFLICT's check takes no predicate lock), so that a transaction deleting it is seen (idem_forget).
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'serializable' THEN
        PERFORM FROM idempotency.records x
         WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
           AND x.created_at OPERATOR(pg_catalog.>=) st.w_from AND x.created_at OPERATOR(pg_catalog.<) st.w_to;
    END IF;
    RETURN false;
END
$$;

CREATE OR REPLACE FUNCTION idem_once(key text, scope text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, false, false);
    ok boolean;
    at_ctid tid;
    at_part oid;
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
       AND pg_catalog.concat(idem_once.key, E'\u0001', idem_once.scope)
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
            RETURNING x.ctid, x.tableoid,
                      coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                          OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto
                      AND (idempotency.cached_state()).upto OPERATOR(pg_catalog.=) ver
                 INTO at_ctid, at_part, ok;
            IF ok THEN
                RETURN true;
            ELSIF ok IS NULL THEN
                RETURN false;   -- the key was there
            END IF;
            -- A seal (or another change of the state) while this ran: written again the long way.
            DELETE FROM idempotency.records x
             WHERE x.tableoid OPERATOR(pg_catalog.=) at_part AND x.ctid OPERATOR(pg_catalog.=) at_ctid;
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

CREATE OR REPLACE FUNCTION idem_status(key text, scope text DEFAULT 'default')
RETURNS TABLE (status text, attempts integer, token bigint, payload jsonb, error jsonb,
               created_at timestamptz, updated_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    PERFORM idempotency.check_ident('key', idem_status.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_status.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_status.scope, s);
    RETURN QUERY SELECT x.status, x.attempts, x.token, x.payload, x.error, x.created_at, x.updated_at, x.expires_at
                   FROM idempotency.records x
                  WHERE x.key OPERATOR(pg_catalog.=) idem_status.key AND x.scope OPERATOR(pg_catalog.=) idem_status.scope;
END
$$;
-- (0.9.0's sql/edition/ 40-batch.sql: idem_claim_batch idem_once_batch, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_claim_batch(keys text[], ttl interval DEFAULT NULL, scope text DEFAULT 'default')
RETURNS TABLE (key text, outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    size integer;
    t interval;
    st idempotency.call_state;
    c record;
    k text;
    answers idempotency.claim_answer[];
    parts oid[];
    ctids tid[];
    tokens bigint[];
    iver bigint;
BEGIN
    PERFORM idempotency.check_writable('idem_claim_batch');
    -- The size first, from the argument as it came: an array passed on in a query (check_keys) is copied.
    IF pg_catalog.cardinality(idem_claim_batch.keys) OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        size := pg_catalog.cardinality(idem_claim_batch.keys);
        PERFORM idempotency.too_many_keys(size, s.max_batch_keys);
    END IF;
    PERFORM idempotency.check_keys(idem_claim_batch.keys, s);
    PERFORM idempotency.check_ident('scope', idem_claim_batch.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_claim_batch.scope, s);
    t := idempotency.check_ttl(idem_claim_batch.ttl, s.lease_ttl, s.max_lease_ttl);
    st := idempotency.call_state(NULL, true);
    IF st.stale_seal THEN
        PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope);
    END IF;
    -- The keys no other partition holds, written at once, in key order, when the state's constants
    -- (idempotency.cached_state, folded into the statement's plan) are current; the write says the version
    -- it planned with, checked against sealed_upto after it (as idem_claim's). Otherwise, or when a seal
    -- moved past the write partition meanwhile (the rows deleted), every key goes the long way below.
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        WITH fresh AS (
            SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_claim_batch.keys) AS u(k)
             WHERE NOT ((idempotency.cached_state()).filtered
                        AND EXISTS (SELECT FROM idempotency.sealed_key_matches(idempotency.key_hash(u.k, idem_claim_batch.scope))))
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
               pg_catalog.array_agg(wr.tableoid), pg_catalog.array_agg(wr.ctid), pg_catalog.array_agg(wr.token),
               (idempotency.cached_state()).upto
          INTO answers, parts, ctids, tokens, iver FROM written wr;
        IF answers IS NOT NULL
           AND (iver OPERATOR(pg_catalog.<>) st.upto
                OR coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.<>) iver) THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
            DELETE FROM idempotency.records x USING ROWS FROM (pg_catalog.unnest(parts), pg_catalog.unnest(ctids)) AS d(part, row_ctid)
             WHERE x.tableoid OPERATOR(pg_catalog.=) d.part AND x.ctid OPERATOR(pg_catalog.=) d.row_ctid;
            answers := NULL; tokens := NULL;
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
    -- The others, one by one in key order: what the single claim answers.
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
        IF c.outcome OPERATOR(pg_catalog.=) 'claimed' THEN
            tokens := tokens OPERATOR(pg_catalog.||) c.token;
        END IF;
    END LOOP;
    -- The tokens of this call's claims, for idem_complete_batch without tokens in this transaction (see
    -- idempotency.remember_claim; a rolled-back subtransaction undoes it, as it undoes the claims).
    IF tokens IS NOT NULL THEN
        PERFORM pg_catalog.set_config('idempotency_edition.claimed_batch',
            pg_catalog.concat_ws(',', NULLIF(pg_catalog.current_setting('idempotency_edition.claimed_batch', true), ''),
                                 pg_catalog.array_to_string(tokens, ',')), true);
    END IF;
    -- In input order; a repeated key gets its first occurrence's answer, but only the first owns a claim.
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
    s idempotency.settings := idempotency.config();
    size integer;
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
    PERFORM idempotency.check_writable('idem_once_batch');
    -- The size first, from the argument as it came: an array passed on in a query (check_keys) is copied.
    IF pg_catalog.cardinality(idem_once_batch.keys) OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        size := pg_catalog.cardinality(idem_once_batch.keys);
        PERFORM idempotency.too_many_keys(size, s.max_batch_keys);
    END IF;
    PERFORM idempotency.check_keys(idem_once_batch.keys, s);
    PERFORM idempotency.check_ident('scope', idem_once_batch.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_once_batch.scope, s);
    st := idempotency.call_state(NULL, true);
    IF st.stale_seal THEN
        PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope);
    END IF;
    -- As idem_claim_batch: the new keys in one write with the state's constants when they are current, else
    -- (or when a seal moved past the write partition meanwhile) key by key the long way (idempotency.once_one).
    -- A key whose print matched in the key filters of the sealed partitions is not written here: it goes
    -- the long way, after the others.
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        -- (Apart from the write, and only where a filter exists: a list of the keys that both statements read
        -- would be materialized, which cost every batch 3,500 instructions a key.)
        IF (idempotency.cached_state()).filtered THEN
            maybes := ARRAY(SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k)
                             WHERE EXISTS (SELECT FROM idempotency.sealed_key_matches(idempotency.key_hash(u.k, idem_once_batch.scope))));
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
    -- Keys that were there were read, not written: under SERIALIZABLE, read them as a query does (see
    -- idempotency.once_one).
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'serializable' THEN
        PERFORM FROM idempotency.records x
         WHERE x.scope OPERATOR(pg_catalog.=) idem_once_batch.scope AND x.key OPERATOR(pg_catalog.=) ANY (idem_once_batch.keys)
           AND x.created_at OPERATOR(pg_catalog.>=) st.w_from AND x.created_at OPERATOR(pg_catalog.<) st.w_to;
    END IF;
    RETURN QUERY
    SELECT v.k FROM (SELECT u.k, pg_catalog.min(u.i) AS i
                       FROM pg_catalog.unnest(idem_once_batch.keys) WITH ORDINALITY AS u(k, i)
                       JOIN pg_catalog.unnest(fresh) AS f(k) ON f.k OPERATOR(pg_catalog.=) u.k
                      GROUP BY u.k) v
     ORDER BY v.i;
END
$$;

-- (0.9.0's sql/edition/ 90-finalize.sql, as scripts/sql-edition --expand wrote it in)
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

-- The state of this database with the new fields, now rather than at the next maintenance round.
SELECT FROM idempotency.write_call_cache();
