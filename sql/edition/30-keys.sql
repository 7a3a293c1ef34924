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

-- The claim this transaction made last, for idem_complete to update its row by address: a scan by address
-- takes no predicate lock on a row this transaction wrote, where a lookup by key locks the index page under
-- SERIALIZABLE (issue 29's scenario: 9x the hand-written pattern's failures), and it reads one partition.
-- Kept in a transaction-local setting (undone with a rolled-back subtransaction, as the claim is) as
-- "<token> <ctid> <partition oid>": the token stands for the holder (a caller who sets the setting by hand
-- learns nothing a token argument would not give). idem_complete still matches key, scope, status and token,
-- so a wrong value only sends it to the lookup by key.
CREATE FUNCTION idempotency.remember_claim(token bigint, row_ctid tid, part oid) RETURNS text
LANGUAGE sql AS $$
    SELECT pg_catalog.set_config('idempotency_edition.claimed_row', pg_catalog.concat_ws(' ', token, row_ctid, part), true)
$$;

-- 40001 under REPEATABLE READ and SERIALIZABLE when a seal committed after this transaction's snapshot,
-- which may then miss rows of the newly sealed partition (idempotency.call_state's stale_seal; raised before
-- a new key's row is written).
CREATE FUNCTION idempotency.seal_conflict(key text, scope text) RETURNS void
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
CREATE FUNCTION idempotency.sealed_under(st idempotency.call_state, key text, scope text) RETURNS boolean
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
CREATE FUNCTION idempotency.claim_one(k text, sc text, ttl interval, fp text, wait boolean,
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

CREATE FUNCTION idem_claim(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default',
                           fingerprint text DEFAULT NULL, wait boolean DEFAULT true)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gen0 bigint := (idempotency.cached_state()).gen;   -- read first (below)
    ver bigint := idempotency.fast_version(true, true, false, idempotency.cached_state());
    planned bigint;
    st idempotency.call_state;
    t interval;
    conflicted boolean;
    elsewhere boolean;
    h bigint;
    written_at timestamptz;
    c record;
BEGIN
    -- The common case (idempotency.fast_version): arguments within the limits (key and scope not empty and
    -- without control characters: one pattern over both, joined by one; a NULL one fails it), no record of
    -- the key outside the write partition, and the new row written there. The state comes from
    -- idempotency.cached_state, folded into each statement's plan. The write returns what the claim answers
    -- and the generation of the state it planned with, which must be the one read first (gen0); then
    -- sealed_upto must still match the state's. (The claim is not remembered for idem_complete: in READ COMMITTED it finds the row by
    -- key, as written by this transaction.)
    IF ver OPERATOR(pg_catalog.>=) 0 AND idem_claim.wait
       AND GREATEST(pg_catalog.octet_length(idem_claim.key), pg_catalog.octet_length(idem_claim.scope),
                    pg_catalog.octet_length(idem_claim.fingerprint)) OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_key_bytes
       AND (idem_claim.key OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) idem_claim.scope)
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
            RETURNING x.token, x.attempts, x.expires_at, x.created_at, (idempotency.cached_state()).gen
                 INTO idem_claim.token, idem_claim.attempts, idem_claim.expires_at, written_at, planned;
            conflicted := NOT FOUND;   -- the key is in the write partition: claim_one reads it
            -- One state throughout: each guard and statement folded cached_state() when it was planned, and a
            -- statement is planned again at its first lock after the state was replaced (a maintenance round
            -- that writes a key filter replaces it without moving sealed_upto: edition_filter_race.spec). A
            -- session never goes back to a state it replaced, and each state has its own generation, so the
            -- write's generation equal to the one read before everything else means every read between saw
            -- that state, ver's included. Then sealed_upto must still match it (a seal under way).
            IF planned OPERATOR(pg_catalog.=) gen0
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                   OPERATOR(pg_catalog.=) ver THEN
                outcome := 'claimed';
                RETURN NEXT;
                RETURN;
            END IF;
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
                -- the key do not look. Deleted (found by key and created_at, as in idem_once); claimed again the
                -- long way.
                DELETE FROM idempotency.records x
                 WHERE x.created_at OPERATOR(pg_catalog.=) written_at
                   AND x.key OPERATOR(pg_catalog.=) idem_claim.key AND x.scope OPERATOR(pg_catalog.=) idem_claim.scope
                   AND idempotency.written_here(x.xmin);
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

