-- The SQL edition: idem_complete_batch, the keys of a batch settled at once (the batch claims and
-- idem_once_batch are in 40-batch.sql, with the argument tests they share).

CREATE FUNCTION idem_complete_batch(keys text[], payloads jsonb[] DEFAULT NULL, scope text DEFAULT 'default',
                                    tokens bigint[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_nestloop = off AS $$
DECLARE
    ver bigint := idempotency.fast_version(false, false, true, idempotency.cached_state());
    s idempotency.settings;
    n integer := coalesce(pg_catalog.cardinality(idem_complete_batch.keys), 0);
    one record;
    h record;
    done integer;
    done_keys text[];
BEGIN
    -- The keys, the scope and the size at once in the common case, as in idem_once_batch; the rest below.
    IF ver OPERATOR(pg_catalog.>=) 0
       AND idempotency.batch_args_fast(idem_complete_batch.keys, idem_complete_batch.scope, idempotency.cached_state())
       AND NOT EXISTS (SELECT FROM idempotency.bad_keys(idem_complete_batch.keys, (idempotency.cached_state()).max_key_bytes)) THEN
        IF (idempotency.cached_state()).grants_enforced THEN
            PERFORM idempotency.authorize_enforced('scope', idem_complete_batch.scope);
        END IF;
        s.max_payload_bytes := (idempotency.cached_state()).max_payload_bytes;
    ELSE
        s := idempotency.check_batch('idem_complete_batch', idem_complete_batch.keys, idem_complete_batch.scope);
    END IF;
    IF (SELECT pg_catalog.count(DISTINCT u.k) FROM pg_catalog.unnest(idem_complete_batch.keys) u(k)) OPERATOR(pg_catalog.<>) n THEN
        RAISE EXCEPTION 'idempotency: keys must not repeat a key in idem_complete_batch' USING ERRCODE = '22023';
    END IF;
    IF payloads IS NOT NULL THEN
        IF coalesce(pg_catalog.cardinality(payloads), 0) OPERATOR(pg_catalog.<>) n THEN
            RAISE EXCEPTION 'idempotency: payloads has % elements but keys has %', coalesce(pg_catalog.cardinality(payloads), 0), n
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.unnest(payloads) AS u(p)
                    WHERE pg_catalog.pg_column_compression(u.p) IS NOT NULL
                       OR pg_catalog.pg_column_size(u.p) OPERATOR(pg_catalog.>=) (s.max_payload_bytes OPERATOR(pg_catalog.-) 4)) THEN
            PERFORM idempotency.check_document('payload', p, s.max_payload_bytes) FROM pg_catalog.unnest(payloads) AS u(p);
        END IF;
    END IF;
    IF tokens IS NOT NULL THEN
        IF coalesce(pg_catalog.cardinality(tokens), 0) OPERATOR(pg_catalog.<>) n THEN
            RAISE EXCEPTION 'idempotency: tokens has % elements but keys has %', coalesce(pg_catalog.cardinality(tokens), 0), n
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.unnest(tokens) AS u(t) WHERE u.t OPERATOR(pg_catalog.<=) 0) THEN
            PERFORM idempotency.check_token(t) FROM pg_catalog.unnest(tokens) AS u(t);
        END IF;
    END IF;
    -- The keys held in the write partition in one statement: by the given token, or, without one, by a claim
    -- of this transaction (a row it wrote outside a subtransaction). The others key by key, in key order:
    -- held_row finds them (a claim made in a subtransaction too), or says why not.
    WITH updated AS (
        UPDATE idempotency.records x
           SET status = 'completed', payload = idem_complete_batch.payloads[v.i], updated_at = pg_catalog.clock_timestamp(),
               expires_at = NULL
          FROM pg_catalog.unnest(idem_complete_batch.keys) WITH ORDINALITY AS v(k, i)
         WHERE x.created_at OPERATOR(pg_catalog.>=) (idempotency.cached_state()).w_from
           AND x.created_at OPERATOR(pg_catalog.<) (idempotency.cached_state()).w_to
           AND x.key OPERATOR(pg_catalog.=) v.k AND x.scope OPERATOR(pg_catalog.=) idem_complete_batch.scope
           -- (the keys again, as an index condition: the plan looks each one up whatever the statistics say, and
           -- joins them to their positions by hashing, enable_nestloop being off: time linear in the batch)
           AND x.key OPERATOR(pg_catalog.=) ANY (idem_complete_batch.keys)
           AND x.status OPERATOR(pg_catalog.=) 'pending'
           AND CASE WHEN idem_complete_batch.tokens[v.i] IS NOT NULL THEN x.token OPERATOR(pg_catalog.=) idem_complete_batch.tokens[v.i]
                    ELSE x.token IS NOT NULL
                         AND x.xmin OPERATOR(pg_catalog.=) pg_catalog.xid(pg_catalog.pg_current_xact_id()) END
        RETURNING x.key)
    SELECT pg_catalog.count(*)::integer, pg_catalog.array_agg(u.key) INTO done, done_keys FROM updated u;
    IF done OPERATOR(pg_catalog.<) n THEN
        FOR one IN SELECT v.k, v.i FROM pg_catalog.unnest(idem_complete_batch.keys) WITH ORDINALITY AS v(k, i)
                    WHERE v.k NOT IN (SELECT d.k FROM pg_catalog.unnest(done_keys) AS d(k)) ORDER BY v.k LOOP
            h := idempotency.held_row(one.k, idem_complete_batch.scope, tokens[one.i]);
            UPDATE idempotency.records x
               SET status = 'completed', payload = payloads[one.i], updated_at = pg_catalog.clock_timestamp(), expires_at = NULL
             WHERE x.tableoid OPERATOR(pg_catalog.=) h.part AND x.ctid OPERATOR(pg_catalog.=) h.row_ctid;
            done := done OPERATOR(pg_catalog.+) 1;
        END LOOP;
    END IF;
    RETURN done;
END
$$;
