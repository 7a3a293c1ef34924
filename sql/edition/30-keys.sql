-- The SQL edition: the key calls. No key lock: a new key is inserted with ON CONFLICT DO NOTHING into the
-- write partition (idempotency.write_partition), whose unique index makes a second claimer wait for the
-- first one's transaction, as in a hand-written keys table; a key settled in a sealed partition is found
-- there, and an existing row is changed under its row lock (SELECT ... FOR UPDATE). Under REPEATABLE READ
-- and SERIALIZABLE, PostgreSQL itself raises 40001 where the row was written after the snapshot (ON
-- CONFLICT meeting an invisible row, FOR UPDATE of a row changed since).

-- The created_at of a new row: the transaction's start, moved into the write partition's range.
CREATE FUNCTION idempotency.created_at(w_from timestamptz, w_to timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT LEAST(GREATEST(pg_catalog.now(), w_from),
                            w_to OPERATOR(pg_catalog.-) '1 microsecond'::interval)
$$;

-- True when this transaction (or one of its subtransactions) wrote the row version whose xmin is x, for
-- a row this transaction can see: a visible row whose writer is still in progress is this transaction's.
CREATE FUNCTION idempotency.written_here(x xid) RETURNS boolean
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

-- The row of the key this transaction claimed last, for idem_complete to update by its address: a scan by
-- address takes no predicate lock on a row this transaction wrote, where a lookup by key locks the index page
-- under SERIALIZABLE, and other consumers' inserts into that page then cost retries (issue 29's scenario: 9x
-- the hand-written pattern's failures). Kept in a transaction-local setting (undone with a rolled-back
-- subtransaction, as the claim is). A caller may set it to anything: idem_complete still matches key, scope,
-- status and holder, so a wrong address only sends it to the lookup by key.
CREATE FUNCTION idempotency.remember_claim(part oid, row_ctid tid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.set_config('idempotency_edition.claimed_row',
                                  part::text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) row_ctid::text, true);
END
$$;

CREATE FUNCTION idempotency.remembered_claim(OUT part oid, OUT row_ctid tid)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    m text[] := pg_catalog.regexp_match(
        pg_catalog.current_setting('idempotency_edition.claimed_row', true),
        '^([0-9]{1,10}) \(([0-9]{1,10}),([0-9]{1,5})\)$');
BEGIN
    -- Parsed only within the types' ranges: a value set by hand never raises here.
    IF m IS NOT NULL AND m[1]::numeric OPERATOR(pg_catalog.<=) 4294967295
       AND m[2]::numeric OPERATOR(pg_catalog.<=) 4294967295 AND m[3]::numeric OPERATOR(pg_catalog.<=) 65535 THEN
        part := m[1]::oid;
        row_ctid := ('(' OPERATOR(pg_catalog.||) m[2] OPERATOR(pg_catalog.||) ',' OPERATOR(pg_catalog.||) m[3]
                     OPERATOR(pg_catalog.||) ')')::tid;
    END IF;
END
$$;

-- Under REPEATABLE READ and SERIALIZABLE: 40001 when a seal committed after this transaction's snapshot,
-- which may then miss rows of the newly sealed partition (called before a new key's row is written).
CREATE FUNCTION idempotency.check_seals_visible(key text, scope text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
       AND idempotency.sealed_until() OPERATOR(pg_catalog.>)
           coalesce((SELECT pg_catalog.max(x.range_to) FROM idempotency.sealed x), '-infinity'::timestamptz) THEN
        RAISE EXCEPTION 'idempotency: could not serialize access to key % in scope % due to a concurrent claim',
                        idempotency.quoted(key), idempotency.quoted(scope)
            USING ERRCODE = '40001', DETAIL = 'A partition was sealed after this transaction''s snapshot was taken.',
                  HINT = 'The transaction should be retried.';
    END IF;
END
$$;

-- One claim, for idem_claim and idem_claim_batch: arguments checked by the caller; w_* is the write
-- partition, locked by the caller.
CREATE FUNCTION idempotency.claim_one(k text, sc text, ttl interval, fp text, wait boolean,
                                      max_attempts integer, w_from timestamptz, w_to timestamptz,
                                      OUT outcome text, OUT token bigint, OUT attempts integer,
                                      OUT payload jsonb, OUT expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    busy boolean := false;
    inserted boolean := false;
    saved text;
    at_part oid;
    at_ctid tid;
BEGIN
    FOR round IN 1..3 LOOP
        -- A record of the key outside the write partition: in a sealed one (no new rows go there), or, after a
        -- restore or a move, in one ahead of it. Then one in the write partition, where new keys meet.
        SELECT x.tableoid, x.ctid, x.xmin, x.status, x.token, x.attempts, x.fingerprint, x.payload, x.error, x.expires_at
          INTO r FROM idempotency.records x
         WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
           AND (x.created_at OPERATOR(pg_catalog.<) w_from OR x.created_at OPERATOR(pg_catalog.>=) w_to);
        IF NOT FOUND THEN
            PERFORM idempotency.check_seals_visible(k, sc);
            token := pg_catalog.nextval('idempotency.token_seq');
            IF wait THEN
                INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, fingerprint,
                                                      created_at, updated_at, expires_at)
                VALUES (sc, k, 'pending', claim_one.token, 1, fp, idempotency.created_at(w_from, w_to),
                        pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) ttl)
                ON CONFLICT DO NOTHING
                RETURNING x.attempts, x.expires_at, x.tableoid, x.ctid INTO attempts, expires_at, at_part, at_ctid;
                inserted := FOUND;
            ELSE
                -- Not waiting for another transaction's uncommitted row of the key: in_progress.
                saved := pg_catalog.current_setting('lock_timeout');
                BEGIN
                    PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
                    INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, fingerprint,
                                                          created_at, updated_at, expires_at)
                    VALUES (sc, k, 'pending', claim_one.token, 1, fp, idempotency.created_at(w_from, w_to),
                            pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) ttl)
                    ON CONFLICT DO NOTHING
                    RETURNING x.attempts, x.expires_at, x.tableoid, x.ctid INTO attempts, expires_at, at_part, at_ctid;
                    inserted := FOUND;
                    PERFORM pg_catalog.set_config('lock_timeout', saved, true);
                EXCEPTION WHEN lock_not_available THEN
                    busy := true;
                END;
                IF busy THEN
                    outcome := 'in_progress'; token := NULL;
                    RETURN;
                END IF;
            END IF;
            IF inserted THEN
                PERFORM idempotency.remember_claim(at_part, at_ctid);
                outcome := 'claimed';
                RETURN;
            END IF;
            token := NULL;
            -- Another transaction wrote the key there and committed (ON CONFLICT waited for it), or this one did.
            SELECT x.tableoid, x.ctid, x.xmin, x.status, x.token, x.attempts, x.fingerprint, x.payload, x.error, x.expires_at
              INTO r FROM idempotency.records x
             WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
               AND x.created_at OPERATOR(pg_catalog.>=) w_from;
            CONTINUE WHEN NOT FOUND;   -- deleted in between (forgotten, reclaimed): look again
        END IF;
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
             WHERE x.tableoid OPERATOR(pg_catalog.=) r.tableoid AND x.ctid OPERATOR(pg_catalog.=) r.ctid
               AND x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) sc
               FOR UPDATE;
        ELSE
            BEGIN
                SELECT x.status, x.token, x.attempts, x.expires_at, x.fingerprint INTO r FROM idempotency.records x
                 WHERE x.tableoid OPERATOR(pg_catalog.=) r.tableoid AND x.ctid OPERATOR(pg_catalog.=) r.ctid
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
        IF r.attempts OPERATOR(pg_catalog.>=) max_attempts THEN
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
        RETURNING x.token, x.attempts, x.expires_at, x.tableoid, x.ctid INTO token, attempts, expires_at, at_part, at_ctid;
        PERFORM idempotency.remember_claim(at_part, at_ctid);
        outcome := 'claimed';
        RETURN;
    END LOOP;
    RAISE EXCEPTION 'idempotency: could not serialize access to key % in scope % due to a concurrent claim',
                    idempotency.quoted(k), idempotency.quoted(sc)
        USING ERRCODE = '40001', DETAIL = 'The key''s record kept changing under the claim.',
              HINT = 'The transaction should be retried.';
END
$$;

CREATE FUNCTION idem_claim(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default',
                           fingerprint text DEFAULT NULL, wait boolean DEFAULT true)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    t interval;
    w record;
BEGIN
    PERFORM idempotency.check_writable('idem_claim');
    PERFORM idempotency.check_ident('key', idem_claim.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_claim.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_claim.scope, s);
    t := idempotency.check_ttl(idem_claim.ttl, s);
    PERFORM idempotency.check_fingerprint(idem_claim.fingerprint, s.max_key_bytes);
    PERFORM idempotency.check_required('wait', idem_claim.wait);
    w := idempotency.write_partition();
    RETURN QUERY SELECT c.outcome, c.token, c.attempts, c.payload, c.expires_at
      FROM idempotency.claim_one(idem_claim.key, idem_claim.scope, t, idem_claim.fingerprint, idem_claim.wait,
                                 s.max_attempts, w.range_from, w.range_to) c;
END
$$;

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
    s idempotency.settings := idempotency.config();
    h record;
    at record;
BEGIN
    PERFORM idempotency.check_writable('idem_complete');
    PERFORM idempotency.check_ident('key', idem_complete.key, s.max_key_bytes);
    PERFORM idempotency.check_ident('scope', idem_complete.scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', idem_complete.scope, s);
    PERFORM idempotency.check_document('payload', idem_complete.payload, s.max_payload_bytes);
    PERFORM idempotency.check_token(idem_complete.token);
    -- The common case in one statement: the caller holds the lease (by its token, or as the transaction that
    -- claimed), first at the address of this transaction's last claim. Otherwise held_row finds out why not,
    -- and raises.
    at := idempotency.remembered_claim();
    IF at.part IS NOT NULL THEN
        UPDATE idempotency.records x
           SET status = 'completed', payload = idem_complete.payload, updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
         WHERE x.tableoid OPERATOR(pg_catalog.=) at.part AND x.ctid OPERATOR(pg_catalog.=) at.row_ctid
           AND x.key OPERATOR(pg_catalog.=) idem_complete.key AND x.scope OPERATOR(pg_catalog.=) idem_complete.scope
           AND x.status OPERATOR(pg_catalog.=) 'pending' AND x.token IS NOT NULL
           AND CASE WHEN idem_complete.token IS NULL THEN idempotency.written_here(x.xmin)
                    ELSE x.token OPERATOR(pg_catalog.=) idem_complete.token END;
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
    t := idempotency.check_ttl(idem_heartbeat.ttl, s);
    PERFORM idempotency.check_token(idem_heartbeat.token);
    h := idempotency.held_row(idem_heartbeat.key, idem_heartbeat.scope, idem_heartbeat.token);
    UPDATE idempotency.records x
       SET expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) t, updated_at = pg_catalog.clock_timestamp()
     WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid
    RETURNING x.expires_at INTO e;
    RETURN e;
END
$$;

