-- The SQL edition, 0.9.2 -> 0.9.3 (issue 32: the batches' per-key work, the single calls' tests and results).
-- Nothing stored changes: idem_claim, idem_once, idem_complete, idem_claim_batch and idem_once_batch are
-- replaced. idem_once_batch makes its keys distinct by the sort that orders its write (before, by hashing and
-- then sorting) and runs its key-filter test only when a key's print matched. The claims, idem_once and
-- idem_once_batch no longer collect the addresses of the rows they write: the rare write that a seal
-- overtook deletes its rows by key and writer, a single call's by the created_at it wrote, a batch's within
-- the written partition's range. idem_complete's common case tests key and scope
-- for control characters only where scope grants are enforced (elsewhere no row matches such a key, and the
-- long way says what is wrong with it). Run by the 0.9.3 plain script over a 0.9.2 install, or by ALTER
-- EXTENSION idempotency UPDATE after the 0.9.3 idempotency-tle.sql registered this path; in either case one
-- transaction, in the schema of the install.

-- Every function that changed in 0.9.3, from the sources.
-- (0.9.3's sql/edition/ 30-keys.sql: idem_claim, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_claim(key text, ttl interval DEFAULT NULL, scope text DEFAULT 'default',
                           fingerprint text DEFAULT NULL, wait boolean DEFAULT true)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, true, false);
    planned bigint;
    st idempotency.call_state;
    t interval;
    conflicted boolean;
    elsewhere boolean;
    h bigint;
    written_at timestamptz;
    c record;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(true, true, false);
    END IF;
    -- The common case (idempotency.fast_version): arguments within the limits (key and scope not empty and
    -- without control characters: one pattern over both, joined by one; a NULL one fails it), no record of
    -- the key outside the write partition, and the new row written there. The state comes from
    -- idempotency.cached_state, folded into each statement's plan. The write returns what the claim answers
    -- and the version of the constants it planned with; then sealed_upto must still match them and those of
    -- the first test. (The claim is not remembered for idem_complete: in READ COMMITTED it finds the row by
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
            RETURNING x.token, x.attempts, x.expires_at, x.created_at, (idempotency.cached_state()).upto
                 INTO idem_claim.token, idem_claim.attempts, idem_claim.expires_at, written_at, planned;
            IF planned OPERATOR(pg_catalog.=) ver
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                   OPERATOR(pg_catalog.=) ver THEN
                outcome := 'claimed';
                RETURN NEXT;
                RETURN;
            END IF;
            conflicted := planned IS NULL;   -- the key is in the write partition: claim_one reads it
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

-- (0.9.3's sql/edition/ 33-settle.sql: idem_complete, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_complete(key text, payload jsonb DEFAULT NULL, scope text DEFAULT 'default', token bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m text;
    ver bigint := idempotency.fast_version(false, false, true);
    st idempotency.call_state;
    h record;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(false, false, true);
    END IF;
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

-- (0.9.3's sql/edition/ 35-once.sql: idem_once, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_once(key text, scope text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, false, false);
    planned bigint;
    written_at timestamptz;
    st idempotency.call_state;
    fresh boolean;
    h bigint;
    maybe boolean;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(true, false, false);
    END IF;
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
            RETURNING x.created_at, (idempotency.cached_state()).upto INTO written_at, planned;
            IF planned IS NULL THEN
                RETURN false;   -- the key was there
            ELSIF planned OPERATOR(pg_catalog.=) ver
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

-- (0.9.3's sql/edition/ 40-batch.sql: idem_claim_batch idem_once_batch, as scripts/sql-edition --expand wrote it in)
CREATE OR REPLACE FUNCTION idem_claim_batch(keys text[], ttl interval DEFAULT NULL, scope text DEFAULT 'default')
RETURNS TABLE (key text, outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, true, false);
    s idempotency.settings;
    t interval;
    st idempotency.call_state;
    c record;
    k text;
    answers idempotency.claim_answer[];
    w_from timestamptz;
    w_to timestamptz;
    iver bigint;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(true, true, false);
    END IF;
    -- The common case, as idem_once_batch's, and a ttl within the limits.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_claim_batch.keys, idem_claim_batch.scope)
       AND (CASE WHEN idem_claim_batch.ttl IS NULL THEN (idempotency.cached_state()).lease_ttl_ok
                 ELSE idem_claim_batch.ttl OPERATOR(pg_catalog.>) '0'::interval
                      AND idem_claim_batch.ttl OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_lease_ttl END)
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_claim_batch.keys)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_claim_batch.scope);
        END IF;
        t := coalesce(idem_claim_batch.ttl, (idempotency.cached_state()).lease_ttl);
        st := idempotency.cached_state();
    ELSE
        s := idempotency.check_batch('idem_claim_batch', idem_claim_batch.keys, idem_claim_batch.scope);
        t := idempotency.check_ttl(idem_claim_batch.ttl, s.lease_ttl, s.max_lease_ttl);
        st := idempotency.call_state(NULL, true);
        IF st.stale_seal THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope);
        END IF;
    END IF;
    -- The keys no other partition holds, written at once, in key order, when the state's constants
    -- (idempotency.cached_state, folded into the statement's plan) are current; the write says the version
    -- it planned with, checked against sealed_upto after it (as idem_claim's). Otherwise, or when a seal
    -- moved past the write partition meanwhile (the rows deleted), every key goes the long way below.
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        WITH fresh AS (
            -- (Each key's hash computed once, in a subquery that OFFSET 0 keeps apart: inlined into the filters'
            -- lookup, it was computed again for the index condition and for every row of the key's bucket.)
            SELECT DISTINCT u.k
              FROM (SELECT v.k, CASE WHEN (idempotency.cached_state()).filtered
                                     THEN idempotency.key_hash(v.k, idem_claim_batch.scope) END AS h
                      FROM pg_catalog.unnest(idem_claim_batch.keys) AS v(k) OFFSET 0) u
             WHERE NOT ((idempotency.cached_state()).filtered
                        AND EXISTS (SELECT FROM idempotency.sealed_key_matches(u.h)))
               AND (NOT ((idempotency.cached_state()).unfiltered_from IS NOT NULL OR (idempotency.cached_state()).probe_ahead)
                    OR NOT EXISTS (SELECT FROM idempotency.records x
                                    WHERE x.key OPERATOR(pg_catalog.=) u.k AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope
                                      AND ((x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                                            AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                                           OR ((idempotency.cached_state()).probe_ahead
                                               AND x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to))))),
        written AS (
            INSERT INTO idempotency.records AS x (scope, key, status, token, attempts, created_at, updated_at, expires_at)
            SELECT idem_claim_batch.scope, f.k, 'pending', pg_catalog.nextval('idempotency.token_seq'), 1,
                   idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                   pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) t
              FROM fresh f ORDER BY f.k
            ON CONFLICT DO NOTHING
            RETURNING x.key, x.token, x.attempts, x.expires_at)
        SELECT pg_catalog.array_agg(ROW(wr.key, 'claimed', wr.token, wr.attempts, NULL, wr.expires_at)::idempotency.claim_answer),
               (idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to, (idempotency.cached_state()).upto
          INTO answers, w_from, w_to, iver FROM written wr;
        IF answers IS NOT NULL
           AND (iver OPERATOR(pg_catalog.<>) st.upto
                OR coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.<>) iver) THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
            -- (The rows just written, found by key in the range of the partition written (the constants the
            -- write planned with; a row trigger may have moved a row's created_at, but not out of its partition)
            -- and as written by this transaction: each key's one such row. Not by key alone: while a seal is
            -- under way, the long way of an earlier call of this transaction may have written a key into the
            -- next partition. Their addresses are not collected for this rare case: that cost every batch 1,600
            -- instructions a key.)
            DELETE FROM idempotency.records x
             WHERE x.created_at OPERATOR(pg_catalog.>=) w_from AND x.created_at OPERATOR(pg_catalog.<) w_to
               AND x.key OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT a.key FROM pg_catalog.unnest(answers) a))
               AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope AND idempotency.written_here(x.xmin);
            answers := NULL;
            st := idempotency.call_state(NULL, true);
        END IF;
        -- Keys whose record in the write partition is settled (a batch delivered again): answered from those rows
        -- in one read, as idempotency.claim_one answers them (a seal since changes no row: the answers stand).
        -- Not when every key was written.
        IF coalesce(pg_catalog.cardinality(answers), 0) OPERATOR(pg_catalog.<) pg_catalog.cardinality(idem_claim_batch.keys) THEN
            answers := coalesce(answers, '{}') OPERATOR(pg_catalog.||) ARRAY(
                SELECT ROW(x.key, x.status, CASE WHEN x.status OPERATOR(pg_catalog.=) 'completed' THEN x.token END, x.attempts,
                           CASE WHEN x.status OPERATOR(pg_catalog.=) 'completed' THEN x.payload ELSE x.error END,
                           NULL)::idempotency.claim_answer
                  FROM idempotency.records x
                 WHERE x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_from
                   AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_to
                   AND x.key OPERATOR(pg_catalog.=) ANY (idem_claim_batch.keys)
                   AND x.scope OPERATOR(pg_catalog.=) idem_claim_batch.scope
                   AND x.status OPERATOR(pg_catalog.=) ANY ('{completed,failed}'::text[]));
        END IF;
    END IF;
    answers := coalesce(answers, '{}');
    -- The others, one by one in key order: what the single claim answers. (None when there are as many
    -- answers as keys.)
    IF pg_catalog.cardinality(answers) OPERATOR(pg_catalog.<) pg_catalog.cardinality(idem_claim_batch.keys) THEN
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
        END LOOP;
    END IF;
    -- In input order; a repeated key gets its first occurrence's answer, but only the first owns a claim.
    -- (As many answers as keys: the keys are all different.)
    IF pg_catalog.cardinality(answers) OPERATOR(pg_catalog.=) pg_catalog.cardinality(idem_claim_batch.keys) THEN
        RETURN QUERY
        SELECT a.key, a.outcome, a.token, a.attempts, a.payload, a.expires_at
          FROM pg_catalog.unnest(idem_claim_batch.keys) WITH ORDINALITY AS u(k, i)
          JOIN pg_catalog.unnest(answers) a ON a.key OPERATOR(pg_catalog.=) u.k
         ORDER BY u.i;
        RETURN;
    END IF;
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

CREATE OR REPLACE FUNCTION idem_once_batch(keys text[], scope text DEFAULT 'default') RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, false, false);
    st idempotency.call_state;
    fresh text[];
    w_from timestamptz;
    w_to timestamptz;
    iver bigint;
    maybes text[];
    slow boolean := true;
    k text;
    one boolean;
BEGIN
    IF ver OPERATOR(pg_catalog.<) 0 THEN
        ver := idempotency.fast_version_native(true, false, false);
    END IF;
    -- The common case, as idem_once's (idempotency.fast_version, and no idempotency.max_batch_keys of the
    -- session): the arguments checked at once (the control characters by one pattern over the keys joined and
    -- the scope, the rest key by key in one statement), the state from idempotency.cached_state. Anything
    -- else, a bad argument included, takes the long way, which checks in the native extension's order.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_once_batch.keys, idem_once_batch.scope)
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_once_batch.keys)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_once_batch.scope);
        END IF;
        st := idempotency.cached_state();
    ELSE
        PERFORM idempotency.check_batch('idem_once_batch', idem_once_batch.keys, idem_once_batch.scope);
        st := idempotency.call_state(NULL, true);
        IF st.stale_seal THEN
            PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope);
        END IF;
    END IF;
    -- As idem_claim_batch: the new keys in one write with the state's constants when they are current, else
    -- (or when a seal moved past the write partition meanwhile) key by key the long way (idempotency.once_one).
    -- A key whose print matched in the key filters of the sealed partitions is not written here: it goes
    -- the long way, after the others.
    IF st.upto OPERATOR(pg_catalog.=) (idempotency.cached_state()).upto THEN
        -- (Apart from the write, and only where a filter exists: a list of the keys that both statements read
        -- would be materialized, which cost every batch 3,500 instructions a key.)
        IF (idempotency.cached_state()).filtered THEN
            -- (Each key's hash computed once, as in idem_claim_batch.)
            maybes := ARRAY(SELECT DISTINCT u.k
                              FROM (SELECT v.k, idempotency.key_hash(v.k, idem_once_batch.scope) AS h
                                      FROM pg_catalog.unnest(idem_once_batch.keys) AS v(k) OFFSET 0) u
                             WHERE EXISTS (SELECT FROM idempotency.sealed_key_matches(u.h)));
            -- (None matched, as in most batches: NULL, so that neither the write's test nor the long way runs.)
            IF pg_catalog.cardinality(maybes) OPERATOR(pg_catalog.=) 0 THEN
                maybes := NULL;
            END IF;
        END IF;
        WITH written AS (
            INSERT INTO idempotency.records AS x (scope, key, status, attempts, created_at, updated_at)
            SELECT idem_once_batch.scope, d.k, 'completed', 1,
                   idempotency.created_at((idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to),
                   pg_catalog.now()
              -- (DISTINCT by the sort that orders the write: hashing the keys, then sorting them, cost more)
              FROM (SELECT DISTINCT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k) ORDER BY u.k) d
             -- (a hashed subplan, built once: linear in the batch; not run without maybes)
             WHERE (maybes IS NULL OR d.k NOT IN (SELECT m.k FROM pg_catalog.unnest(maybes) AS m(k)))
               AND (NOT ((idempotency.cached_state()).unfiltered_from IS NOT NULL OR (idempotency.cached_state()).probe_ahead)
                    OR NOT EXISTS (SELECT FROM idempotency.records o
                                    WHERE o.key OPERATOR(pg_catalog.=) d.k AND o.scope OPERATOR(pg_catalog.=) idem_once_batch.scope
                                      AND ((o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).unfiltered_from
                                            AND o.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_from)
                                           OR ((idempotency.cached_state()).probe_ahead
                                               AND o.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_to))))
             ORDER BY d.k
            ON CONFLICT DO NOTHING
            RETURNING x.key)
        SELECT pg_catalog.array_agg(wr.key), (idempotency.cached_state()).w_from, (idempotency.cached_state()).w_to,
               (idempotency.cached_state()).upto
          INTO fresh, w_from, w_to, iver FROM written wr;
        IF fresh IS NULL
           OR (iver OPERATOR(pg_catalog.=) st.upto
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.=) iver) THEN
            slow := false;
        ELSE
            PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
            -- (The rows just written, by key in the range written, as in idem_claim_batch.)
            DELETE FROM idempotency.records x
             WHERE x.created_at OPERATOR(pg_catalog.>=) w_from AND x.created_at OPERATOR(pg_catalog.<) w_to
               AND x.key OPERATOR(pg_catalog.=) ANY (fresh) AND x.scope OPERATOR(pg_catalog.=) idem_once_batch.scope
               AND idempotency.written_here(x.xmin);
            fresh := NULL;
            st := idempotency.call_state(NULL, true);
        END IF;
    END IF;
    IF slow OR maybes IS NOT NULL THEN
        FOR k IN SELECT DISTINCT u.k FROM pg_catalog.unnest(CASE WHEN slow THEN idem_once_batch.keys ELSE maybes END) AS u(k)
                  ORDER BY u.k LOOP
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
    -- In input order, each new key once. (Every key new: a key is written once, so the keys are all different,
    -- and they are the answer as given.)
    IF pg_catalog.cardinality(fresh) OPERATOR(pg_catalog.=) pg_catalog.cardinality(idem_once_batch.keys) THEN
        RETURN QUERY SELECT u.k FROM pg_catalog.unnest(idem_once_batch.keys) AS u(k);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT v.k FROM (SELECT u.k, pg_catalog.min(u.i) AS i
                       FROM pg_catalog.unnest(idem_once_batch.keys) WITH ORDINALITY AS u(k, i)
                       JOIN pg_catalog.unnest(fresh) AS f(k) ON f.k OPERATOR(pg_catalog.=) u.k
                      GROUP BY u.k) v
     ORDER BY v.i;
END
$$;

-- (0.9.3's sql/edition/ 90-finalize.sql, as scripts/sql-edition --expand wrote it in)
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
