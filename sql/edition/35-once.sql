-- The SQL edition: idem_once (and the one-key step idem_once_batch shares) and idem_status. New keys meet in
-- the write partition's unique index, as in 30-keys.sql.

-- One once-key, for idem_once and idem_once_batch: true when new (written completed).
CREATE FUNCTION idempotency.once_one(k text, sc text, w_from timestamptz, w_to timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM idempotency.records x
                WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
                  AND (x.created_at OPERATOR(pg_catalog.<) w_from OR x.created_at OPERATOR(pg_catalog.>=) w_to)) THEN
        RETURN false;
    END IF;
    PERFORM idempotency.check_seals_visible(k, sc);
    INSERT INTO idempotency.records (scope, key, status, attempts, created_at, updated_at)
    VALUES (sc, k, 'completed', 1, idempotency.created_at(w_from, w_to), pg_catalog.now())
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    -- The key was there: it was read, not written. Under SERIALIZABLE, read its row as a query does (ON
    -- CONFLICT's check takes no predicate lock), so that a transaction deleting it is seen (idem_forget).
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'serializable' THEN
        PERFORM FROM idempotency.records x
         WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
           AND x.created_at OPERATOR(pg_catalog.>=) w_from AND x.created_at OPERATOR(pg_catalog.<) w_to;
    END IF;
    RETURN false;
END
$$;

CREATE FUNCTION idem_once(key text, scope text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    w record;
BEGIN
    PERFORM idempotency.check_writable('idem_once');
    PERFORM idempotency.check_ident('key', idem_once.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_once.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_once.scope, s);
    w := idempotency.write_partition();
    RETURN idempotency.once_one(idem_once.key, idem_once.scope, w.range_from, w.range_to);
END
$$;

CREATE FUNCTION idem_status(key text, scope text DEFAULT 'default')
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
