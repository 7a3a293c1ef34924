-- The SQL edition: settling a key the caller holds (idem_complete, idem_fail, idem_heartbeat) and the row
-- they change (idempotency.held_row). The claims are in 30-keys.sql.

-- The row of a key the caller holds, locked: 55006 / 55000 / P0002 as the native extension decides.
CREATE FUNCTION idempotency.held_row(k text, sc text, given bigint,
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

CREATE FUNCTION idem_complete(key text, payload jsonb DEFAULT NULL, scope text DEFAULT 'default', token bigint DEFAULT NULL)
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

CREATE FUNCTION idem_fail(key text, error jsonb DEFAULT NULL, retryable boolean DEFAULT true,
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

CREATE FUNCTION idem_heartbeat(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default', token bigint DEFAULT NULL)
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

