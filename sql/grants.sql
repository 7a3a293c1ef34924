-- Scope and consumer-group grants (see src/storage/grants.rs and docs/security.md). Off until the first
-- grant of a kind: without grants every member of idempotency_consumer is trusted with every scope and
-- group. role is a regrole, so that pg_dump writes it as the role's name; pattern is a scope or group name,
-- or a prefix followed by '*'.
CREATE TABLE idempotency.scope_grants (
    role       regrole NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('scope', 'group')),
    pattern    text COLLATE "C" NOT NULL CHECK (pattern <> ''),
    granted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (role, kind, pattern)
);
GRANT SELECT ON idempotency.scope_grants TO idempotency_admin;
COMMENT ON TABLE idempotency.scope_grants IS
'Which roles may call with which scopes and consumer groups (idem_grant_scope, idem_grant_group). Enforced once a kind has a grant, or always with idempotency.require_scope_grants.';
-- Every change, by the functions below or by hand, tells every backend to read the grants again.
CREATE TRIGGER scope_grants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scope_grants
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.scope_grants_changed();
SELECT pg_catalog.pg_extension_config_dump('idempotency.scope_grants', '');

CREATE FUNCTION idempotency.grant_pattern(grantee regrole, kind text, pattern text, revoke boolean)
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

CREATE FUNCTION idem_grant_scope(role regrole, scope text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'scope', scope, false) $$;
GRANT EXECUTE ON FUNCTION idem_grant_scope(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_grant_scope(regrole, text) IS
'Lets members of role call with scope (a name, or a prefix followed by *). Once any scope is granted, a consumer without a grant gets 42501 from every call with a scope (idempotency.require_scope_grants enforces it before the first grant). True when the grant is new. For idempotency_admin.';
CREATE FUNCTION idem_revoke_scope(role regrole, scope text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'scope', scope, true) $$;
GRANT EXECUTE ON FUNCTION idem_revoke_scope(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_revoke_scope(regrole, text) IS
'Takes back a grant of idem_grant_scope (the same role and pattern); true when there was one. For idempotency_admin.';
CREATE FUNCTION idem_grant_group(role regrole, consumer_group text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'group', consumer_group, false) $$;
GRANT EXECUTE ON FUNCTION idem_grant_group(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_grant_group(regrole, text) IS
'Lets members of role record and read the offsets of consumer_group (a name, or a prefix followed by *). Once any group is granted, a consumer without a grant gets 42501 from the offset calls of other groups. True when the grant is new. For idempotency_admin.';
CREATE FUNCTION idem_revoke_group(role regrole, consumer_group text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'group', consumer_group, true) $$;
GRANT EXECUTE ON FUNCTION idem_revoke_group(regrole, text) TO idempotency_admin;
COMMENT ON FUNCTION idem_revoke_group(regrole, text) IS
'Takes back a grant of idem_grant_group (the same role and pattern); true when there was one. For idempotency_admin.';
