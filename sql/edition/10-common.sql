-- The SQL edition: settings, argument checks and grants, shared by every function. Each runs inside a
-- SECURITY DEFINER function of the edition (search_path = pg_catalog, pg_temp) and qualifies what it uses.

-- A setting's text as the session gave it (SET idempotency.<name>), or NULL (never set, or set to '').
CREATE FUNCTION idempotency.session_value(name text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NULLIF(pg_catalog.current_setting('idempotency.' OPERATOR(pg_catalog.||) name, true), '')
$$;

-- A GUC-style duration ('30s', '10min', '2d', '1h'; a bare number is in `unit`) as an interval. (The small
-- helpers here are PL/pgSQL, whose plans a session keeps: a SQL function that is not inlined is planned anew
-- at each call from PL/pgSQL.)
CREATE FUNCTION idempotency.parse_interval(value text, unit text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value OPERATOR(pg_catalog.~) '^\s*-?[0-9]+\s*$' THEN
        RETURN pg_catalog.interval_mul(('1 ' OPERATOR(pg_catalog.||) unit)::interval, value::pg_catalog.float8);
    END IF;
    RETURN value::interval;
END
$$;

-- A GUC-style size ('512B', '1kB', '1MB'; a bare number is bytes) in bytes.
CREATE FUNCTION idempotency.parse_bytes(value text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN pg_catalog.pg_size_bytes(pg_catalog.regexp_replace(value, '^\s*([0-9]+)\s*B\s*$', '\1'));
END
$$;

-- The role that called: the one SET ROLE chose, else the session's login role. (A SECURITY DEFINER
-- function runs as its owner; the role setting is what SET ROLE set, checked against membership when it
-- was set, so a caller cannot name a role it could not become.)
CREATE FUNCTION idempotency.caller() RETURNS name
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(NULLIF(pg_catalog.current_setting('role'), 'none')::name, SESSION_USER)
$$;

-- True when the calling role is a superuser: only then may a session loosen a limit.
CREATE FUNCTION idempotency.session_is_superuser() RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r
                      WHERE r.rolname OPERATOR(pg_catalog.=) idempotency.caller()), false);
END
$$;

-- The values ALTER DATABASE ... SET and ALTER ROLE ... SET give a setting for this database and the calling
-- role or the session's login role (the floors a session must not loosen: SET ROLE to another role keeps the
-- login role's). Setting names are matched without regard to case, as PostgreSQL matches them.
CREATE FUNCTION idempotency.configured_values(name text) RETURNS text[]
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
CREATE FUNCTION idempotency.limit_in_force(name text, table_value bigint, session_value text, kind text) RETURNS bigint
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

CREATE FUNCTION idempotency.limit_value(value text, kind text) RETURNS bigint
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
CREATE FUNCTION idempotency.config() RETURNS idempotency.settings
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

-- The effective value of one integer limit, in bytes for sizes (for the derivation functions).
CREATE FUNCTION idempotency.setting_int(name text) RETURNS bigint
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
CREATE FUNCTION idempotency.quoted(name text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '"' OPERATOR(pg_catalog.||)
           pg_catalog.replace(pg_catalog.replace(name, '\', '\\'), '"', '\"')
           OPERATOR(pg_catalog.||) '"'
$$;

-- 54000 with the native extension's message and hint.
CREATE FUNCTION idempotency.too_large(what text, bytes bigint, max_bytes bigint, guc text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: % is % bytes, over the limit of %', what, bytes, max_bytes
        USING ERRCODE = '54000', HINT = pg_catalog.format('The limit is set by %s.', guc);
END
$$;

-- The size the native extension measures a jsonb by: the detoasted datum's (uncompressed; a 1-byte header
-- kept as it is). doc #> '{}' is the document detoasted with a 4-byte header; a short inline datum (at most
-- 127 bytes) had a 1-byte one.
CREATE FUNCTION idempotency.document_size(doc jsonb) RETURNS bigint
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
CREATE FUNCTION idempotency.check_ident(what text, value text, max_bytes integer) RETURNS void
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

CREATE FUNCTION idempotency.check_required(what text, value anyelement) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'idempotency: % must not be NULL', what USING ERRCODE = '22004';
    END IF;
END
$$;

CREATE FUNCTION idempotency.check_writable(fn text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
        RAISE EXCEPTION '% cannot run in a read-only transaction', fn USING ERRCODE = '25006',
            HINT = CASE WHEN pg_catalog.pg_is_in_recovery() THEN 'This server is a hot standby: call it on the primary.'
                        ELSE 'Call it in a read-write transaction.' END;
    END IF;
END
$$;

CREATE FUNCTION idempotency.check_ttl(ttl interval, lease_ttl interval, max_lease_ttl interval) RETURNS interval
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

CREATE FUNCTION idempotency.check_token(token bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'idempotency: token must be positive, got %', token USING ERRCODE = '22023';
    END IF;
END
$$;

-- 54000 when a payload, error or document is larger than max_payload_bytes (its jsonb size).
CREATE FUNCTION idempotency.check_document(what text, doc jsonb, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF doc IS NOT NULL AND idempotency.document_size(doc) OPERATOR(pg_catalog.>) max_bytes THEN
        PERFORM idempotency.too_large(what, idempotency.document_size(doc), max_bytes, 'idempotency.max_payload_bytes');
    END IF;
END
$$;

CREATE FUNCTION idempotency.check_fingerprint(fingerprint text, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF pg_catalog.octet_length(fingerprint) OPERATOR(pg_catalog.>) max_bytes THEN
        PERFORM idempotency.too_large('fingerprint', pg_catalog.octet_length(fingerprint), max_bytes, 'idempotency.max_key_bytes');
    END IF;
END
$$;

-- Scope and consumer-group grants: off until the first grant of a kind (or require_scope_grants). The
-- caller is idempotency.caller(); a superuser passes; a member of a granted role (with its privileges) passes.
CREATE FUNCTION idempotency.authorize(kind text, name text, s idempotency.settings) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF s.require_scope_grants
       OR EXISTS (SELECT FROM idempotency.scope_grants g WHERE g.kind OPERATOR(pg_catalog.=) authorize.kind) THEN
        PERFORM idempotency.authorize_enforced(kind, name);
    END IF;
END
$$;

-- The check itself, once grants of the kind are enforced (idempotency.call_state tells the key calls so).
CREATE FUNCTION idempotency.authorize_enforced(kind text, name text) RETURNS void
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
