-- The SQL edition: idem_once (and the one-key step idem_once_batch shares) and idem_status. New keys meet in
-- the write partition's unique index, as in 30-keys.sql.

-- One once-key, the long way (idem_once outside its common case, idem_once_batch's keys that met a row): st
-- is the caller's idempotency.call_state. true when new (written completed), false when seen before, NULL when
-- the write partition was sealed under the write (READ COMMITTED; nothing written): the caller tries again.
CREATE FUNCTION idempotency.once_one(k text, sc text, st idempotency.call_state) RETURNS boolean
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

CREATE FUNCTION idem_once(key text, scope text DEFAULT 'default') RETURNS boolean
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
