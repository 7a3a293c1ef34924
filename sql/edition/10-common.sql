-- The SQL edition: settings, argument checks and grants, shared by every function. Each runs inside a
-- SECURITY DEFINER function of the edition (search_path = pg_catalog, pg_temp) and qualifies what it uses.

-- A setting's text as the session gave it (SET idempotency.<name>), or NULL.
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

-- The settings in force for this call: idempotency.settings, where the session's SET idempotency.<name>
-- may tighten a limit (any role) or loosen it (a superuser only); lease_ttl the session sets freely.
CREATE FUNCTION idempotency.config() RETURNS idempotency.settings
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    s idempotency.settings;
    v text;
    n bigint;
    i interval;
BEGIN
    SELECT * INTO STRICT s FROM idempotency.settings;
    v := idempotency.session_value('lease_ttl');
    IF v IS NOT NULL THEN s.lease_ttl := idempotency.parse_interval(v, 'ms'); END IF;
    v := idempotency.session_value('max_lease_ttl');
    IF v IS NOT NULL THEN
        i := idempotency.parse_interval(v, 's');
        IF i OPERATOR(pg_catalog.<) s.max_lease_ttl OR (i OPERATOR(pg_catalog.>) s.max_lease_ttl AND idempotency.session_is_superuser()) THEN s.max_lease_ttl := i; END IF;
    END IF;
    v := idempotency.session_value('max_attempts');
    IF v IS NOT NULL THEN
        n := v::bigint;
        IF n OPERATOR(pg_catalog.<) s.max_attempts OR (n OPERATOR(pg_catalog.>) s.max_attempts AND idempotency.session_is_superuser()) THEN s.max_attempts := n; END IF;
    END IF;
    v := idempotency.session_value('max_key_bytes');
    IF v IS NOT NULL THEN
        n := idempotency.parse_bytes(v);
        IF n OPERATOR(pg_catalog.<) s.max_key_bytes OR (n OPERATOR(pg_catalog.>) s.max_key_bytes AND idempotency.session_is_superuser()) THEN s.max_key_bytes := n; END IF;
    END IF;
    v := idempotency.session_value('max_payload_bytes');
    IF v IS NOT NULL THEN
        n := idempotency.parse_bytes(v);
        IF n OPERATOR(pg_catalog.<) s.max_payload_bytes OR (n OPERATOR(pg_catalog.>) s.max_payload_bytes AND idempotency.session_is_superuser()) THEN s.max_payload_bytes := n; END IF;
    END IF;
    v := idempotency.session_value('max_batch_keys');
    IF v IS NOT NULL THEN
        n := v::bigint;
        IF n OPERATOR(pg_catalog.<) s.max_batch_keys OR (n OPERATOR(pg_catalog.>) s.max_batch_keys AND idempotency.session_is_superuser()) THEN s.max_batch_keys := n; END IF;
    END IF;
    v := idempotency.session_value('require_scope_grants');
    IF v IS NOT NULL THEN
        IF v::boolean OR (s.require_scope_grants AND idempotency.session_is_superuser()) THEN s.require_scope_grants := v::boolean; END IF;
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

CREATE FUNCTION idempotency.check_ttl(ttl interval, s idempotency.settings) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    t interval := coalesce(ttl, s.lease_ttl);
BEGIN
    IF t OPERATOR(pg_catalog.<=) '0'::interval THEN
        RAISE EXCEPTION 'idempotency: ttl must be positive, got %', t USING ERRCODE = '22023';
    END IF;
    IF t OPERATOR(pg_catalog.>) s.max_lease_ttl THEN
        RAISE EXCEPTION 'idempotency: ttl % is longer than idempotency.max_lease_ttl (%)', t, s.max_lease_ttl
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
DECLARE
    enforced boolean;
BEGIN
    enforced := s.require_scope_grants
        OR EXISTS (SELECT FROM idempotency.scope_grants g WHERE g.kind OPERATOR(pg_catalog.=) authorize.kind);
    IF NOT enforced THEN
        RETURN;
    END IF;
    IF idempotency.session_is_superuser() OR EXISTS (
        SELECT FROM idempotency.scope_grants g
         WHERE g.kind OPERATOR(pg_catalog.=) authorize.kind
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
