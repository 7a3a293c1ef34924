-- The SQL edition: batches. New keys are written by one multi-row INSERT ... ON CONFLICT DO NOTHING in
-- key order (so that two overlapping batches wait for each other in one order and never deadlock); the
-- keys that met a row go through the single calls' path.

-- The keys argument checked as the native extension checks it: NULL array or element 22004, more than
-- max_batch_keys 54000 (before any key is read), each key as idem_claim's.
CREATE FUNCTION idempotency.too_many_keys(n integer, max_keys integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: batch has % keys, over the limit of %', n, max_keys
        USING ERRCODE = '54000', HINT = 'The limit is set by idempotency.max_batch_keys; split the batch.';
END
$$;

CREATE FUNCTION idempotency.check_keys(keys text[], s idempotency.settings) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n integer := coalesce(pg_catalog.cardinality(keys), 0);
    bad text;
    found_bad boolean;
BEGIN
    IF keys IS NULL THEN
        RAISE EXCEPTION 'idempotency: keys must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF n OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        PERFORM idempotency.too_many_keys(n, s.max_batch_keys);
    END IF;
    -- One pass finds the first key check_ident would refuse; that key alone goes through it, for its error.
    SELECT true, u.k INTO found_bad, bad
      FROM pg_catalog.unnest(keys) WITH ORDINALITY AS u(k, i)
     WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) s.max_key_bytes
        OR u.k OPERATOR(pg_catalog.~) '[\u0001-\u001f\u007f-\u009f]'
     ORDER BY u.i LIMIT 1;
    IF found_bad THEN
        PERFORM idempotency.check_ident('key', bad, s.max_key_bytes);
    END IF;
END
$$;

-- The long way's checks of a batch's arguments, in the native extension's order: a read-only transaction
-- 25006, the size 54000 (first, before any key is read), each key (check_keys), the scope, its grant. The
-- limits in force (idempotency.config) for the rest of the call.
CREATE FUNCTION idempotency.check_batch(fn text, keys text[], scope text) RETURNS idempotency.settings
LANGUAGE plpgsql AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    PERFORM idempotency.check_writable(fn);
    IF pg_catalog.cardinality(keys) OPERATOR(pg_catalog.>) s.max_batch_keys THEN
        PERFORM idempotency.too_many_keys(pg_catalog.cardinality(keys), s.max_batch_keys);
    END IF;
    PERFORM idempotency.check_keys(keys, s);
    PERFORM idempotency.check_ident('scope', scope, s.max_key_bytes);
    PERFORM idempotency.authorize('scope', scope, s);
    RETURN s;
END
$$;

-- The common case of a batch's arguments, for the batches' single test (as idem_claim's with
-- idempotency.fast_version): no idempotency.max_batch_keys of the session (or the native library's default,
-- where it changes nothing, as fast_version takes it; not '', which the long way reads as no value of the
-- session but keeps a value of its role or database), the size and the scope within the limits of st (the
-- caller's idempotency.cached_state(), passed as fast_version's is), and no control character in the keys or
-- the scope (one pattern over the keys joined and the scope); with NOT EXISTS (SELECT FROM
-- idempotency.bad_keys(keys, max_key_bytes)) for the rest. Anything else takes the long way, which checks in
-- the native extension's order. Where the library has idempotency.edition_common_path (st.common_path_guc),
-- that setting says whether max_batch_keys has its default (read here, in this expression's own plan: the
-- callers' fast_version was planned apart, possibly with another state). (SQL without a subquery: inlined
-- into the calls.)
CREATE FUNCTION idempotency.batch_args_fast(keys text[], scope text, st idempotency.call_state) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN st.common_path_guc
                THEN idempotency.common_path_says('%,batch')
                WHEN st.native_defaults_ok
                THEN pg_catalog.pg_settings_get_flags('idempotency.max_batch_keys') OPERATOR(pg_catalog.=) '{}'::text[]
                     AND pg_catalog.current_setting('idempotency.max_batch_keys', true) OPERATOR(pg_catalog.=) '1000'
                ELSE pg_catalog.current_setting('idempotency.max_batch_keys', true) IS NULL END
       AND pg_catalog.cardinality(keys) OPERATOR(pg_catalog.<=) st.max_batch_keys
       AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) st.max_key_bytes
       AND (pg_catalog.array_to_string(keys, '') OPERATOR(pg_catalog.||) E'\u0001' OPERATOR(pg_catalog.||) scope)
           OPERATOR(pg_catalog.~) '^[^\u0001-\u001f\u007f-\u009f]*\u0001[^\u0001-\u001f\u007f-\u009f]+$'
$$;

-- The keys of a batch that are NULL, empty or longer than max_bytes (the caller's
-- (idempotency.cached_state()).max_key_bytes, as fast_version's state). (A set-returning SQL function:
-- inlined into the calls' NOT EXISTS.)
CREATE FUNCTION idempotency.bad_keys(keys text[], max_bytes integer) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT u.k FROM pg_catalog.unnest(keys) AS u(k)
     WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.=) ''
        OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) max_bytes
$$;

-- One answer of a batch claim.
CREATE TYPE idempotency.claim_answer AS (key text, outcome text, token bigint, attempts integer, payload jsonb,
                                         expires_at timestamptz);

CREATE FUNCTION idem_claim_batch(keys text[], ttl interval DEFAULT NULL, scope text DEFAULT 'default')
RETURNS TABLE (key text, outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, true, false, idempotency.cached_state());
    s idempotency.settings;
    t interval;
    st idempotency.call_state;
    c record;
    k text;
    answers idempotency.claim_answer[];
    wgen bigint;
BEGIN
    -- The common case, as idem_once_batch's, and a ttl within the limits.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_claim_batch.keys, idem_claim_batch.scope, idempotency.cached_state())
       AND (CASE WHEN idem_claim_batch.ttl IS NULL THEN (idempotency.cached_state()).lease_ttl_ok
                 ELSE idem_claim_batch.ttl OPERATOR(pg_catalog.>) '0'::interval
                      AND idem_claim_batch.ttl OPERATOR(pg_catalog.<=) (idempotency.cached_state()).max_lease_ttl END)
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_claim_batch.keys, (idempotency.cached_state()).max_key_bytes)) THEN
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
    -- (idempotency.cached_state, folded into the statement's plan) are st's (its generation); the statement's
    -- outer SELECT says the generation its own part was planned with (wgen: planned last, after the write's
    -- source, whose WHERE holds the test of st's generation: keep them so), and sealed_upto is checked after it
    -- (as idem_claim's). Otherwise, or when a seal moved past the write partition meanwhile (the rows deleted),
    -- every key goes the long way below.
    -- (st's generation, as in idem_once_batch: NULL when it came from the tables, or when the snapshot does
    -- not see a filter the state counts on.)
    IF st.gen OPERATOR(pg_catalog.=) (idempotency.cached_state()).gen THEN
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
              FROM fresh f
             -- (Written only with st's state: the statement is planned again at its first lock if the state
             -- was replaced since the test above, and may then hold another one, a filter the snapshot does
             -- not see, or one written under REPEATABLE READ, without a write partition.)
             WHERE (idempotency.cached_state()).gen OPERATOR(pg_catalog.=) st.gen
             ORDER BY f.k
            ON CONFLICT DO NOTHING
            RETURNING x.key, x.token, x.attempts, x.expires_at)
        SELECT pg_catalog.array_agg(ROW(wr.key, 'claimed', wr.token, wr.attempts, NULL, wr.expires_at)::idempotency.claim_answer),
               (idempotency.cached_state()).gen
          INTO answers, wgen FROM written wr;
        IF wgen IS DISTINCT FROM st.gen
           OR (answers IS NOT NULL
               AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.<>) st.upto) THEN
            -- (A seal since st: under REPEATABLE READ and SERIALIZABLE the snapshot may miss its rows. Another
            -- change of the state: what was written is deleted, and the keys go one by one.)
            PERFORM idempotency.seal_conflict('(batch)', idem_claim_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
                AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                    OPERATOR(pg_catalog.<>) st.upto;
            -- (The rows just written, found by key in the range of st's write partition and as written by this
            -- transaction: each key's one such row. Rows are written only where the write's own constants are
            -- st's generation, so they lie in st's range whatever the constants of the statement's outer SELECT
            -- (wgen): a state replaced while the statement was planned (an invalidation taken in at a lock the
            -- planning takes anew, a catalog's on a cache miss among them) gives its later parts the new state's
            -- constants, and a range taken from there missed the rows, which the long way then answered
            -- in_progress (0.9.5; 0.9.6 fixes it: tests/multisession/test_batch_replan.py). A row trigger may
            -- have moved a row's created_at, but not out of its partition. Not by key alone: while a seal is
            -- under way, the long way of an earlier call of this transaction may have written a key into the
            -- next partition. Their addresses are not collected for this rare case: that cost every batch 1,600
            -- instructions a key.)
            DELETE FROM idempotency.records x
             WHERE answers IS NOT NULL
               AND x.created_at OPERATOR(pg_catalog.>=) st.w_from AND x.created_at OPERATOR(pg_catalog.<) st.w_to
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

CREATE FUNCTION idem_once_batch(keys text[], scope text DEFAULT 'default') RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ver bigint := idempotency.fast_version(true, false, false, idempotency.cached_state());
    st idempotency.call_state;
    fresh text[];
    wgen bigint;
    maybes text[];
    slow boolean := true;
    k text;
    one boolean;
BEGIN
    -- The common case, as idem_once's (idempotency.fast_version, and idempotency.batch_args_fast's test of
    -- idempotency.max_batch_keys): the arguments checked at once (the control characters by one pattern over the keys joined and
    -- the scope, the rest key by key in one statement), the state from idempotency.cached_state. Anything
    -- else, a bad argument included, takes the long way, which checks in the native extension's order.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_once_batch.keys, idem_once_batch.scope, idempotency.cached_state())
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_once_batch.keys, (idempotency.cached_state()).max_key_bytes)) THEN
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
    -- (st's generation: the state the guards read, or NULL when it came from the tables, or when the snapshot
    -- does not see a filter the state counts on: idempotency.call_state.)
    IF st.gen OPERATOR(pg_catalog.=) (idempotency.cached_state()).gen THEN
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
             -- (Written only with st's state, as in idem_claim_batch. maybes: a hashed subplan, built once:
             -- linear in the batch; not run without maybes.)
             WHERE (idempotency.cached_state()).gen OPERATOR(pg_catalog.=) st.gen
               AND (maybes IS NULL OR d.k NOT IN (SELECT m.k FROM pg_catalog.unnest(maybes) AS m(k)))
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
        SELECT pg_catalog.array_agg(wr.key), (idempotency.cached_state()).gen INTO fresh, wgen FROM written wr;
        -- (One state from st to the write, as in idem_claim: the filters' statement and the write may have
        -- been planned again after the state was replaced: edition_filter_race.spec.)
        IF wgen OPERATOR(pg_catalog.=) st.gen
           AND (fresh IS NULL
                OR coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0) OPERATOR(pg_catalog.=) st.upto) THEN
            slow := false;
        ELSE
            -- (A seal since st: under REPEATABLE READ and SERIALIZABLE, the snapshot may miss its rows. Another
            -- change of the state: the keys go one by one.)
            PERFORM idempotency.seal_conflict('(batch)', idem_once_batch.scope)
              WHERE pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
                AND coalesce(pg_catalog.pg_sequence_last_value('idempotency.sealed_upto'::pg_catalog.regclass), 0)
                    OPERATOR(pg_catalog.<>) st.upto;
            -- (The rows just written, by key in st's range, as in idem_claim_batch: rows are written only with
            -- st's constants, whatever wgen says.)
            DELETE FROM idempotency.records x
             WHERE fresh IS NOT NULL AND x.created_at OPERATOR(pg_catalog.>=) st.w_from AND x.created_at OPERATOR(pg_catalog.<) st.w_to
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
