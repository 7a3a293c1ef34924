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
CREATE FUNCTION idempotency.lock_key(k text, sc text) RETURNS text
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
CREATE FUNCTION idempotency.redrive_one(k text, sc text, must_exist boolean) RETURNS boolean
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

CREATE FUNCTION idem_redrive(key text, scope text DEFAULT 'default') RETURNS boolean
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

CREATE FUNCTION idem_redrive_scope(scope text, failed_since timestamptz DEFAULT NULL, max_keys integer DEFAULT 1000)
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

CREATE FUNCTION idem_forget(key text, scope text DEFAULT 'default') RETURNS boolean
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
