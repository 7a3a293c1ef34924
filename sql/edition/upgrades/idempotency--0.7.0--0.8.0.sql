-- The SQL edition, 0.7.0 -> 0.8.0 (issue 32: the key calls read the state they need, the limits, whether
-- scope grants are enforced, the write partition and which partitions to look in, as the constants of
-- idempotency.cached_state, which statement triggers write again when its tables change). What is stored
-- does not change; added: partition_ranges.known_empty (false until a maintenance round finds a partition
-- ahead of the write partition empty), the type idempotency.call_state, the triggers call_cache, and
-- idempotency.sealed_upto made "called" (so pg_sequence_last_value reads its value, 0 before the first
-- seal, rather than NULL). Run by the 0.8.0 plain script over a 0.7.0 install, or by ALTER EXTENSION
-- idempotency UPDATE after the 0.8.0 idempotency-tle.sql registered this path; in either case one
-- transaction, in the schema of the install. It takes an ACCESS EXCLUSIVE lock on partition_ranges, so it
-- waits for the transactions that called the edition and they wait for it (no partition is rebuilt: it
-- takes a moment).

-- Storage. partition_ranges first: every seal, claim and maintenance round reads it, so once its lock is
-- held no seal is under way or starts before this commits, and sealed_upto is set again to its own value
-- without a seal moving it in between (setval is not undone by a rollback; the value is kept, so that does
-- not matter).
ALTER TABLE idempotency.partition_ranges ADD COLUMN known_empty boolean NOT NULL DEFAULT false;
SELECT pg_catalog.setval('idempotency.sealed_upto', q.last_value, true) FROM idempotency.sealed_upto q;

CREATE TYPE idempotency.call_state AS (
    max_lease_ttl     interval,
    max_attempts      integer,
    max_key_bytes     integer,
    max_payload_bytes integer,
    max_batch_keys    integer,
    lease_ttl         interval,
    grants_enforced   boolean,
    upto              bigint,
    w_from            timestamptz,
    w_to              timestamptz,
    w_to_us           bigint,
    probe_before      boolean,
    probe_ahead       boolean,
    stale_seal        boolean,
    w_at_seal         boolean,
    lease_ttl_ok      boolean,
    max_payload_bytes_4 integer,
    native_defaults_ok boolean,
    w_name text
);

-- The functions 0.8.0 no longer has, or has with other arguments.
DROP FUNCTION idempotency.check_seals_visible(text, text);
DROP FUNCTION idempotency.remembered_claim();
DROP FUNCTION idempotency.remember_claim(oid, tid);
DROP FUNCTION idempotency.check_ttl(interval, idempotency.settings);
DROP FUNCTION idempotency.claim_one(text, text, interval, text, boolean, integer, timestamptz, timestamptz);
DROP FUNCTION idempotency.once_one(text, text, timestamptz, timestamptz);

-- Every function and view of 0.8.0, from the sources in the manifest's order (scripts/sql-edition writes
-- them in, each made CREATE OR REPLACE; the files that also make storage by the names of their functions).
-- (0.8.0's sql/edition/ 10-common.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: settings, argument checks and grants, shared by every function. Each runs inside a
-- SECURITY DEFINER function of the edition (search_path = pg_catalog, pg_temp) and qualifies what it uses.

-- A setting's text as the session gave it (SET idempotency.<name>), or NULL.
CREATE OR REPLACE FUNCTION idempotency.session_value(name text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NULLIF(pg_catalog.current_setting('idempotency.' OPERATOR(pg_catalog.||) name, true), '')
$$;

-- A GUC-style duration ('30s', '10min', '2d', '1h'; a bare number is in `unit`) as an interval. (The small
-- helpers here are PL/pgSQL, whose plans a session keeps: a SQL function that is not inlined is planned anew
-- at each call from PL/pgSQL.)
CREATE OR REPLACE FUNCTION idempotency.parse_interval(value text, unit text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value OPERATOR(pg_catalog.~) '^\s*-?[0-9]+\s*$' THEN
        RETURN pg_catalog.interval_mul(('1 ' OPERATOR(pg_catalog.||) unit)::interval, value::pg_catalog.float8);
    END IF;
    RETURN value::interval;
END
$$;

-- A GUC-style size ('512B', '1kB', '1MB'; a bare number is bytes) in bytes.
CREATE OR REPLACE FUNCTION idempotency.parse_bytes(value text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN pg_catalog.pg_size_bytes(pg_catalog.regexp_replace(value, '^\s*([0-9]+)\s*B\s*$', '\1'));
END
$$;

-- The role that called: the one SET ROLE chose, else the session's login role. (A SECURITY DEFINER
-- function runs as its owner; the role setting is what SET ROLE set, checked against membership when it
-- was set, so a caller cannot name a role it could not become.)
CREATE OR REPLACE FUNCTION idempotency.caller() RETURNS name
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(NULLIF(pg_catalog.current_setting('role'), 'none')::name, SESSION_USER)
$$;

-- True when the calling role is a superuser: only then may a session loosen a limit.
CREATE OR REPLACE FUNCTION idempotency.session_is_superuser() RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r
                      WHERE r.rolname OPERATOR(pg_catalog.=) idempotency.caller()), false);
END
$$;

-- The values ALTER DATABASE ... SET and ALTER ROLE ... SET give a setting for this database and the calling
-- role (the floors a session of that role must not loosen).
CREATE OR REPLACE FUNCTION idempotency.configured_values(name text) RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN ARRAY(
        SELECT pg_catalog.substr(c, pg_catalog.length(name) OPERATOR(pg_catalog.+) 14)
          FROM pg_catalog.pg_db_role_setting d, pg_catalog.unnest(d.setconfig) AS c
         WHERE d.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0::oid, (SELECT b.oid FROM pg_catalog.pg_database b
                                                                         WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())])
           AND d.setrole OPERATOR(pg_catalog.=) ANY (ARRAY[0::oid, (SELECT r.oid FROM pg_catalog.pg_roles r
                                                                     WHERE r.rolname OPERATOR(pg_catalog.=) idempotency.caller())])
           AND pg_catalog.starts_with(c, 'idempotency.' OPERATOR(pg_catalog.||) name OPERATOR(pg_catalog.||) '='));
END
$$;

-- One limit in force: the table's value, tightened by any ALTER DATABASE / ALTER ROLE value and by the
-- session's own (SET idempotency.<name>); a superuser's session value stands as it is. kind: 'n' (a
-- number), 'b' (bytes), 's' (seconds, for an interval as microseconds), 'g' (require_scope_grants: 0 on).
CREATE OR REPLACE FUNCTION idempotency.limit_in_force(name text, table_value bigint, session_value text, kind text) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    v bigint := table_value;
    c text;
BEGIN
    IF idempotency.session_is_superuser() THEN
        RETURN idempotency.limit_value(session_value, kind);
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
        WHEN 'g' THEN CASE WHEN value::boolean THEN 0 ELSE 1 END   -- require_scope_grants: on is the tighter
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
    v := idempotency.session_value('max_lease_ttl');
    IF v IS NOT NULL THEN
        s.max_lease_ttl := pg_catalog.make_interval(secs => idempotency.limit_in_force('max_lease_ttl',
            (EXTRACT(epoch FROM s.max_lease_ttl) OPERATOR(pg_catalog.*) 1000000)::bigint, v, 's')::pg_catalog.float8
            OPERATOR(pg_catalog./) 1000000);
    END IF;
    v := idempotency.session_value('max_attempts');
    IF v IS NOT NULL THEN s.max_attempts := idempotency.limit_in_force('max_attempts', s.max_attempts, v, 'n'); END IF;
    v := idempotency.session_value('max_key_bytes');
    IF v IS NOT NULL THEN s.max_key_bytes := idempotency.limit_in_force('max_key_bytes', s.max_key_bytes, v, 'b'); END IF;
    v := idempotency.session_value('max_payload_bytes');
    IF v IS NOT NULL THEN s.max_payload_bytes := idempotency.limit_in_force('max_payload_bytes', s.max_payload_bytes, v, 'b'); END IF;
    v := idempotency.session_value('max_batch_keys');
    IF v IS NOT NULL THEN s.max_batch_keys := idempotency.limit_in_force('max_batch_keys', s.max_batch_keys, v, 'n'); END IF;
    v := idempotency.session_value('require_scope_grants');
    IF v IS NOT NULL THEN
        s.require_scope_grants := idempotency.limit_in_force('require_scope_grants',
            CASE WHEN s.require_scope_grants THEN 0 ELSE 1 END, v, 'g') OPERATOR(pg_catalog.=) 0;
    END IF;
    RETURN s;
END
$$;

-- The effective value of one integer limit, in bytes for sizes (for the derivation functions).
CREATE OR REPLACE FUNCTION idempotency.setting_int(name text) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    RETURN CASE name
        WHEN 'max_attempts' THEN s.max_attempts
        WHEN 'max_key_bytes' THEN s.max_key_bytes
        WHEN 'max_payload_bytes' THEN s.max_payload_bytes
        WHEN 'max_batch_keys' THEN s.max_batch_keys
        WHEN 'premake' THEN s.premake
    END;
END
$$;

-- Rust's {:?} of a name in a message: double quotes, with backslashes and quotes escaped (control
-- characters never reach a message: check_ident refuses them).
CREATE OR REPLACE FUNCTION idempotency.quoted(name text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '"' OPERATOR(pg_catalog.||)
           pg_catalog.replace(pg_catalog.replace(name, '\', '\\'), '"', '\"')
           OPERATOR(pg_catalog.||) '"'
$$;

-- 54000 with the native extension's message and hint.
CREATE OR REPLACE FUNCTION idempotency.too_large(what text, bytes bigint, max_bytes bigint, guc text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: % is % bytes, over the limit of %', what, bytes, max_bytes
        USING ERRCODE = '54000', HINT = pg_catalog.format('The limit is set by %s.', guc);
END
$$;

-- The size the native extension measures a jsonb by: the detoasted datum's (uncompressed; a 1-byte header
-- kept as it is). doc #> '{}' is the document detoasted with a 4-byte header; a short inline datum (at most
-- 127 bytes) had a 1-byte one.
CREATE OR REPLACE FUNCTION idempotency.document_size(doc jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    size bigint := pg_catalog.pg_column_size(doc OPERATOR(pg_catalog.#>) '{}'::text[]);
BEGIN
    IF size OPERATOR(pg_catalog.<=) 130 AND pg_catalog.pg_column_size(doc) OPERATOR(pg_catalog.=) (size OPERATOR(pg_catalog.-) 3) THEN
        RETURN size OPERATOR(pg_catalog.-) 3;
    END IF;
    RETURN size;
END
$$;

-- 22004 / 22023 / 54000 for a key, scope, group or topic, in the native extension's order.
CREATE OR REPLACE FUNCTION idempotency.check_ident(what text, value text, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'idempotency: % must not be NULL', what USING ERRCODE = '22004';
    END IF;
    IF value OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'idempotency: % must not be empty', what USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.octet_length(value) OPERATOR(pg_catalog.>) max_bytes THEN
        PERFORM idempotency.too_large(what, pg_catalog.octet_length(value), max_bytes, 'idempotency.max_key_bytes');
    END IF;
    IF value OPERATOR(pg_catalog.~) '[\u0001-\u001f\u007f-\u009f]' THEN
        RAISE EXCEPTION 'idempotency: % must not contain control characters', what USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.check_required(what text, value anyelement) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'idempotency: % must not be NULL', what USING ERRCODE = '22004';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.check_writable(fn text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
        RAISE EXCEPTION '% cannot run in a read-only transaction', fn USING ERRCODE = '25006',
            HINT = CASE WHEN pg_catalog.pg_is_in_recovery() THEN 'This server is a hot standby: call it on the primary.'
                        ELSE 'Call it in a read-write transaction.' END;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.check_ttl(ttl interval, lease_ttl interval, max_lease_ttl interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    t interval := coalesce(ttl, lease_ttl);
BEGIN
    IF t OPERATOR(pg_catalog.<=) '0'::interval THEN
        RAISE EXCEPTION 'idempotency: ttl must be positive, got %', t USING ERRCODE = '22023';
    END IF;
    IF t OPERATOR(pg_catalog.>) max_lease_ttl THEN
        RAISE EXCEPTION 'idempotency: ttl % is longer than idempotency.max_lease_ttl (%)', t, max_lease_ttl
            USING ERRCODE = '22023';
    END IF;
    RETURN t;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.check_token(token bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'idempotency: token must be positive, got %', token USING ERRCODE = '22023';
    END IF;
END
$$;

-- 54000 when a payload, error or document is larger than max_payload_bytes (its jsonb size).
CREATE OR REPLACE FUNCTION idempotency.check_document(what text, doc jsonb, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF doc IS NOT NULL AND idempotency.document_size(doc) OPERATOR(pg_catalog.>) max_bytes THEN
        PERFORM idempotency.too_large(what, idempotency.document_size(doc), max_bytes, 'idempotency.max_payload_bytes');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.check_fingerprint(fingerprint text, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF pg_catalog.octet_length(fingerprint) OPERATOR(pg_catalog.>) max_bytes THEN
        PERFORM idempotency.too_large('fingerprint', pg_catalog.octet_length(fingerprint), max_bytes, 'idempotency.max_key_bytes');
    END IF;
END
$$;

-- Scope and consumer-group grants: off until the first grant of a kind (or require_scope_grants). The
-- caller is idempotency.caller(); a superuser passes; a member of a granted role (with its privileges) passes.
CREATE OR REPLACE FUNCTION idempotency.authorize(kind text, name text, s idempotency.settings) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF s.require_scope_grants
       OR EXISTS (SELECT FROM idempotency.scope_grants g WHERE g.kind OPERATOR(pg_catalog.=) authorize.kind) THEN
        PERFORM idempotency.authorize_enforced(kind, name);
    END IF;
END
$$;

-- The check itself, once grants of the kind are enforced (idempotency.call_state tells the key calls so).
CREATE OR REPLACE FUNCTION idempotency.authorize_enforced(kind text, name text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF idempotency.session_is_superuser() OR EXISTS (
        SELECT FROM idempotency.scope_grants g
         WHERE g.kind OPERATOR(pg_catalog.=) authorize_enforced.kind
           AND CASE WHEN pg_catalog.right(g.pattern, 1) OPERATOR(pg_catalog.=) '*'
                    THEN pg_catalog.starts_with(name, pg_catalog.left(g.pattern, -1))
                    ELSE g.pattern OPERATOR(pg_catalog.=) name END
           AND pg_catalog.pg_has_role(idempotency.caller(), g.role::oid, 'USAGE')) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'idempotency: role % has no grant on % %', idempotency.quoted(idempotency.caller()),
                    CASE kind WHEN 'scope' THEN 'scope' ELSE 'consumer group' END, idempotency.quoted(name)
        USING ERRCODE = '42501',
              HINT = pg_catalog.format('A DBA grants it with idem_grant_%s(''%s'', ''<name or prefix*>''); see docs/security.md.',
                                       kind, idempotency.caller());
END
$$;
-- (0.8.0's sql/edition/ 15-state.sql: idempotency.live_state idempotency.cached_state idempotency.write_call_cache idempotency.refresh_call_cache idempotency.call_state idempotency.fast_version idempotency.check_key_scope, as scripts/sql-edition --expand wrote it in)
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
    SELECT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.call_state
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
        'SELECT ROW(%L::interval, %s, %s, %s, %s, %L::interval, %s, %s, %s, %s, %s, %s, %s, false, %s, %s, %s, %s, %L)::idempotency.call_state',
        st.max_lease_ttl, coalesce(st.max_attempts::text, 'NULL'), coalesce(st.max_key_bytes::text, 'NULL'),
        coalesce(st.max_payload_bytes::text, 'NULL'), coalesce(st.max_batch_keys::text, 'NULL'), st.lease_ttl,
        coalesce(st.grants_enforced::text, 'NULL'), st.upto,
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.w_from))::text OPERATOR(pg_catalog.||) ')', 'NULL'),
        coalesce('pg_catalog.to_timestamp(' OPERATOR(pg_catalog.||) (EXTRACT(epoch FROM st.w_to))::text OPERATOR(pg_catalog.||) ')', 'NULL'),
        coalesce(st.w_to_us::text, 'NULL'), coalesce(st.probe_before::text, 'NULL'), coalesce(st.probe_ahead::text, 'NULL'),
        coalesce(st.w_at_seal::text, 'NULL'), coalesce(st.lease_ttl_ok::text, 'NULL'), coalesce(st.max_payload_bytes_4::text, 'NULL'),
        coalesce(st.native_defaults_ok::text, 'NULL'), st.w_name);
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
-- always max_key_bytes and require_scope_grants); writing: when the constants match sealed_upto and the write
-- partition covers now. Inlined into the calls, with constant arguments: one expression of the few function
-- calls the call needs (each costs a key call's transaction about as much as its row lookup).
CREATE OR REPLACE FUNCTION idempotency.fast_version(writing boolean, lease boolean, payload boolean) RETURNS bigint
LANGUAGE sql AS $$
    SELECT CASE WHEN (NOT writing
                      OR (idempotency.cached_state()).upto
                         OPERATOR(pg_catalog.=) pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass))
                 AND pg_catalog.concat(pg_catalog.current_setting('transaction_isolation'),
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

-- (0.8.0's sql/edition/ 20-partitions.sql: idempotency.partitions idempotency.index_partition idempotency.ts_literal idempotency.sync_partition_ranges idempotency.premake_partitions idempotency.sealed_until idempotency.write_partition idempotency.seal_partition_within idempotency.seal_partition idempotency.drop_partition, as scripts/sql-edition --expand wrote it in)
-- The partitions with their ranges, sizes, when retention drops each, and when each was sealed: the
-- native extension's view, read from idempotency.partition_ranges (filter_bytes: no filters here, NULL).
CREATE OR REPLACE VIEW idempotency.partitions AS
SELECT p.partition::pg_catalog.regclass                           AS partition,
       p.range_from,
       p.range_to,
       GREATEST(c.reltuples, 0::pg_catalog.float4)::pg_catalog.int8 AS row_estimate,
       pg_catalog.pg_total_relation_size(c.oid)                   AS total_bytes,
       pg_catalog.pg_size_pretty(pg_catalog.pg_total_relation_size(c.oid)) AS size,
       p.range_to OPERATOR(pg_catalog.+) (SELECT s.retention FROM idempotency.settings s) AS dropped_after,
       x.sealed_at,
       NULL::integer                                              AS filter_bytes
  FROM idempotency.partition_ranges p
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.partition
  LEFT JOIN idempotency.sealed x ON x.partition OPERATOR(pg_catalog.=) p.partition
 ORDER BY p.range_from;
GRANT SELECT ON idempotency.partitions TO idempotency_admin, pg_monitor;
COMMENT ON VIEW idempotency.partitions IS 'Partitions of idempotency.records: range, estimated rows, size, when retention drops each, and when it was sealed (no new rows).';

-- The indexes a partition needs: the UNIQUE (key, scope) index that new keys meet in, and expires_at of
-- the leased rows (the reclaim sweep). For a partition attached by hand too.
CREATE OR REPLACE FUNCTION idempotency.index_partition(part regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET default_tablespace = '' AS $$
DECLARE
    rel name;
    space text;
BEGIN
    SELECT c.relname INTO STRICT rel FROM pg_catalog.pg_class c
     WHERE c.oid OPERATOR(pg_catalog.=) part::oid
       AND c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace::oid;
    SELECT coalesce((SELECT pg_catalog.format(' TABLESPACE %I', t.spcname) FROM pg_catalog.pg_tablespace t
                      WHERE t.oid OPERATOR(pg_catalog.=) c.reltablespace), '')
      INTO space FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) part::oid;
    EXECUTE pg_catalog.format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON idempotency.%I (key, scope)%s',
                              rel OPERATOR(pg_catalog.||) '_key_scope_idx', rel, space);
    EXECUTE pg_catalog.format('CREATE INDEX IF NOT EXISTS %I ON idempotency.%I (expires_at)%s WHERE expires_at IS NOT NULL',
                              rel OPERATOR(pg_catalog.||) '_expires_at_idx', rel, space);
END
$$;
COMMENT ON FUNCTION idempotency.index_partition(regclass) IS
'Creates the UNIQUE (key, scope) index and the (expires_at) index of leased rows that a partition of idempotency.records needs, unless they exist. For partitions attached by hand.';

-- A timestamp as a literal that reads back the same under any DateStyle and TimeZone.
CREATE OR REPLACE FUNCTION idempotency.ts_literal(ts timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.quote_literal(pg_catalog.to_char(pg_catalog.timezone('UTC', ts), 'YYYY-MM-DD HH24:MI:SS.US')
                                    OPERATOR(pg_catalog.||) '+00')
$$;

-- Registers in partition_ranges the partitions of the record table it does not know (attached by hand or
-- by pg_partman), and forgets those that are gone; the ranges come from the bounds' own text, printed
-- with DateStyle and TimeZone pinned by this function's SET clauses.
CREATE OR REPLACE FUNCTION idempotency.sync_partition_ranges() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET datestyle = 'ISO, YMD' SET timezone = 'UTC' AS $$
BEGIN
    DELETE FROM idempotency.partition_ranges p
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                        WHERE i.inhrelid OPERATOR(pg_catalog.=) p.partition::oid
                          AND i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid);
    DELETE FROM idempotency.sealed x
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                        WHERE i.inhrelid OPERATOR(pg_catalog.=) x.partition::oid
                          AND i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid);
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

-- Makes the partitions that cover as_of and `premake` intervals after it, where none covers them yet;
-- the number made. Slots are aligned to partition_interval from 2000-01-01 UTC, and named as the native
-- extension names them (records_pYYYY_MM_DD, or records_pYYYY_MM_DD_HH24MI below a day).
CREATE OR REPLACE FUNCTION idempotency.premake_partitions(as_of timestamptz DEFAULT pg_catalog.now()) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET default_tablespace = '' AS $$
DECLARE
    s idempotency.settings;
    slot record;
    made integer := 0;
    -- New partitions and their indexes go where the record table says (ALTER TABLE idempotency.records SET
    -- TABLESPACE), else to the database's default: never where a caller's default_tablespace points.
    space text := (SELECT pg_catalog.format(' TABLESPACE %I', t.spcname) FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_tablespace t ON t.oid OPERATOR(pg_catalog.=) c.reltablespace
                    WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid);
BEGIN
    IF as_of IS NULL THEN
        RAISE EXCEPTION 'idempotency: as_of must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT pg_catalog.isfinite(as_of) THEN
        RAISE EXCEPTION 'idempotency: as_of must be a finite timestamp' USING ERRCODE = '22023';
    END IF;
    PERFORM idempotency.check_writable('idempotency.premake_partitions');
    SELECT * INTO STRICT s FROM idempotency.settings;
    -- One creator at a time (a transaction-scoped lock of the edition's own, taken only when making).
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency.partition_creation')::bigint);
    FOR slot IN
        SELECT g AS lo, g OPERATOR(pg_catalog.+) s.partition_interval AS hi,
               'records_p' OPERATOR(pg_catalog.||) pg_catalog.to_char(pg_catalog.timezone('UTC', g),
                   CASE WHEN s.partition_interval OPERATOR(pg_catalog.>=) '1 day'::interval
                        THEN 'YYYY_MM_DD' ELSE 'YYYY_MM_DD_HH24MI' END) AS name
          FROM pg_catalog.generate_series(
                   pg_catalog.date_bin(s.partition_interval, as_of, '2000-01-01 00:00:00+00'::timestamptz),
                   as_of OPERATOR(pg_catalog.+) pg_catalog.interval_mul(s.partition_interval, s.premake::pg_catalog.float8),
                   s.partition_interval) AS g
         ORDER BY g
    LOOP
        CONTINUE WHEN EXISTS (SELECT FROM idempotency.partition_ranges p
                               WHERE p.range_from OPERATOR(pg_catalog.<) slot.hi
                                 AND p.range_to OPERATOR(pg_catalog.>) slot.lo);
        -- Never behind the sealed ones: a slot before the end of the newest seal stays unmade.
        CONTINUE WHEN slot.lo OPERATOR(pg_catalog.<) idempotency.sealed_until();
        EXECUTE pg_catalog.format('CREATE TABLE idempotency.%I (LIKE idempotency.records INCLUDING DEFAULTS INCLUDING STORAGE)%s',
                                  slot.name, coalesce(space, ''));
        PERFORM idempotency.index_partition(pg_catalog.format('idempotency.%I', slot.name)::pg_catalog.regclass);
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.records ATTACH PARTITION idempotency.%I FOR VALUES FROM (%s) TO (%s)',
                                  slot.name, idempotency.ts_literal(slot.lo), idempotency.ts_literal(slot.hi));
        INSERT INTO idempotency.partition_ranges (partition, partition_name, range_from, range_to)
        VALUES (pg_catalog.format('idempotency.%I', slot.name)::pg_catalog.regclass, slot.name, slot.lo, slot.hi);
        made := made OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN made;
END
$$;
COMMENT ON FUNCTION idempotency.premake_partitions(timestamptz) IS
'Creates the partitions of idempotency.records that cover as_of and idempotency.premake intervals after it; returns how many were created.';

-- The end of the newest sealed partition, as every transaction sees it whatever its snapshot
-- (-infinity when none is sealed).
CREATE OR REPLACE FUNCTION idempotency.sealed_until() RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    upto bigint;
BEGIN
    -- (PL/pgSQL, whose plans are kept for the session: a SQL function with a FROM clause is planned anew at
    -- every call from PL/pgSQL, at 80 us a time.)
    SELECT q.last_value INTO upto FROM idempotency.sealed_upto q;
    IF upto OPERATOR(pg_catalog.=) 0 THEN
        RETURN '-infinity'::timestamptz;
    END IF;
    RETURN pg_catalog.to_timestamp(upto::pg_catalog.float8 OPERATOR(pg_catalog./) 1000000);
END
$$;

-- The write partition, locked against a seal (ROW EXCLUSIVE: a seal's SHARE lock waits for this transaction,
-- and this waits for a seal under way): (partition, range_from, range_to) of the oldest partition past the
-- seals. Makes partitions when there is none to write to (a fresh install, or maintenance that has not run);
-- forgets one dropped or detached by hand.
CREATE OR REPLACE FUNCTION idempotency.write_partition(OUT part oid, OUT range_from timestamptz, OUT range_to timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    upto timestamptz;
    nm name;
BEGIN
    FOR attempt IN 1..5 LOOP
        upto := idempotency.sealed_until();
        SELECT p.partition, p.partition_name, p.range_from, p.range_to INTO part, nm, range_from, range_to
          FROM idempotency.partition_ranges p
         WHERE p.range_from OPERATOR(pg_catalog.>=) upto
         ORDER BY p.range_from LIMIT 1;
        IF part IS NULL OR range_from OPERATOR(pg_catalog.>) GREATEST(pg_catalog.now(), upto) THEN
            -- Nothing to write to, or a gap before the oldest unsealed partition that now (or the end of the
            -- seals) falls in: make them. A write partition that starts where the seals end is used as it is,
            -- even ahead of now (a round run as of a later time sealed early): making partitions here would
            -- hold the creation lock, and a maintenance round behind it, until this transaction ends.
            CONTINUE WHEN idempotency.premake_partitions(GREATEST(pg_catalog.now(), upto)) OPERATOR(pg_catalog.>) 0
                       OR part IS NULL;
        END IF;
        BEGIN
            EXECUTE pg_catalog.format('LOCK TABLE idempotency.%I IN ROW EXCLUSIVE MODE', nm);
        EXCEPTION WHEN undefined_table THEN
            PERFORM idempotency.sync_partition_ranges();   -- dropped by hand, or by maintenance just now
            CONTINUE;
        END;
        IF pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', nm))::oid IS DISTINCT FROM part THEN
            PERFORM idempotency.sync_partition_ranges();   -- dropped and made again under its name
            CONTINUE;
        END IF;
        -- A seal that committed while this waited moved sealed_upto past it: take the next one.
        IF idempotency.sealed_until() OPERATOR(pg_catalog.<) range_to THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idempotency: the partitions of idempotency.records kept changing while they were looked up'
        USING ERRCODE = '40001', HINT = 'The transaction should be retried.';
END
$$;

-- Seals a partition now: waits up to wait_ms for its writers (false, nothing done, when they take
-- longer; 0: as long as it takes). Only the oldest unsealed partition can be sealed, and only once its range is past.
CREATE OR REPLACE FUNCTION idempotency.seal_partition_within(part oid, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r idempotency.partition_ranges;
    saved text := pg_catalog.current_setting('lock_timeout');
BEGIN
    SELECT * INTO r FROM idempotency.partition_ranges p WHERE p.partition OPERATOR(pg_catalog.=) part;
    IF NOT FOUND OR EXISTS (SELECT FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) part) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM idempotency.partition_ranges p
                WHERE p.range_from OPERATOR(pg_catalog.<) r.range_from
                  AND NOT EXISTS (SELECT FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) p.partition)) THEN
        RAISE EXCEPTION 'idempotency: % is not the oldest unsealed partition', part::pg_catalog.regclass
            USING ERRCODE = '55000', HINT = 'Seal the partitions before it first.';
    END IF;
    IF NOT EXISTS (SELECT FROM idempotency.partition_ranges p WHERE p.range_from OPERATOR(pg_catalog.=) r.range_to) THEN
        RAISE EXCEPTION 'idempotency: no partition follows %: new rows would have nowhere to go', part::pg_catalog.regclass
            USING ERRCODE = '55000', HINT = 'Run idem_maintenance() first.';
    END IF;
    BEGIN
        PERFORM pg_catalog.set_config('lock_timeout', GREATEST(wait_ms, 0) OPERATOR(pg_catalog.||) 'ms', true);
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE', part::pg_catalog.regclass);
        PERFORM pg_catalog.set_config('lock_timeout', saved, true);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    -- Seen at once by every writer that waited for the lock above (a sequence is not transactional).
    PERFORM pg_catalog.setval('idempotency.sealed_upto',
        GREATEST((SELECT q.last_value FROM idempotency.sealed_upto q),
                            (EXTRACT(epoch FROM r.range_to) OPERATOR(pg_catalog.*) 1000000)::bigint));
    INSERT INTO idempotency.sealed (partition, partition_name, range_from, range_to)
    VALUES (part, r.partition_name, r.range_from, r.range_to);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.seal_partition(part oid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.check_writable('idempotency.seal_partition');
    -- Within the session's lock_timeout (0: as long as it takes).
    RETURN idempotency.seal_partition_within(part,
        (EXTRACT(epoch FROM pg_catalog.current_setting('lock_timeout')::interval) OPERATOR(pg_catalog.*) 1000)::integer);
END
$$;
COMMENT ON FUNCTION idempotency.seal_partition(oid) IS
'Seals a partition of idempotency.records now (no new rows go there; maintenance seals past ones itself); false if it was sealed or its writers took longer than lock_timeout. Pass ''idempotency.records_p2026_11_20''::regclass.';

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
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;

-- (0.8.0's sql/edition/ 25-maintenance.sql, as scripts/sql-edition --expand wrote it in)
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
-- (0.8.0's sql/edition/ 30-keys.sql, as scripts/sql-edition --expand wrote it in)
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
        IF (idempotency.cached_state()).probe_before OR (idempotency.cached_state()).probe_ahead THEN
            PERFORM FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) idem_claim.key AND x.scope OPERATOR(pg_catalog.=) idem_claim.scope
               AND (x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from
                    OR ((idempotency.cached_state()).probe_ahead AND x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to));
            elsewhere := FOUND;   -- (a duplicate: claim_one decides)
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
                      pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass)
                          OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto
                      AND (idempotency.cached_state()).upto OPERATOR(pg_catalog.=) ver
                 INTO outcome, idem_claim.token, idem_claim.attempts, idem_claim.expires_at, at_ctid, at_part, remembered, ok;
            IF ok THEN
                RETURN NEXT;
                RETURN;
            END IF;
            conflicted := ok IS NULL;   -- the key is in the write partition: claim_one reads it
            IF NOT conflicted THEN
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

-- (0.8.0's sql/edition/ 35-once.sql, as scripts/sql-edition --expand wrote it in)
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
        IF pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass) OPERATOR(pg_catalog.>=) st.w_to_us
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
        IF (idempotency.cached_state()).probe_before OR (idempotency.cached_state()).probe_ahead THEN
            PERFORM FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) idem_once.key AND x.scope OPERATOR(pg_catalog.=) idem_once.scope
               AND (x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from
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
                  pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass)
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
-- (0.8.0's sql/edition/ 40-batch.sql: idempotency.too_many_keys idempotency.check_keys idem_claim_batch idem_complete_batch idem_once_batch, as scripts/sql-edition --expand wrote it in)
-- The keys argument checked as the native extension checks it: NULL array or element 22004, more than
-- max_batch_keys 54000 (before any key is read), each key as idem_claim's.
CREATE OR REPLACE FUNCTION idempotency.too_many_keys(n integer, max_keys integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: batch has % keys, over the limit of %', n, max_keys
        USING ERRCODE = '54000', HINT = 'The limit is set by idempotency.max_batch_keys; split the batch.';
END
$$;

CREATE OR REPLACE FUNCTION idempotency.check_keys(keys text[], s idempotency.settings) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n integer := coalesce(pg_catalog.cardinality(keys), 0);
    bad text;
    found_bad boolean;
BEGIN
    IF keys IS NULL THEN
        RAISE EXCEPTION 'idempotency: keys must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF n OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        PERFORM idempotency.too_many_keys(n, s.max_batch_keys);
    END IF;
    -- One pass finds the first key check_ident would refuse; that key alone goes through it, for its error.
    SELECT true, u.k INTO found_bad, bad
      FROM pg_catalog.unnest(keys) WITH ORDINALITY AS u(k, i)
     WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) s.max_key_bytes
        OR u.k OPERATOR(pg_catalog.~) '[\u0001-\u001f\u007f-\u009f]'
     ORDER BY u.i LIMIT 1;
    IF found_bad THEN
        PERFORM idempotency.check_ident('key', bad, s.max_key_bytes);
    END IF;
END
$$;

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
             WHERE NOT ((idempotency.cached_state()).probe_before OR (idempotency.cached_state()).probe_ahead)
                OR NOT EXISTS (SELECT FROM idempotency.records x
                                WHERE x.key OPERATOR(pg_catalog.=) u.k AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope
                                  AND (x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from
                                       OR ((idempotency.cached_state()).probe_ahead
                                           AND x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to)))),
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
                OR pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass) OPERATOR(pg_catalog.<>) iver) THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
            DELETE FROM idempotency.records x USING ROWS FROM (pg_catalog.unnest(parts), pg_catalog.unnest(ctids)) AS d(part, row_ctid)
             WHERE x.tableoid OPERATOR(pg_catalog.=) d.part AND x.ctid OPERATOR(pg_catalog.=) d.row_ctid;
            answers := NULL; tokens := NULL;
            st := idempotency.call_state(NULL, true);
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

CREATE OR REPLACE FUNCTION idem_complete_batch(keys text[], payloads jsonb[] DEFAULT NULL, scope text DEFAULT 'default',
                                    tokens bigint[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_nestloop = off AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    size integer;
    n integer := coalesce(pg_catalog.cardinality(idem_complete_batch.keys), 0);
    one record;
    h record;
    done integer;
    done_keys text[];
    claimed text[];
BEGIN
    PERFORM idempotency.check_writable('idem_complete_batch');
    -- The size first, from the argument as it came: an array passed on in a query (check_keys) is copied.
    IF pg_catalog.cardinality(idem_complete_batch.keys) OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        size := pg_catalog.cardinality(idem_complete_batch.keys);
        PERFORM idempotency.too_many_keys(size, s.max_batch_keys);
    END IF;
    PERFORM idempotency.check_keys(idem_complete_batch.keys, s);
    PERFORM idempotency.check_ident('scope', idem_complete_batch.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_complete_batch.scope, s);
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
    -- of this transaction (the tokens idem_claim_batch and idem_claim remember). The others key by key, in
    -- key order: held_row finds them, or says why not.
    claimed := pg_catalog.string_to_array(pg_catalog.concat_ws(',',
                   pg_catalog.current_setting('idempotency_edition.claimed_batch', true),
                   pg_catalog.split_part(pg_catalog.current_setting('idempotency_edition.claimed_row', true), ' ', 1)), ',');
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
                    -- (a hashed subplan, built once: linear in the batch)
                    ELSE x.token::text IN (SELECT c.t FROM pg_catalog.unnest(claimed) AS c(t)) END
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
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        WITH written AS (
            INSERT INTO idempotency.records AS x (scope, key, status, attempts, created_at, updated_at)
            SELECT idem_once_batch.scope, d.k, 'completed', 1,
                   idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                   pg_catalog.now()
              FROM (SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k)) d
             WHERE NOT ((idempotency.cached_state()).probe_before OR (idempotency.cached_state()).probe_ahead)
                OR NOT EXISTS (SELECT FROM idempotency.records o
                                WHERE o.key OPERATOR(pg_catalog.=) d.k AND o.scope OPERATOR(pg_catalog.=) idem_once_batch.scope
                                  AND (o.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from
                                       OR ((idempotency.cached_state()).probe_ahead
                                           AND o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to)))
             ORDER BY d.k
            ON CONFLICT DO NOTHING
            RETURNING x.key, x.tableoid, x.ctid)
        SELECT pg_catalog.array_agg(wr.key), pg_catalog.array_agg(wr.tableoid), pg_catalog.array_agg(wr.ctid),
               (idempotency.cached_state()).upto
          INTO fresh, parts, ctids, iver FROM written wr;
        IF fresh IS NULL
           OR (iver OPERATOR(pg_catalog.=) st.upto
               AND pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass) OPERATOR(pg_catalog.=) iver) THEN
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
    IF slow THEN
        FOR k IN SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k) ORDER BY u.k LOOP
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
    RETURN QUERY
    SELECT v.k FROM (SELECT u.k, pg_catalog.min(u.i) AS i
                       FROM pg_catalog.unnest(idem_once_batch.keys) WITH ORDINALITY AS u(k, i)
                       JOIN pg_catalog.unnest(fresh) AS f(k) ON f.k OPERATOR(pg_catalog.=) u.k
                      GROUP BY u.k) v
     ORDER BY v.i;
END
$$;

-- (0.8.0's sql/edition/ 45-canonical.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: the RFC 8785 (JCS) canonical JSON that idem_fingerprint (50-derive.sql) hashes, the
-- same text as the native extension's and the client libraries' (clients/vectors.json).
--
-- Canonical JSON (RFC 8785) without recursion: one recursive CTE walks the document level by level
-- (PostgreSQL runs it as a loop over a work table) and gives each value a path of sort keys (object
-- members by their key's UTF-16 code units, array elements by index); the canonical text is its tokens
-- in path order. Nothing here recurses on the C stack, whatever the nesting.
-- The helpers are PL/pgSQL, not SQL: PL/pgSQL keeps their plans for the session, where a SQL function
-- called from PL/pgSQL is planned again at every call (measured: 1 ms a number that way, 4 us this way).
--
-- Numbers: a jsonb number (exact decimal) becomes the nearest IEEE double (numeric -> float8 is
-- correctly rounded), printed by ECMAScript's rules (JCS 3.2.2.3): -0 is 0, fixed notation from 1e-6 up
-- to 1e21, exponent notation (1e+21, 1.5e-7) outside. A number beyond the largest double is refused with
-- 22003; one that rounds to zero (below 2^-1075) is 0.

-- The sort key of an object member's key: JCS orders keys by UTF-16 code units. UTF-8 bytes order the
-- same way except that U+E000..U+FFFF (UTF-8 lead bytes EE, EF) come after U+10000.. (lead bytes F0..F4)
-- in UTF-8 and before them in UTF-16 (surrogates D800..DFFF). Mapping the lead bytes EE, EF to F5, F6
-- (never in UTF-8) puts them last, as in UTF-16. A key's bytes never start with FF, which closes a
-- container's path below.
CREATE OR REPLACE FUNCTION idempotency.jcs_key_order(k pg_catalog.text) RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (
    SELECT CASE WHEN pg_catalog.position(b, pg_catalog.decode('ee', 'hex')) OPERATOR(pg_catalog.=) 0
                 AND pg_catalog.position(b, pg_catalog.decode('ef', 'hex')) OPERATOR(pg_catalog.=) 0
                THEN b
                ELSE pg_catalog.convert_to(
                         pg_catalog.translate(pg_catalog.convert_from(b, 'LATIN1'),
                                              pg_catalog.chr(238) OPERATOR(pg_catalog.||) pg_catalog.chr(239),
                                              pg_catalog.chr(245) OPERATOR(pg_catalog.||) pg_catalog.chr(246)),
                         'LATIN1')
           END
      FROM (SELECT pg_catalog.convert_to(k, 'UTF8') AS b) s
    );
END
$$;

-- A jsonb number as JCS writes it (ECMAScript Number-to-String of the nearest double); NULL when it is
-- beyond the largest double (the caller raises). Needs extra_float_digits > 0 (idem_fingerprint sets 1).
CREATE OR REPLACE FUNCTION idempotency.jcs_number(x pg_catalog.numeric) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    v pg_catalog.float8;
    f pg_catalog.text;     -- float8out's text: with extra_float_digits > 0, PostgreSQL's Ryu
    ip pg_catalog.text;    -- its digits before the point
    raw pg_catalog.text;   -- all its digits
    d pg_catalog.text;     -- the shortest digits, no leading or trailing zeros
    k pg_catalog.int4;     -- length(d)
    n pg_catalog.int4;     -- the position of the decimal point: value = 0.d × 10^n
    c pg_catalog.text;
    best pg_catalog.text;
    best_gap pg_catalog.numeric;
    gap pg_catalog.numeric;
BEGIN
    IF x OPERATOR(pg_catalog.=) 0 THEN
        RETURN '0';
    END IF;
    -- Rounds to zero: at most 2^-1075, half the smallest subnormal (the tie goes to the even zero).
    IF pg_catalog.abs(x) OPERATOR(pg_catalog.<) 1e-323 AND pg_catalog.abs(x) OPERATOR(pg_catalog.<=) (
            '2.4703282292062327208828439643411068618252990130716238221279284125033775363510437593264991818081' OPERATOR(pg_catalog.||)
            '799618989828234772285886546332835517796989819938739800539093906315035659515570226392290858392449' OPERATOR(pg_catalog.||)
            '105184435931802849936536152500319370457678249219365623669863658480757001585769269903706311928279' OPERATOR(pg_catalog.||)
            '558551332927834338409351978015531246597263579574622766465272827220056374006485499977096599470454' OPERATOR(pg_catalog.||)
            '020828166226237857393450736339007967761930577506740176324673600968951340535537458516661134223766' OPERATOR(pg_catalog.||)
            '678604162159680461914467291840300530057530849048765391711386591646239524912623653881879636239373' OPERATOR(pg_catalog.||)
            '280423891018672348497668235089863388587925628302755995657524455507255189313690836254779186948667' OPERATOR(pg_catalog.||)
            '994968324049705821028513185451396213837722826145437693412532098591327667236328125E-324')::pg_catalog.numeric THEN
        RETURN '0';
    END IF;
    -- Rounds to infinity: at least 2^1024 - 2^970, halfway between the largest double and 2^1024.
    IF pg_catalog.abs(x) OPERATOR(pg_catalog.>) 1.79e308 AND pg_catalog.abs(x) OPERATOR(pg_catalog.>=) (
            '179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587' OPERATOR(pg_catalog.||)
            '207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711' OPERATOR(pg_catalog.||)
            '531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093' OPERATOR(pg_catalog.||)
            '042880177904174497792')::pg_catalog.numeric THEN
        RETURN NULL;
    END IF;
    v := pg_catalog.abs(x)::pg_catalog.float8;
    f := v::pg_catalog.text;
    ip := pg_catalog.split_part(pg_catalog.split_part(f, 'e', 1), '.', 1);
    raw := ip OPERATOR(pg_catalog.||) pg_catalog.split_part(pg_catalog.split_part(f, 'e', 1), '.', 2);
    d := pg_catalog.rtrim(pg_catalog.ltrim(raw, '0'), '0');
    k := pg_catalog.length(d);
    n := pg_catalog.length(ip) OPERATOR(pg_catalog.-)
         (pg_catalog.length(raw) OPERATOR(pg_catalog.-) pg_catalog.length(pg_catalog.ltrim(raw, '0')));
    IF pg_catalog.strpos(f, 'e') OPERATOR(pg_catalog.>) 0 THEN
        n := n OPERATOR(pg_catalog.+) pg_catalog.split_part(f, 'e', 2)::pg_catalog.int4;
    END IF;
    -- PostgreSQL's Ryu never takes a bound of the double's rounding interval, where ECMAScript does
    -- when the double's mantissa is even (1e23 is 9.999999999999999e+22 in PostgreSQL, 1e+23 in
    -- ECMAScript). A bound can be a shorter decimal only from 2^53 up (below, a bound has more digits
    -- than any double's shortest form): there, the first length j < k at which d cut down or rounded
    -- up reads back as the same double gives the digits; the closer to d wins, then the even one.
    IF v OPERATOR(pg_catalog.>=) 9007199254740992::pg_catalog.float8 THEN
        FOR j IN 1 .. k OPERATOR(pg_catalog.-) 1 LOOP
            FOREACH c IN ARRAY ARRAY[pg_catalog.left(d, j),
                                     (pg_catalog.left(d, j)::pg_catalog.numeric OPERATOR(pg_catalog.+) 1)::pg_catalog.text] LOOP
                -- c × 10^(n - j); above the largest double it is no double.
                IF (c OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) j)::pg_catalog.text)::pg_catalog.numeric
                       OPERATOR(pg_catalog.<=) 1.7976931348623158e308
                   AND (c OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) j)::pg_catalog.text)::pg_catalog.numeric::pg_catalog.float8
                       OPERATOR(pg_catalog.=) v THEN
                    gap := pg_catalog.abs((c OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) j)::pg_catalog.text)::pg_catalog.numeric
                                          OPERATOR(pg_catalog.-)
                                          (d OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) k)::pg_catalog.text)::pg_catalog.numeric);
                    IF best IS NULL OR gap OPERATOR(pg_catalog.<) best_gap
                       OR (gap OPERATOR(pg_catalog.=) best_gap
                           AND pg_catalog.right(c, 1)::pg_catalog.int4 OPERATOR(pg_catalog.%) 2 OPERATOR(pg_catalog.=) 0) THEN
                        best := c;
                        best_gap := gap;
                    END IF;
                END IF;
            END LOOP;
            IF best IS NOT NULL THEN
                n := pg_catalog.length(best) OPERATOR(pg_catalog.+) n OPERATOR(pg_catalog.-) j;
                d := pg_catalog.rtrim(best, '0');
                k := pg_catalog.length(d);
                EXIT;
            END IF;
        END LOOP;
    END IF;
    -- ECMAScript's Number::toString layout.
    IF n OPERATOR(pg_catalog.>=) k AND n OPERATOR(pg_catalog.<=) 21 THEN
        f := d OPERATOR(pg_catalog.||) pg_catalog.repeat('0', n OPERATOR(pg_catalog.-) k);
    ELSIF n OPERATOR(pg_catalog.>) 0 AND n OPERATOR(pg_catalog.<=) 21 THEN
        f := pg_catalog.left(d, n) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.substr(d, n OPERATOR(pg_catalog.+) 1);
    ELSIF n OPERATOR(pg_catalog.>) -6 AND n OPERATOR(pg_catalog.<=) 0 THEN
        f := '0.' OPERATOR(pg_catalog.||) pg_catalog.repeat('0', OPERATOR(pg_catalog.-) n) OPERATOR(pg_catalog.||) d;
    ELSE
        f := pg_catalog.left(d, 1)
             OPERATOR(pg_catalog.||) CASE WHEN k OPERATOR(pg_catalog.>) 1 THEN '.' OPERATOR(pg_catalog.||) pg_catalog.substr(d, 2) ELSE '' END
             OPERATOR(pg_catalog.||) CASE WHEN n OPERATOR(pg_catalog.>) 1 THEN 'e+' ELSE 'e-' END
             OPERATOR(pg_catalog.||) pg_catalog.abs(n OPERATOR(pg_catalog.-) 1)::pg_catalog.text;
    END IF;
    RETURN CASE WHEN x OPERATOR(pg_catalog.<) 0 THEN '-' ELSE '' END OPERATOR(pg_catalog.||) f;
END
$$;

-- The JCS text of a document, iteratively (see the top of this file). Each value is a row: its path (one
-- sort key per level: a member's key order, an element's index as 4 big-endian bytes), its text (a
-- member's "key": prefix, a comma unless it comes first, then the scalar or the opening bracket); each
-- container adds its closing bracket at path || FF, after all its members. NULL when a number is beyond
-- the largest double.
CREATE OR REPLACE FUNCTION idempotency.jcs_text(document pg_catalog.jsonb) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (
    WITH RECURSIVE node(path, prefix, kind, val) AS (
        SELECT ARRAY[]::pg_catalog.bytea[], '', pg_catalog.jsonb_typeof(document), document
      UNION ALL
        SELECT n.path OPERATOR(pg_catalog.||) c.sk, c.prefix, pg_catalog.jsonb_typeof(c.val), c.val
          FROM node n,
               LATERAL (
                   SELECT o.sk,
                          CASE WHEN pg_catalog.row_number() OVER (ORDER BY o.sk) OPERATOR(pg_catalog.=) 1 THEN '' ELSE ',' END
                              OPERATOR(pg_catalog.||) pg_catalog.to_json(o.key)::pg_catalog.text
                              OPERATOR(pg_catalog.||) ':' AS prefix,
                          o.val
                     FROM (SELECT idempotency.jcs_key_order(e.key) AS sk, e.key, e.value AS val
                             FROM pg_catalog.jsonb_each(CASE WHEN n.kind OPERATOR(pg_catalog.=) 'object'
                                                             THEN n.val ELSE '{}'::pg_catalog.jsonb END) e) o
                   UNION ALL
                   SELECT pg_catalog.int4send(a.i::pg_catalog.int4),
                          CASE WHEN a.i OPERATOR(pg_catalog.=) 1 THEN '' ELSE ',' END,
                          a.value
                     FROM pg_catalog.jsonb_array_elements(CASE WHEN n.kind OPERATOR(pg_catalog.=) 'array'
                                                               THEN n.val ELSE '[]'::pg_catalog.jsonb END)
                          WITH ORDINALITY a(value, i)
               ) c
         WHERE n.kind OPERATOR(pg_catalog.=) 'object' OR n.kind OPERATOR(pg_catalog.=) 'array'
    )
    SELECT CASE WHEN pg_catalog.bool_and(t.tok IS NOT NULL)
                THEN pg_catalog.string_agg(t.tok, '' ORDER BY t.path) END
      FROM (SELECT n.path,
                   n.prefix OPERATOR(pg_catalog.||) CASE n.kind
                       WHEN 'object' THEN '{'
                       WHEN 'array' THEN '['
                       WHEN 'number' THEN idempotency.jcs_number(n.val::pg_catalog.numeric)
                       ELSE n.val::pg_catalog.text   -- a string (jsonb escapes as JCS does), true, false, null
                   END AS tok
              FROM node n
            UNION ALL
            SELECT n.path OPERATOR(pg_catalog.||) pg_catalog.decode('ff', 'hex'),
                   CASE n.kind WHEN 'object' THEN '}' ELSE ']' END
              FROM node n
             WHERE n.kind OPERATOR(pg_catalog.=) 'object' OR n.kind OPERATOR(pg_catalog.=) 'array') t
    );
END
$$;

REVOKE ALL ON FUNCTION idempotency.jcs_key_order(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.jcs_number(pg_catalog.numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.jcs_text(pg_catalog.jsonb) FROM PUBLIC;
-- (0.8.0's sql/edition/ 50-derive.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: idem_key and idem_fingerprint, the key and request fingerprint a client derives from a
-- message. They give the native extension's values (src/api/derive.rs) and the client libraries' (the
-- shared vectors in clients/vectors.json), with the same arguments, defaults, SQLSTATEs and messages.
--
-- Hashes.
--   SHA-256 is PostgreSQL's own pg_catalog.sha256(bytea) (PostgreSQL 11 and later).
--   SHA-1, which a version-5 UUID needs, is not built in: it comes from pgcrypto's digest(), which every
--   managed service offers and the edition's install script creates (CREATE EXTENSION IF NOT EXISTS
--   pgcrypto). pgcrypto may live in any schema (public, or extensions as on Supabase), and
--   @extschema:pgcrypto@ needs PostgreSQL 16, so idem_key is created by the DO block below, which looks
--   up pgcrypto's schema in pg_extension and writes it, quoted, into the body: no search_path lookup at
--   call time, and no SHA-1 of our own (a PL/pgSQL SHA-1 would cost a hundred times pgcrypto's). Moving
--   pgcrypto to another schema afterwards (ALTER EXTENSION pgcrypto SET SCHEMA) needs this file run again.
--
-- Privileges and search_path.
--   idem_fingerprint reads its size limit through idempotency.setting_int, in the schema consumers have
--   no USAGE on, so it is SECURITY DEFINER, and therefore pins search_path = pg_catalog, pg_temp.
--   idem_key is SECURITY DEFINER too: it runs pgcrypto's digest as the edition's owner, so a consumer
--   needs no USAGE on pgcrypto's schema (Supabase grants its extensions schema to its own roles only).
--   Both qualify every function, operator and type anyway (pg_catalog.…, OPERATOR(pg_catalog.…)), as the
--   rest of the edition does; neither could be inlined in any case (PL/pgSQL).
--   idem_fingerprint also sets extra_float_digits = 1: PostgreSQL then prints a double's shortest
--   round-trip digits (its Ryu), the digits ECMAScript's Number-to-String uses, whatever the session set.
--
-- Linear in the input: the work grows with the size of the arguments, never with its square (tested in
-- tests/torture/badinput_size.py; benches/input-size measures it). idem_key writes its name by appending
-- each part's piece to an array in place (up to 32 parts), or by one string_agg over the parts: adding each
-- part to a bytea copies the name so far (100,000 parts took 16 s). idem_fingerprint looks each distinct
-- path up once: a walk, level by level, over the distinct prefixes of the paths finds the values they reach
-- (an object's member by its key, an array's element by its index), each value on the way looked at once
-- however many paths pass through it; then #> fetches each path's value from the document, copying only
-- that value (-> step by step copies every container on the way, for every path); the object of the values
-- is built once, by jsonb_object_agg (|| in a loop copies it at every path). What stays is the contract's
-- own size: a path spelled n ways ('/~' and '/~0' name one member) puts its value n times into what is
-- hashed, here as in the native extension and the client libraries. The canonical JSON (45-canonical.sql)
-- is one walk of the document and one sort of its values.

-- Depth: a document nested more than 100 levels deep (arrays and objects; a scalar is level 0, [] and {}
-- are 1) is refused with 54000, as the native extension refuses it (its JSON parser recurses). Checked by
-- one jsonpath query that looks no deeper than level 100.

-- idem_key: see the top of this file for why it is written through a DO block.
DO $do$
DECLARE
    pgcrypto_schema pg_catalog.name;
BEGIN
    SELECT n.nspname INTO pgcrypto_schema
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'pgcrypto';
    IF pgcrypto_schema IS NULL THEN
        RAISE EXCEPTION 'idempotency: the SQL edition needs pgcrypto for idem_key'
            USING ERRCODE = '55000', HINT = 'CREATE EXTENSION pgcrypto; then run the install again.';
    END IF;
    EXECUTE pg_catalog.replace($fn$
CREATE OR REPLACE FUNCTION idem_key(namespace pg_catalog.uuid, VARIADIC parts pg_catalog.text[]) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    utf8 pg_catalog.bool := pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.=) 'UTF8';
    part pg_catalog.text;
    pieces pg_catalog.text[] := '{}';
    seps pg_catalog.text[];
    first_part pg_catalog.text;
    has_null pg_catalog.bool;
    subject_name pg_catalog.text;
    hash pg_catalog.bytea;
BEGIN
    IF namespace IS NULL THEN
        RAISE EXCEPTION 'idempotency: namespace must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF parts IS NULL THEN
        RAISE EXCEPTION 'idempotency: parts must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF pg_catalog.cardinality(parts) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'idempotency: idem_key needs at least one part' USING ERRCODE = '22023';
    END IF;
    -- The name: each part as <UTF-8 length>:<bytes>; (see "Linear in the input" above).
    IF pg_catalog.cardinality(parts) OPERATOR(pg_catalog.<=) 32 THEN
        -- A message's few parts: a loop costs least. Each piece is appended to an array in place, and the
        -- pieces joined once.
        FOREACH part IN ARRAY parts LOOP
            IF part IS NULL THEN
                RAISE EXCEPTION 'idempotency: part must not be NULL' USING ERRCODE = '22004';
            END IF;
            pieces := pg_catalog.array_append(pieces,
                CASE WHEN utf8 THEN pg_catalog.octet_length(part)
                     ELSE pg_catalog.octet_length(pg_catalog.convert_to(part, 'UTF8')) END::pg_catalog.text
                OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) part OPERATOR(pg_catalog.||) ';');
        END LOOP;
        subject_name := pg_catalog.array_to_string(pieces, '');
    ELSE
        IF pg_catalog.array_ndims(parts) OPERATOR(pg_catalog.=) 1 THEN
            has_null := pg_catalog.array_position(parts, NULL) IS NOT NULL;
            first_part := parts[pg_catalog.array_lower(parts, 1)];
        ELSE   -- VARIADIC ARRAY[[...]]: its parts in their order, as unnest gives them
            SELECT EXISTS (SELECT FROM (SELECT pg_catalog.unnest(parts) AS p) u WHERE u.p IS NULL),
                   (SELECT u.p FROM (SELECT pg_catalog.unnest(parts) AS p) u LIMIT 1)
              INTO has_null, first_part;
        END IF;
        IF has_null THEN
            RAISE EXCEPTION 'idempotency: part must not be NULL' USING ERRCODE = '22004';
        END IF;
        -- Many parts: one string_agg, whose delimiter before each part but the first is ';<its length>:',
        -- taken from seps when the part is shorter than 64 bytes (no number printed). The rows of unnest in
        -- a select list come in the array's order, and nothing between reorders them.
        seps := '{";0:",";1:",";2:",";3:",";4:",";5:",";6:",";7:",";8:",";9:",";10:",";11:",";12:",";13:",";14:",'
            '";15:",";16:",";17:",";18:",";19:",";20:",";21:",";22:",";23:",";24:",";25:",";26:",";27:",'
            '";28:",";29:",";30:",";31:",";32:",";33:",";34:",";35:",";36:",";37:",";38:",";39:",";40:",'
            '";41:",";42:",";43:",";44:",";45:",";46:",";47:",";48:",";49:",";50:",";51:",";52:",";53:",'
            '";54:",";55:",";56:",";57:",";58:",";59:",";60:",";61:",";62:",";63:"}';
        SELECT CASE WHEN utf8 THEN pg_catalog.octet_length(first_part)
                    ELSE pg_catalog.octet_length(pg_catalog.convert_to(first_part, 'UTF8')) END::pg_catalog.text
               OPERATOR(pg_catalog.||) ':'
               OPERATOR(pg_catalog.||) pg_catalog.string_agg(u.p, coalesce(seps[u.n OPERATOR(pg_catalog.+) 1],
                   ';' OPERATOR(pg_catalog.||) u.n::pg_catalog.text OPERATOR(pg_catalog.||) ':'))
               OPERATOR(pg_catalog.||) ';'
          INTO subject_name
          FROM (SELECT v.p, CASE WHEN utf8 THEN pg_catalog.octet_length(v.p)
                                 ELSE pg_catalog.octet_length(pg_catalog.convert_to(v.p, 'UTF8')) END AS n
                  FROM (SELECT pg_catalog.unnest(parts) AS p) v) u;
    END IF;
    -- RFC 4122 version 5: SHA-1 of the namespace's 16 bytes and the name, first 16 bytes, version 5 in
    -- the high nibble of byte 6, variant 10 in the high bits of byte 8.
    hash := @pgcrypto@.digest(pg_catalog.uuid_send(namespace) OPERATOR(pg_catalog.||) pg_catalog.convert_to(subject_name, 'UTF8'), 'sha1');
    hash := pg_catalog.set_byte(hash, 6, (pg_catalog.get_byte(hash, 6) OPERATOR(pg_catalog.&) 15) OPERATOR(pg_catalog.|) 80);
    hash := pg_catalog.set_byte(hash, 8, (pg_catalog.get_byte(hash, 8) OPERATOR(pg_catalog.&) 63) OPERATOR(pg_catalog.|) 128);
    RETURN pg_catalog.encode(pg_catalog.substr(hash, 1, 16), 'hex')::pg_catalog.uuid::pg_catalog.text;
END
$$
$fn$, '@pgcrypto@', pg_catalog.quote_ident(pgcrypto_schema));
END
$do$;

REVOKE ALL ON FUNCTION idem_key(pg_catalog.uuid, pg_catalog.text[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_fingerprint(document pg_catalog.jsonb, VARIADIC paths pg_catalog.text[] DEFAULT '{}')
RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET extra_float_digits = 1 AS $$
DECLARE
    doc pg_catalog.jsonb;
    subject pg_catalog.jsonb;
    bad pg_catalog.text;
    canonical pg_catalog.text;
BEGIN
    IF document IS NULL THEN
        RAISE EXCEPTION 'idempotency: document must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- Within idempotency.max_payload_bytes before anything else, measured as the native extension measures it.
    PERFORM idempotency.check_document('document', document, idempotency.setting_int('max_payload_bytes')::integer);
    -- At most 100 levels of arrays and objects: is there a container at level 100 (the root is level 0)?
    IF pg_catalog.jsonb_path_exists(document,
           'strict $.**{100} ? (@.type() == "object" || @.type() == "array")') THEN
        RAISE EXCEPTION 'idempotency: document is nested more than 100 levels deep'
            USING ERRCODE = '54000', HINT = 'Arrays and objects may nest at most 100 levels deep in a fingerprinted document.';
    END IF;
    IF paths IS NULL THEN
        RAISE EXCEPTION 'idempotency: paths must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF EXISTS (SELECT FROM (SELECT pg_catalog.unnest(paths) AS p) u WHERE u.p IS NULL) THEN
        RAISE EXCEPTION 'idempotency: path must not be NULL' USING ERRCODE = '22004';
    END IF;

    IF pg_catalog.cardinality(paths) OPERATOR(pg_catalog.=) 0 THEN
        subject := document;
    ELSE
        -- The first path (in the order given) that is not a JSON Pointer.
        SELECT u.p INTO bad
          FROM (SELECT pg_catalog.unnest(paths) AS p, pg_catalog.generate_series(1, pg_catalog.cardinality(paths)) AS i) u
         WHERE u.p OPERATOR(pg_catalog.<>) '' AND NOT pg_catalog.starts_with(u.p, '/')
         ORDER BY u.i LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'idempotency: path % is not a JSON Pointer (RFC 6901): it must be empty or start with ''/''',
                -- Quoted as the native message quotes it (Rust's {:?}).
                '"' OPERATOR(pg_catalog.||) pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                    pg_catalog.replace(bad, E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t')
                OPERATOR(pg_catalog.||) '"'
                USING ERRCODE = '22023';
        END IF;
        -- An object of each JSON Pointer (as written) to its value, JSON null where there is none, each path
        -- looked up once (see "Linear in the input" above).
        doc := document OPERATOR(pg_catalog.#>) '{}'::pg_catalog.text[];   -- detoasted once, not at each lookup
        WITH RECURSIVE
        given AS (   -- each path, with its reference tokens (~1 is '/', then ~0 is '~'): the first 101 only, as
                     -- no value lies deeper than level 100
            SELECT d.p, pg_catalog.array_agg(pg_catalog.replace(pg_catalog.replace(t.tok, '~1', '/'), '~0', '~')
                                             ORDER BY t.i) AS toks
              FROM (SELECT DISTINCT u.p FROM (SELECT pg_catalog.unnest(paths) AS p) u
                     WHERE u.p OPERATOR(pg_catalog.<>) '') d,
                   pg_catalog.unnest((pg_catalog.string_to_array(d.p, '/'))[2:102]) WITH ORDINALITY t(tok, i)
             GROUP BY d.p
        ),
        step AS (    -- each prefix of a path (its first i - 1 tokens), the next token, and the two together
            SELECT DISTINCT g.toks[1:i OPERATOR(pg_catalog.-) 1] AS parent, g.toks[i] AS tok, g.toks[1:i] AS child
              FROM given g, pg_catalog.generate_subscripts(g.toks, 1) i
        ),
        node(at, kind) AS (   -- the values the paths reach, level by level: an object's member by its key, an
                              -- array's element by an index that is 0 or digits without a leading 0
            SELECT '{}'::pg_catalog.text[], pg_catalog.jsonb_typeof(doc)
          UNION ALL
            SELECT s.child, pg_catalog.jsonb_typeof(doc OPERATOR(pg_catalog.#>) s.child)
              FROM node n JOIN step s ON s.parent OPERATOR(pg_catalog.=) n.at
             WHERE n.kind OPERATOR(pg_catalog.=) 'object'
                OR (n.kind OPERATOR(pg_catalog.=) 'array' AND s.tok OPERATOR(pg_catalog.~) '^(0|[1-9][0-9]{0,8})$')
        )
        SELECT pg_catalog.jsonb_object_agg(v.p, v.val) INTO subject
          FROM (SELECT g.p, CASE WHEN n.kind IS NULL THEN 'null'::pg_catalog.jsonb
                                 ELSE doc OPERATOR(pg_catalog.#>) g.toks END AS val
                  FROM given g LEFT JOIN node n ON n.at OPERATOR(pg_catalog.=) g.toks
                UNION ALL
                SELECT '', doc WHERE '' OPERATOR(pg_catalog.=) ANY (paths)) v;
    END IF;

    canonical := idempotency.jcs_text(subject);
    IF canonical IS NULL THEN
        RAISE EXCEPTION 'idempotency: document holds a number beyond the range of an IEEE double'
            USING ERRCODE = '22003';
    END IF;
    RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(canonical, 'UTF8')), 'hex');
END
$$;

REVOKE ALL ON FUNCTION idem_fingerprint(pg_catalog.jsonb, pg_catalog.text[]) FROM PUBLIC;
-- (0.8.0's sql/edition/ 60-offsets.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: broker positions stored in the consumer's own transaction (the native extension's
-- src/api/offsets.rs and src/storage/offsets.rs). One row per (consumer_group, topic, partition) in
-- idempotency.offsets. Writers of one partition's position serialize on its row: the row is locked
-- (SELECT ... FOR UPDATE) or created (INSERT ... ON CONFLICT DO NOTHING, which waits for a concurrent
-- inserter) before it is decided on, so the second writer sees the first one's result. Under REPEATABLE
-- READ and SERIALIZABLE, PostgreSQL itself raises 40001 when the row was changed (or inserted) by a
-- transaction the snapshot cannot see.


-- The checks of a position, in the native order: the group (checked and authorized), the topic, the
-- partition (22004 when NULL, 22023 when negative).
CREATE OR REPLACE FUNCTION idempotency.check_position(consumer_group text, topic text, partition integer,
                                           s idempotency.settings) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM idempotency.check_ident('consumer_group', check_position.consumer_group, s.max_key_bytes);
    PERFORM idempotency.authorize('group', check_position.consumer_group, s);
    PERFORM idempotency.check_ident('topic', check_position.topic, s.max_key_bytes);
    PERFORM idempotency.check_required('partition', check_position.partition);
    IF check_position.partition OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'idempotency: partition must not be negative, got %', check_position.partition
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- 22023 for a negative offset or generation (NULL passes: the caller decides whether it may be NULL).
CREATE OR REPLACE FUNCTION idempotency.check_non_negative(what text, value bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'idempotency: % must not be negative, got %', what, value USING ERRCODE = '22023';
    END IF;
END
$$;

-- Locks the position's row, creating it from (init, init_generation) when absent. existed is false when
-- the row was just created (then next_offset and generation are NULL), true with the stored values
-- when it existed.
CREATE OR REPLACE FUNCTION idempotency.lock_offset(g text, t text, p integer, init bigint, init_generation bigint,
                                        OUT existed boolean, OUT next_offset bigint, OUT generation bigint)
LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        SELECT o.next_offset, o.generation INTO lock_offset.next_offset, lock_offset.generation
          FROM idempotency.offsets o
         WHERE o.consumer_group OPERATOR(pg_catalog.=) g AND o.topic OPERATOR(pg_catalog.=) t
           AND o.partition OPERATOR(pg_catalog.=) p
           FOR UPDATE;
        IF FOUND THEN
            lock_offset.existed := true;
            RETURN;
        END IF;
        INSERT INTO idempotency.offsets AS o (consumer_group, topic, partition, next_offset, generation, updated_at)
        VALUES (g, t, p, init, init_generation, pg_catalog.clock_timestamp())
        ON CONFLICT (consumer_group, topic, partition) DO NOTHING;
        IF FOUND THEN
            lock_offset.existed := false;
            RETURN;
        END IF;
        -- Another transaction inserted it concurrently and committed: lock its row.
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION idem_record_offset(consumer_group text, topic text, partition integer, processed_offset bigint,
                                   generation bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    nxt bigint;
    cur record;
    new_generation bigint;
    advances boolean;
BEGIN
    PERFORM idempotency.check_writable('idem_record_offset');
    PERFORM idempotency.check_position(idem_record_offset.consumer_group, idem_record_offset.topic,
                                       idem_record_offset.partition, s);
    PERFORM idempotency.check_non_negative('processed_offset', idem_record_offset.processed_offset);
    PERFORM idempotency.check_required('processed_offset', idem_record_offset.processed_offset);
    PERFORM idempotency.check_non_negative('generation', idem_record_offset.generation);
    IF idem_record_offset.processed_offset OPERATOR(pg_catalog.=) 9223372036854775807::bigint THEN
        RAISE EXCEPTION 'idempotency: processed_offset % is out of range', idem_record_offset.processed_offset
            USING ERRCODE = '22003';
    END IF;
    nxt := idem_record_offset.processed_offset OPERATOR(pg_catalog.+) 1::bigint;
    cur := idempotency.lock_offset(idem_record_offset.consumer_group, idem_record_offset.topic,
                                   idem_record_offset.partition, nxt, idem_record_offset.generation);
    IF NOT cur.existed THEN
        RETURN true;
    END IF;
    IF cur.generation IS NOT NULL AND idem_record_offset.generation IS NOT NULL
       AND idem_record_offset.generation OPERATOR(pg_catalog.<) cur.generation THEN
        RAISE EXCEPTION 'idempotency: consumer fenced on group % topic % partition %: generation % is older than the stored generation %',
            idempotency.quoted(idem_record_offset.consumer_group), idempotency.quoted(idem_record_offset.topic),
            idem_record_offset.partition, idem_record_offset.generation, cur.generation
            USING ERRCODE = '55006',
                  HINT = 'A newer member of the consumer group owns this partition; abandon this transaction.';
    END IF;
    new_generation := coalesce(idem_record_offset.generation, cur.generation);
    advances := nxt OPERATOR(pg_catalog.>) cur.next_offset;
    IF advances OR new_generation IS DISTINCT FROM cur.generation THEN
        UPDATE idempotency.offsets o
           SET next_offset = pg_catalog.int8larger(cur.next_offset, nxt), generation = new_generation,
               updated_at = pg_catalog.clock_timestamp()
         WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_record_offset.consumer_group
           AND o.topic OPERATOR(pg_catalog.=) idem_record_offset.topic
           AND o.partition OPERATOR(pg_catalog.=) idem_record_offset.partition;
    END IF;
    RETURN advances;
END
$$;
REVOKE ALL ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_next_offset(consumer_group text, topic text, partition integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    nxt bigint;
BEGIN
    PERFORM idempotency.check_position(idem_next_offset.consumer_group, idem_next_offset.topic,
                                       idem_next_offset.partition, s);
    SELECT o.next_offset INTO nxt FROM idempotency.offsets o
     WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_next_offset.consumer_group
       AND o.topic OPERATOR(pg_catalog.=) idem_next_offset.topic
       AND o.partition OPERATOR(pg_catalog.=) idem_next_offset.partition;
    RETURN nxt;
END
$$;
REVOKE ALL ON FUNCTION idem_next_offset(text, text, integer) FROM PUBLIC;

-- The checks of idem_offsets (a LANGUAGE sql function: PL/pgSQL refuses its argument topic, named as its
-- result column topic).
CREATE OR REPLACE FUNCTION idempotency.check_offsets_args(consumer_group text, topic text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    PERFORM idempotency.check_ident('consumer_group', check_offsets_args.consumer_group, s.max_key_bytes);
    PERFORM idempotency.authorize('group', check_offsets_args.consumer_group, s);
    IF check_offsets_args.topic IS NOT NULL THEN
        PERFORM idempotency.check_ident('topic', check_offsets_args.topic, s.max_key_bytes);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idem_offsets(consumer_group text, topic text DEFAULT NULL)
RETURNS TABLE (topic text, partition integer, next_offset bigint, generation bigint, updated_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT idempotency.check_offsets_args(idem_offsets.consumer_group, idem_offsets.topic);
SELECT o.topic::text, o.partition, o.next_offset, o.generation, o.updated_at
  FROM idempotency.offsets o
 WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_offsets.consumer_group
   AND (idem_offsets.topic IS NULL OR o.topic OPERATOR(pg_catalog.=) idem_offsets.topic)
 ORDER BY o.topic, o.partition;
$$;
REVOKE ALL ON FUNCTION idem_offsets(text, text) FROM PUBLIC;

-- For the edition's owner (the DBA): not granted to idempotency_consumer nor idempotency_admin, as in the
-- native extension, where it stays with the superuser.
CREATE OR REPLACE FUNCTION idem_reset_offset(consumer_group text, topic text, partition integer, next_offset bigint,
                                  generation bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    cur record;
BEGIN
    PERFORM idempotency.check_writable('idem_reset_offset');
    PERFORM idempotency.check_position(idem_reset_offset.consumer_group, idem_reset_offset.topic,
                                       idem_reset_offset.partition, s);
    PERFORM idempotency.check_non_negative('next_offset', idem_reset_offset.next_offset);
    PERFORM idempotency.check_required('next_offset', idem_reset_offset.next_offset);
    PERFORM idempotency.check_non_negative('generation', idem_reset_offset.generation);
    cur := idempotency.lock_offset(idem_reset_offset.consumer_group, idem_reset_offset.topic,
                                   idem_reset_offset.partition, idem_reset_offset.next_offset,
                                   idem_reset_offset.generation);
    IF cur.existed THEN
        -- NULL keeps the stored generation; a value replaces it, lower or higher (a zombie's huge
        -- generation is undone here).
        UPDATE idempotency.offsets o
           SET next_offset = idem_reset_offset.next_offset,
               generation = coalesce(idem_reset_offset.generation, cur.generation),
               updated_at = pg_catalog.clock_timestamp()
         WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_reset_offset.consumer_group
           AND o.topic OPERATOR(pg_catalog.=) idem_reset_offset.topic
           AND o.partition OPERATOR(pg_catalog.=) idem_reset_offset.partition;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) FROM PUBLIC;
-- (0.8.0's sql/edition/ 70-admin.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: what a DBA does by hand. Dead letters and keys (redrive, forget: src/storage/admin.rs).
-- Scope and consumer-group grants are the native extension's functions of sql/grants.sql, named in the
-- manifest (its table is in 00-storage.sql, without the trigger: here idempotency.authorize reads
-- idempotency.scope_grants at each call); observability: 80-observe.sql.

-------------------------------------------------------------------------------------------------------------
-- Dead letters and keys by hand. Each locks the key's row (SELECT ... FOR UPDATE) before deciding, as every
-- writer of an existing row does (idem_claim's takeover, idem_complete, idem_fail, idem_heartbeat): a
-- consumer completing or failing the key right now is waited for, and the decision is taken on the row it
-- left (under READ COMMITTED, the latest version; under REPEATABLE READ a row changed since the snapshot
-- raises 40001). A key has at most one row, in one partition of idempotency.records.
-------------------------------------------------------------------------------------------------------------

-- Locks the row of a key for idem_redrive and idem_forget; its status, or NULL when the key has no row.
-- A claim of a new key that is still in progress has a row this transaction cannot see yet: to wait for
-- it, as the native extension's key lock does, a probe row of the key is inserted into the write
-- partition (where every new key goes, and which no seal can change under an open writer) with ON
-- CONFLICT DO NOTHING, which waits for that claim's transaction, then rolled back at once; the row is
-- then looked for again, and found if the claim committed. (Under REPEATABLE READ, a row committed after
-- the snapshot makes the probe raise 40001, as PostgreSQL does for any ON CONFLICT meeting an invisible
-- row.)
CREATE OR REPLACE FUNCTION idempotency.lock_key(k text, sc text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text;
    w record;
BEGIN
    SELECT x.status INTO st FROM idempotency.records x
     WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
       FOR UPDATE;
    IF FOUND THEN
        RETURN st;
    END IF;
    w := idempotency.write_partition();
    BEGIN
        INSERT INTO idempotency.records (scope, key, status, created_at, updated_at)
        VALUES (sc, k, 'pending',
                LEAST(GREATEST(pg_catalog.now(), w.range_from),
                      w.range_to OPERATOR(pg_catalog.-) '1 microsecond'::interval),
                pg_catalog.now())
        ON CONFLICT DO NOTHING;
        RAISE SQLSTATE 'IDPRB';   -- undoes the probe row, if it was inserted
    EXCEPTION WHEN SQLSTATE 'IDPRB' THEN
        NULL;
    END;
    SELECT x.status INTO st FROM idempotency.records x
     WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
       FOR UPDATE;
    RETURN st;
END
$$;

-- Redrives one key: true when it was failed and is now released with its attempts counted from zero (the
-- next claim takes it at once as attempt 1; the error stays, for the record); false when it is not failed.
-- A key without a record: P0002 when must_exist, else false.
CREATE OR REPLACE FUNCTION idempotency.redrive_one(k text, sc text, must_exist boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    st text := idempotency.lock_key(k, sc);
BEGIN
    IF st IS NULL THEN
        IF must_exist THEN
            RAISE EXCEPTION 'idempotency: key % in scope % does not exist', idempotency.quoted(k), idempotency.quoted(sc)
                USING ERRCODE = 'P0002',
                      HINT = 'Only a key with a record can be redriven; idempotency.dead_letters lists the failed keys of each scope.';
        END IF;
        RETURN false;
    END IF;
    IF st OPERATOR(pg_catalog.<>) 'failed' THEN
        RETURN false;
    END IF;
    UPDATE idempotency.records x
       SET status = 'pending', token = NULL, attempts = 0, updated_at = pg_catalog.clock_timestamp(),
           expires_at = pg_catalog.clock_timestamp()
     WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION idem_redrive(key text, scope text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    PERFORM idempotency.check_writable('idem_redrive');
    PERFORM idempotency.check_ident('key', idem_redrive.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_redrive.scope, s.max_key_bytes);
    RETURN idempotency.redrive_one(idem_redrive.key, idem_redrive.scope, true);
END
$$;
REVOKE ALL ON FUNCTION idem_redrive(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_redrive_scope(scope text, failed_since timestamptz DEFAULT NULL, max_keys integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    k text;
    n bigint := 0;
BEGIN
    PERFORM idempotency.check_writable('idem_redrive_scope');
    PERFORM idempotency.check_ident('scope', idem_redrive_scope.scope, s.max_key_bytes);
    PERFORM idempotency.check_required('max_keys', idem_redrive_scope.max_keys);
    IF idem_redrive_scope.max_keys OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'idempotency: max_keys must be at least 1, not %', idem_redrive_scope.max_keys
            USING ERRCODE = '22023';
    END IF;
    IF idem_redrive_scope.max_keys OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        RAISE EXCEPTION 'idempotency: batch has % keys, over the limit of %', idem_redrive_scope.max_keys, s.max_batch_keys
            USING ERRCODE = '54000', HINT = 'The limit is set by idempotency.max_batch_keys; split the batch.';
    END IF;
    -- Candidates only, in key order: each is checked again under its row lock, held until the transaction
    -- ends (hence the bound). A candidate forgotten meanwhile is skipped.
    FOR k IN
        SELECT x.key FROM idempotency.records x
         WHERE x.scope OPERATOR(pg_catalog.=) idem_redrive_scope.scope
           AND x.status OPERATOR(pg_catalog.=) 'failed'
           AND (idem_redrive_scope.failed_since IS NULL
                OR x.updated_at OPERATOR(pg_catalog.>=) idem_redrive_scope.failed_since)
         ORDER BY x.key
         LIMIT idem_redrive_scope.max_keys
    LOOP
        IF idempotency.redrive_one(k, idem_redrive_scope.scope, false) THEN
            n := n OPERATOR(pg_catalog.+) 1::bigint;
        END IF;
    END LOOP;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION idem_redrive_scope(text, timestamptz, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_forget(key text, scope text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    PERFORM idempotency.check_writable('idem_forget');
    PERFORM idempotency.check_ident('key', idem_forget.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_forget.scope, s.max_key_bytes);
    IF idempotency.lock_key(idem_forget.key, idem_forget.scope) IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM idempotency.records x
     WHERE x.key OPERATOR(pg_catalog.=) idem_forget.key AND x.scope OPERATOR(pg_catalog.=) idem_forget.scope;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION idem_forget(text, text) FROM PUBLIC;

-------------------------------------------------------------------------------------------------------------
-- (0.8.0's sql/edition/ ../grants.sql: idempotency.grant_pattern idem_grant_scope idem_revoke_scope idem_grant_group idem_revoke_group, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idempotency.grant_pattern(grantee regrole, kind text, pattern text, revoke boolean)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    done boolean;
BEGIN
    IF grantee IS NULL OR pattern IS NULL THEN
        RAISE EXCEPTION 'idempotency: role and % must not be NULL', kind USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pattern = '' THEN
        RAISE EXCEPTION 'idempotency: % must not be empty', kind
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Grant ''*'' for every name.';
    END IF;
    IF revoke THEN
        DELETE FROM idempotency.scope_grants g WHERE g.role = grantee AND g.kind = grant_pattern.kind
                                                 AND g.pattern = grant_pattern.pattern;
    ELSE
        INSERT INTO idempotency.scope_grants (role, kind, pattern) VALUES (grantee, grant_pattern.kind, grant_pattern.pattern)
            ON CONFLICT DO NOTHING;
    END IF;
    GET DIAGNOSTICS done = ROW_COUNT;
    RETURN done;
END
$$;
COMMENT ON FUNCTION idempotency.grant_pattern(regrole, text, text, boolean) IS
'What idem_grant_scope, idem_revoke_scope, idem_grant_group and idem_revoke_group do.';

CREATE OR REPLACE FUNCTION idem_grant_scope(role regrole, scope text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'scope', scope, false) $$;
GRANT EXECUTE ON FUNCTION idem_grant_scope(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_grant_scope(regrole, text) IS
'Lets members of role call with scope (a name, or a prefix followed by *). Once any scope is granted, a consumer without a grant gets 42501 from every call with a scope (idempotency.require_scope_grants enforces it before the first grant). True when the grant is new. For idempotency_admin.';
CREATE OR REPLACE FUNCTION idem_revoke_scope(role regrole, scope text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'scope', scope, true) $$;
GRANT EXECUTE ON FUNCTION idem_revoke_scope(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_revoke_scope(regrole, text) IS
'Takes back a grant of idem_grant_scope (the same role and pattern); true when there was one. For idempotency_admin.';
CREATE OR REPLACE FUNCTION idem_grant_group(role regrole, consumer_group text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'group', consumer_group, false) $$;
GRANT EXECUTE ON FUNCTION idem_grant_group(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_grant_group(regrole, text) IS
'Lets members of role record and read the offsets of consumer_group (a name, or a prefix followed by *). Once any group is granted, a consumer without a grant gets 42501 from the offset calls of other groups. True when the grant is new. For idempotency_admin.';
CREATE OR REPLACE FUNCTION idem_revoke_group(role regrole, consumer_group text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'group', consumer_group, true) $$;
GRANT EXECUTE ON FUNCTION idem_revoke_group(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_revoke_group(regrole, text) IS
'Takes back a grant of idem_grant_group (the same role and pattern); true when there was one. For idempotency_admin.';

-- (0.8.0's sql/edition/ 80-observe.sql, as scripts/sql-edition --expand wrote it in)
-- The SQL edition: what a DBA and a monitoring system read (sql/observe.sql, src/api/observe.rs). The views
-- idempotency.stats, in_flight and dead_letters and idem_stats() are the native extension's, from
-- sql/observe.sql (the manifest names them), over the functions here.

-- Observability. No shared memory in this edition, so no counters: idempotency.stats has no row and
-- idem_stats() shows zeros with enabled false (a NOTICE says why, as the native extension does without its
-- library preloaded). idem_metrics() is computed from the tables, as the native one is; its maintenance
-- columns come from idempotency.maintenance_rounds (kept by idem_maintenance()), and worker_running is
-- false: there is no background worker, pg_cron or another scheduler calls idem_maintenance().
-------------------------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION idempotency.notice_no_stats() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'idempotency statistics are not kept by the SQL edition: idem_metrics() reads the figures from the tables';
END
$$;

CREATE OR REPLACE FUNCTION idempotency.scope_stats()
RETURNS TABLE (scope text, counts bigint[], stats_reset timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.notice_no_stats();
END
$$;
REVOKE ALL ON FUNCTION idempotency.scope_stats() FROM PUBLIC;

CREATE OR REPLACE FUNCTION idempotency.stats_totals()
RETURNS TABLE (counts bigint[], scopes bigint, enabled boolean, stats_reset timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.array_fill(0::bigint, ARRAY[17]), 0::bigint, false, NULL::timestamptz
$$;
REVOKE ALL ON FUNCTION idempotency.stats_totals() FROM PUBLIC;

-- The last maintenance round (idem_maintenance()), how many ran and failed, the last error: no row before
-- the first round.
CREATE OR REPLACE FUNCTION idempotency.maintenance_state()
RETURNS TABLE (last_round_at timestamptz, last_round_micros bigint, rounds bigint, failed_rounds bigint,
               last_error text, last_error_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT m.last_round_at, coalesce(m.last_round_micros, 0::bigint), m.rounds, m.failed_rounds,
           m.last_error, m.last_error_at
      FROM idempotency.maintenance_rounds m
     WHERE m.rounds OPERATOR(pg_catalog.>) 0::bigint OR m.failed_rounds OPERATOR(pg_catalog.>) 0::bigint
        OR m.last_round_at IS NOT NULL
$$;
REVOKE ALL ON FUNCTION idempotency.maintenance_state() FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_stats_reset(scope text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.notice_no_stats();
    RETURN pg_catalog.clock_timestamp();
END
$$;
REVOKE ALL ON FUNCTION idem_stats_reset(text) FROM PUBLIC;

-- A health snapshot, computed now: one row per scope that has records (one row with scope NULL when none
-- has), the database-wide figures repeated on each. Reads every retained record once. The partitions are
-- those attached to idempotency.records (pg_inherits), their ranges those idempotency.partition_ranges
-- keeps.
CREATE OR REPLACE FUNCTION idem_metrics()
RETURNS TABLE (scope text, retained_keys bigint, completed_keys bigint, in_flight bigint,
               oldest_lease_age interval, expired_leases bigint, awaiting_retry bigint,
               dead_letters bigint, last_dead_letter_at timestamptz,
               partitions integer, sealed_partitions integer, premade_until timestamptz,
               premade_ahead interval, last_round_at timestamptz, last_round_duration interval,
               rounds bigint, failed_rounds bigint, last_error text, last_error_at timestamptz,
               worker_running boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
WITH k AS (
    SELECT r.scope,
           pg_catalog.count(*) AS retained_keys,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'completed') AS completed_keys,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.token IS NOT NULL
                              AND r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS in_flight,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
               pg_catalog.min(r.created_at) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending'
                                                      AND r.token IS NOT NULL
                                                      AND r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())
               AS oldest_lease_age,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.token IS NOT NULL
                              AND NOT coalesce(r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false))
               AS expired_leases,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.token IS NULL) AS awaiting_retry,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'failed') AS dead_letters,
           pg_catalog.max(r.updated_at) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'failed') AS last_dead_letter_at
      FROM idempotency.records r
     GROUP BY r.scope
), p AS (
    SELECT pg_catalog.count(*)::integer AS partitions,
           pg_catalog.count(x.partition)::integer AS sealed_partitions,
           pg_catalog.max(pr.range_to) AS premade_until
      FROM pg_catalog.pg_inherits i
      LEFT JOIN idempotency.sealed x ON x.partition OPERATOR(pg_catalog.=) i.inhrelid
      LEFT JOIN idempotency.partition_ranges pr ON pr.partition OPERATOR(pg_catalog.=) i.inhrelid
     WHERE i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid
), m AS (
    SELECT * FROM idempotency.maintenance_state()
)
SELECT k.scope::text,
       coalesce(k.retained_keys, 0), coalesce(k.completed_keys, 0), coalesce(k.in_flight, 0),
       k.oldest_lease_age, coalesce(k.expired_leases, 0), coalesce(k.awaiting_retry, 0),
       coalesce(k.dead_letters, 0), k.last_dead_letter_at,
       p.partitions, p.sealed_partitions, p.premade_until,
       p.premade_until OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp(),
       m.last_round_at,
       pg_catalog.make_interval(secs => m.last_round_micros::pg_catalog.float8 OPERATOR(pg_catalog./) 1e6::pg_catalog.float8),
       coalesce(m.rounds, 0), coalesce(m.failed_rounds, 0), m.last_error, m.last_error_at,
       false
  FROM p
  LEFT JOIN m ON true
  LEFT JOIN k ON true
 ORDER BY k.scope
$$;
REVOKE ALL ON FUNCTION idem_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_metrics() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idem_metrics() IS
'Health snapshot computed now, one row per scope: retained, completed, in flight, oldest in flight, expired leases, awaiting retry, dead letters; and for the database: partitions, premade_ahead, the maintenance rounds (needs the library preloaded), worker_running. Reads every retained record.';
-- (0.8.0's sql/edition/ ../observe.sql: idempotency.stats idem_stats idempotency.in_flight idempotency.dead_letters, as scripts/sql-edition --expand wrote it in)
-- Cumulative counters per scope, from shared memory (src/stats). The array's order is the Counter
-- enum's; lock waits are kept in microseconds.
-- The views' operators have operands of exactly their types (no planted lookalike in the schema
-- CREATE EXTENSION ran in can match better) and their functions are qualified.
CREATE OR REPLACE VIEW idempotency.stats AS
SELECT s.scope,
       s.counts[1]  AS claims,
       s.counts[2]  AS claimed_new,
       s.counts[3]  AS takeovers,
       s.counts[4]  AS retries,
       s.counts[5]  AS answered_completed,
       s.counts[6]  AS answered_in_progress,
       s.counts[7]  AS answered_failed,
       s.counts[8]  AS answered_mismatch,
       s.counts[9]  AS poisoned,
       s.counts[10] AS dead_lettered,
       s.counts[11] AS stale_refused,
       s.counts[12] AS serialization_failures,
       s.counts[13] AS lock_waits,
       s.counts[14]::pg_catalog.float8 OPERATOR(pg_catalog./) 1000.0::pg_catalog.float8 AS lock_wait_ms,
       s.counts[15] AS completes,
       s.counts[16] AS fails,
       s.counts[17] AS heartbeats,
       s.stats_reset
  FROM idempotency.scope_stats() s;
GRANT SELECT ON idempotency.stats TO idempotency_admin, pg_monitor;
COMMENT ON VIEW idempotency.stats IS
'Cumulative counters per scope of this database since stats_reset (shared memory; needs shared_preload_libraries). Counted when the calling transaction ends, committed or not. scope NULL: the scopes beyond idempotency.stats_max_scopes. claims = claimed_new + takeovers + retries + answered_*.';

CREATE OR REPLACE FUNCTION idem_stats()
RETURNS TABLE (claims bigint, claimed_new bigint, takeovers bigint, retries bigint,
               answered_completed bigint, answered_in_progress bigint, answered_failed bigint,
               answered_mismatch bigint, poisoned bigint, dead_lettered bigint, stale_refused bigint,
               serialization_failures bigint, lock_waits bigint, lock_wait_ms double precision,
               completes bigint, fails bigint, heartbeats bigint,
               scopes bigint, enabled boolean, stats_reset timestamptz)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
SELECT t.counts[1], t.counts[2], t.counts[3], t.counts[4], t.counts[5], t.counts[6], t.counts[7],
       t.counts[8], t.counts[9], t.counts[10], t.counts[11], t.counts[12], t.counts[13],
       t.counts[14] / 1000.0::double precision, t.counts[15], t.counts[16], t.counts[17],
       t.scopes, t.enabled, t.stats_reset
  FROM idempotency.stats_totals() t
$$;
GRANT EXECUTE ON FUNCTION idem_stats() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idem_stats() IS
'The counters of idempotency.stats added up over all scopes of this database, with the number of scopes, whether counting is on (library preloaded and idempotency.stats on) and the oldest stats_reset.';

-- Keys that are pending: held by a live lease, with an ended lease nobody took over yet, or released
-- by a retryable failure. Pending rows always have expires_at, so the expires_at index finds them
-- without reading the settled ones.
CREATE OR REPLACE VIEW idempotency.in_flight AS
SELECT r.scope,
       r.key,
       CASE WHEN r.token IS NULL THEN 'released'
            WHEN r.expires_at > pg_catalog.clock_timestamp() THEN 'leased'
            ELSE 'expired' END AS state,
       r.token,
       r.attempts,
       r.created_at,
       r.updated_at,
       r.expires_at,
       pg_catalog.clock_timestamp() - r.created_at AS age
  FROM idempotency.records r
 WHERE r.expires_at IS NOT NULL AND r.status = 'pending';
GRANT SELECT ON idempotency.in_flight TO idempotency_admin;
COMMENT ON VIEW idempotency.in_flight IS
'Pending keys: state leased (live lease), expired (lease ended, not taken over yet) or released (a retryable failure, waiting for the next claim); age = now - created_at.';

-- Terminal failures: idem_fail(retryable => false), retryable failures past idempotency.max_attempts,
-- and poison messages (error = {"error": "max_attempts_exceeded", ...}).
CREATE OR REPLACE VIEW idempotency.dead_letters AS
SELECT r.scope,
       r.key,
       r.error,
       r.attempts,
       r.created_at,
       r.updated_at AS failed_at
  FROM idempotency.records r
 WHERE r.status = 'failed';
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;
COMMENT ON VIEW idempotency.dead_letters IS
'Terminal failures with their stored error: idem_fail(retryable => false), retries past idempotency.max_attempts, poison messages. idem_redrive makes them claimable again.';

-- (0.8.0's sql/edition/ ../surface/*.sql, as scripts/sql-edition --expand wrote it in)

GRANT EXECUTE ON FUNCTION idem_claim(text, interval, text, text, boolean) TO idempotency_consumer;
COMMENT ON FUNCTION idem_claim(text, interval, text, text, boolean) IS
'Claims (scope, key) for processing. outcome: claimed (you own it; token is your fencing token), completed (payload replays the stored result), in_progress (another holder''s lease is live), failed (terminal; payload is the stored error), mismatch (same key, different fingerprint). ttl NULL = idempotency.lease_ttl.';

GRANT EXECUTE ON FUNCTION idem_claim_batch(text[], interval, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_claim_batch(text[], interval, text) IS
'Claims many keys of one scope in one call (one broker poll); one row per input key, in input order, with the same outcomes as idem_claim. Keys are locked in sorted order.';

GRANT EXECUTE ON FUNCTION idem_complete(text, jsonb, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_complete(text, jsonb, text, bigint) IS
'Marks a claimed key completed and stores payload for replay. token may be NULL only in the transaction that claimed. Errors: P0002 unknown key, 55000 already terminal, 55006 lease lost.';

GRANT EXECUTE ON FUNCTION idem_complete_batch(text[], jsonb[], text, bigint[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_complete_batch(text[], jsonb[], text, bigint[]) IS
'Completes many claimed keys; payloads and tokens, when given, pair with keys by position. All or nothing; returns the number completed.';

GRANT EXECUTE ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) IS
'Records a failed attempt. retryable: releases the key for another claim and returns released, or returns failed once idempotency.max_attempts is reached. Not retryable: terminal at once, returns failed.';

GRANT EXECUTE ON FUNCTION idem_fingerprint(jsonb, text[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_fingerprint(jsonb, text[]) IS
'A request fingerprint for idem_claim: hex SHA-256 of the RFC 8785 canonical JSON of the document, or of an object mapping each given JSON Pointer to its value (null when absent). The client libraries compute the same value.';

GRANT EXECUTE ON FUNCTION idem_forget(text, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_forget(text, text) IS
'Deletes a key''s record whatever its state, so that it is processed again from scratch; false when unknown. A holder of its lease then gets P0002. Takes the key lock. For idempotency_admin.';

GRANT EXECUTE ON FUNCTION idem_heartbeat(text, interval, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_heartbeat(text, interval, text, bigint) IS
'Extends the caller''s lease to now + ttl and returns the new expires_at. 55006 if the lease was lost.';

GRANT EXECUTE ON FUNCTION idem_key(uuid, text[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_key(uuid, text[]) IS
'A key derived from a message''s identifying parts: the version-5 UUID of namespace and the parts (each as <UTF-8 length>:<bytes>;), as text. The client libraries compute the same value.';

GRANT EXECUTE ON FUNCTION idem_next_offset(text, text, integer) TO idempotency_consumer;
COMMENT ON FUNCTION idem_next_offset(text, text, integer) IS
'Where to seek on restart: last processed offset + 1, or NULL when nothing is stored.';

GRANT EXECUTE ON FUNCTION idem_offsets(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_offsets(text, text) IS
'Stored positions of a consumer group (optionally one topic), for the startup seek.';

GRANT EXECUTE ON FUNCTION idem_once(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_once(text, text) IS
'True exactly once per (scope, key) over all committed transactions; records the key as completed in the caller''s transaction.';

GRANT EXECUTE ON FUNCTION idem_once_batch(text[], text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_once_batch(text[], text) IS
'The keys of the batch seen for the first time over all committed transactions, each once, in input order; records them as completed.';

GRANT EXECUTE ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) IS
'Stores processed_offset + 1 as the next offset of (consumer_group, topic, partition) in the caller''s transaction. False when processed_offset is not beyond the stored position (a duplicate). 55006 when generation is older than the stored one.';

GRANT EXECUTE ON FUNCTION idem_redrive(text, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_redrive(text, text) IS
'Makes a failed (dead-letter) key claimable again: released, attempts counted from zero, error kept. False when the key is not failed; P0002 when unknown. Takes the key lock. For idempotency_admin.';

GRANT EXECUTE ON FUNCTION idem_redrive_scope(text, timestamptz, integer) TO idempotency_admin;
COMMENT ON FUNCTION idem_redrive_scope(text, timestamptz, integer) IS
'Redrives up to max_keys failed keys of a scope (failed since failed_since, when given), in key order; returns how many. Call again until 0. Holds each key''s lock until commit. For idempotency_admin.';

COMMENT ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) IS
'Sets the next offset of (consumer_group, topic, partition), backwards or forwards, and, when generation is given, the stored generation (lower or higher: a zombie''s huge generation is undone here). For DBAs; not granted to idempotency_consumer.';

GRANT EXECUTE ON FUNCTION idem_stats_reset(text) TO idempotency_admin;
COMMENT ON FUNCTION idem_stats_reset(text) IS
'Zeroes the counters of one scope, or of all scopes of this database (NULL); returns the time of the reset. For idempotency_admin.';

GRANT EXECUTE ON FUNCTION idem_status(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_status(text, text) IS
'The stored record of (scope, key): status, attempts, token, payload, error and timestamps; no row if unknown.';

GRANT EXECUTE ON FUNCTION idempotency.maintenance_state() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.maintenance_state() IS
'The last maintenance round of this database since the server started (worker or idem_maintenance()), how many ran and failed, the last error. Empty without the library preloaded.';

GRANT EXECUTE ON FUNCTION idempotency.scope_stats() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.scope_stats() IS
'The counters behind idempotency.stats, per scope, in the order of its columns (lock waits in microseconds).';

GRANT EXECUTE ON FUNCTION idempotency.stats_totals() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.stats_totals() IS
'The counters behind idem_stats(), added up over the scopes of this database.';
-- (0.8.0's sql/edition/ 90-finalize.sql, as scripts/sql-edition --expand wrote it in)
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

-- The triggers that keep idempotency.cached_state in step with its tables (15-state.sql, 20-partitions.sql).
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.settings
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scope_grants
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.sealed
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.partition_ranges
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();

-- The partitions ahead that hold no row, and the state of this database, now rather than at the next
-- maintenance round.
SELECT FROM idempotency.mark_empty_ahead();
SELECT FROM idempotency.write_call_cache();
