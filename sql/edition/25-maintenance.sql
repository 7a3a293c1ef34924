-- The SQL edition: maintenance. idem_maintenance() makes partitions ahead, seals past ones, drops expired
-- ones and reclaims stuck leases (20-partitions.sql has the pieces); pg_cron or any scheduler calls it.

-- One maintenance round: partitions made ahead, past ones sealed, expired ones dropped, stuck leases
-- reclaimed. What the native extension's worker does every maintenance_interval; here pg_cron or any
-- scheduler calls it (every minute is right: each round does only what is due).
CREATE FUNCTION idem_maintenance(as_of timestamptz DEFAULT pg_catalog.now())
RETURNS TABLE (partitions_created integer, partitions_dropped integer, partitions_deferred integer, leases_reclaimed bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings;
    p record;
    started timestamptz := pg_catalog.clock_timestamp();
    wait_ms integer;
    next_seal regclass;
    failure text;
    errors text[] := '{}';
BEGIN
    PERFORM idempotency.check_writable('idem_maintenance');
    IF as_of IS NULL THEN
        RAISE EXCEPTION 'idempotency: as_of must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT pg_catalog.isfinite(as_of) THEN
        RAISE EXCEPTION 'idempotency: as_of must be a finite timestamp' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO STRICT s FROM idempotency.settings;
    wait_ms := GREATEST(1, (EXTRACT(epoch FROM s.drop_lock_timeout) OPERATOR(pg_catalog.*) 1000)::integer);
    -- One round at a time; a round that finds another under way does nothing.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('idempotency.maintenance')::bigint) THEN
        RETURN QUERY SELECT 0, 0, 0, 0::bigint;
        RETURN;
    END IF;
    partitions_created := 0; partitions_dropped := 0; partitions_deferred := 0; leases_reclaimed := 0;
    -- Each step in a subtransaction of its own: one that fails (a partition a view depends on, say) is undone
    -- alone, reported (WARNING, and idempotency.maintenance_state()), and the others still run.
    BEGIN
        PERFORM idempotency.sync_partition_ranges();
        IF s.partition_manager OPERATOR(pg_catalog.=) 'builtin' THEN
            partitions_created := idempotency.premake_partitions(as_of);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('premake: ' OPERATOR(pg_catalog.||) failure);
    END;
    IF s.partition_manager OPERATOR(pg_catalog.<>) 'none' THEN
        -- Seal the past partitions, the oldest unsealed first, while the next one is there; stop at the first
        -- whose writers take longer than drop_lock_timeout (the next round tries again).
        LOOP
            SELECT r.partition INTO next_seal FROM idempotency.partition_ranges r
             WHERE r.range_from OPERATOR(pg_catalog.>=) idempotency.sealed_until()
               AND NOT EXISTS (SELECT FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) r.partition)
             ORDER BY r.range_from LIMIT 1;
            EXIT WHEN next_seal IS NULL OR NOT EXISTS (
                SELECT FROM idempotency.partition_ranges r JOIN idempotency.partition_ranges n
                    ON n.range_from OPERATOR(pg_catalog.=) r.range_to
                 WHERE r.partition OPERATOR(pg_catalog.=) next_seal AND r.range_to OPERATOR(pg_catalog.<=) as_of);
            BEGIN
                EXIT WHEN NOT idempotency.seal_partition_within(next_seal, wait_ms);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
                errors := errors OPERATOR(pg_catalog.||) ('seal: ' OPERATOR(pg_catalog.||) failure);
                EXIT;
            END;
            next_seal := NULL;
        END LOOP;
    END IF;
    -- The key filters of partitions sealed before this round (idempotency.filter_sealed): not of those it
    -- sealed itself, whose writers would wait for the filter behind the seal's lock.
    BEGIN
        PERFORM idempotency.filter_sealed(x.partition) FROM idempotency.sealed x
          WHERE x.filtered_keys IS NULL AND x.sealed_at OPERATOR(pg_catalog.<) pg_catalog.now()
          ORDER BY x.range_from;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('filter: ' OPERATOR(pg_catalog.||) failure);
    END;
    BEGIN
        PERFORM idempotency.mark_empty_ahead();
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('mark empty: ' OPERATOR(pg_catalog.||) failure);
    END;
    IF s.partition_manager OPERATOR(pg_catalog.=) 'builtin' THEN
        -- A partition is dropped a retention after its end, or after its seal when it holds keys written
        -- after its end: new keys go to the oldest unsealed partition, their created_at at its last
        -- microsecond, so each keeps its full retention (tests/clock/test_retention.py).
        FOR p IN SELECT r.partition FROM idempotency.partition_ranges r
                   JOIN idempotency.sealed x ON x.partition OPERATOR(pg_catalog.=) r.partition
                  WHERE r.range_to OPERATOR(pg_catalog.<=) (as_of OPERATOR(pg_catalog.-) s.retention)
                    AND (x.sealed_at OPERATOR(pg_catalog.<=) (as_of OPERATOR(pg_catalog.-) s.retention)
                         OR NOT idempotency.written_after_end(r.partition, r.range_to))
                  ORDER BY r.range_from
        LOOP
            BEGIN
                IF idempotency.drop_partition(p.partition, wait_ms) THEN
                    partitions_dropped := partitions_dropped OPERATOR(pg_catalog.+) 1;
                ELSE
                    partitions_deferred := partitions_deferred OPERATOR(pg_catalog.+) 1;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
                errors := errors OPERATOR(pg_catalog.||) ('drop ' OPERATOR(pg_catalog.||) p.partition::text
                                                          OPERATOR(pg_catalog.||) ': ' OPERATOR(pg_catalog.||) failure);
            END;
        END LOOP;
    END IF;
    BEGIN
        leases_reclaimed := idempotency.reclaim(as_of OPERATOR(pg_catalog.-) s.reclaim_after);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        errors := errors OPERATOR(pg_catalog.||) ('reclaim: ' OPERATOR(pg_catalog.||) failure);
    END;
    -- The key calls' cached state, written again (after a restore, or a change made under REPEATABLE READ).
    PERFORM idempotency.write_call_cache();
    FOREACH failure IN ARRAY errors LOOP
        RAISE WARNING 'idempotency maintenance: %', failure;
    END LOOP;
    UPDATE idempotency.maintenance_rounds m
       SET last_round_at = pg_catalog.clock_timestamp(),
           last_round_micros = (EXTRACT(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started)
                                OPERATOR(pg_catalog.*) 1000000)::bigint,
           rounds = m.rounds OPERATOR(pg_catalog.+) 1,
           failed_rounds = m.failed_rounds OPERATOR(pg_catalog.+) CASE WHEN pg_catalog.cardinality(errors) OPERATOR(pg_catalog.>) 0 THEN 1 ELSE 0 END,
           last_error = coalesce(errors[1], m.last_error),
           last_error_at = CASE WHEN pg_catalog.cardinality(errors) OPERATOR(pg_catalog.>) 0 THEN pg_catalog.clock_timestamp() ELSE m.last_error_at END;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION idem_maintenance(timestamptz) IS
'Runs one maintenance round now: creates the partitions due, drops expired ones and reclaims stuck leases. Returns what it did.';

-- True when the partition holds a key written after its end (created_at at its last microsecond: see
-- idempotency.created_at), which then keeps its retention from the partition's seal.
CREATE FUNCTION idempotency.written_after_end(part regclass, range_to timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found_late boolean;
BEGIN
    EXECUTE pg_catalog.format('SELECT EXISTS (SELECT FROM %s x WHERE x.created_at OPERATOR(pg_catalog.>=) %s)',
                              part, idempotency.ts_literal(range_to OPERATOR(pg_catalog.-) '1 microsecond'::interval))
       INTO found_late;
    RETURN found_late;
END
$$;

-- Marks the partitions ahead of the write partition that hold no row as known_empty, so that a key call
-- does not look for its key there (idempotency.call_state's probe_ahead). Only a write partition takes new
-- rows, and a partition ahead of it becomes one only after every partition before it is sealed, when key
-- calls no longer count it as ahead; a move (sql/move/import.sql) clears the marks.
CREATE FUNCTION idempotency.mark_empty_ahead() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p record;
    empty boolean;
BEGIN
    FOR p IN SELECT r.partition, r.partition_name FROM idempotency.partition_ranges r
              WHERE NOT r.known_empty
                AND r.range_from OPERATOR(pg_catalog.>=) (
                    SELECT w.range_to FROM idempotency.partition_ranges w
                     WHERE w.range_from OPERATOR(pg_catalog.>=) idempotency.sealed_until()
                     ORDER BY w.range_from LIMIT 1)
    LOOP
        EXECUTE pg_catalog.format('SELECT NOT EXISTS (SELECT FROM idempotency.%I)', p.partition_name) INTO empty;
        IF empty THEN
            UPDATE idempotency.partition_ranges r SET known_empty = true
             WHERE r.partition OPERATOR(pg_catalog.=) p.partition;
        END IF;
    END LOOP;
END
$$;

-- Deletes up to 1,000 keys whose lease expired before cutoff and that nobody took over; a row another
-- transaction is writing (locked) is left for the next round.
CREATE FUNCTION idempotency.reclaim(cutoff timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    WITH stuck AS (
        SELECT r.tableoid, r.ctid FROM idempotency.records r
         WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.expires_at OPERATOR(pg_catalog.<) cutoff
         ORDER BY r.expires_at LIMIT 1000
           FOR UPDATE SKIP LOCKED)
    DELETE FROM idempotency.records r USING stuck
     WHERE r.tableoid OPERATOR(pg_catalog.=) stuck.tableoid AND r.ctid OPERATOR(pg_catalog.=) stuck.ctid
       AND r.status OPERATOR(pg_catalog.=) 'pending' AND r.expires_at OPERATOR(pg_catalog.<) cutoff;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION idem_partman_handover() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.check_writable('idem_partman_handover');
    RAISE EXCEPTION 'idempotency: the SQL edition keeps its partitions itself (idem_maintenance)'
        USING ERRCODE = '55000', HINT = 'Schedule SELECT idem_maintenance() with pg_cron or an outside scheduler.';
END
$$;
COMMENT ON FUNCTION idem_partman_handover() IS
'Native extension only: hands the record table''s partitions to pg_partman. The SQL edition raises 55000.';
