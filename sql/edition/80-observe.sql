-- The SQL edition: what a DBA and a monitoring system read (sql/observe.sql, src/api/observe.rs). The views
-- idempotency.stats, in_flight and dead_letters and idem_stats() are the native extension's, from
-- sql/observe.sql (the manifest names them), over the functions here.

-- Observability. No shared memory in this edition, so no counters: idempotency.stats has no row and
-- idem_stats() shows zeros with enabled false (a NOTICE says why, as the native extension does without its
-- library preloaded). idem_metrics() is computed from the tables, as the native one is; its maintenance
-- columns come from idempotency.maintenance_rounds (kept by idem_maintenance()), and worker_running is
-- false: there is no background worker, pg_cron or another scheduler calls idem_maintenance().
-------------------------------------------------------------------------------------------------------------

CREATE FUNCTION idempotency.notice_no_stats() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'idempotency statistics are not kept by the SQL edition: idem_metrics() reads the figures from the tables';
END
$$;

CREATE FUNCTION idempotency.scope_stats()
RETURNS TABLE (scope text, counts bigint[], stats_reset timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.notice_no_stats();
END
$$;
REVOKE ALL ON FUNCTION idempotency.scope_stats() FROM PUBLIC;

CREATE FUNCTION idempotency.stats_totals()
RETURNS TABLE (counts bigint[], scopes bigint, enabled boolean, stats_reset timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.array_fill(0::bigint, ARRAY[17]), 0::bigint, false, NULL::timestamptz
$$;
REVOKE ALL ON FUNCTION idempotency.stats_totals() FROM PUBLIC;

-- The last maintenance round (idem_maintenance()), how many ran and failed, the last error: no row before
-- the first round.
CREATE FUNCTION idempotency.maintenance_state()
RETURNS TABLE (last_round_at timestamptz, last_round_micros bigint, rounds bigint, failed_rounds bigint,
               last_error text, last_error_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT m.last_round_at, coalesce(m.last_round_micros, 0::bigint), m.rounds, m.failed_rounds,
           m.last_error, m.last_error_at
      FROM idempotency.maintenance_rounds m
     WHERE m.rounds OPERATOR(pg_catalog.>) 0::bigint OR m.failed_rounds OPERATOR(pg_catalog.>) 0::bigint
        OR m.last_round_at IS NOT NULL
$$;
REVOKE ALL ON FUNCTION idempotency.maintenance_state() FROM PUBLIC;

CREATE FUNCTION idem_stats_reset(scope text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.notice_no_stats();
    RETURN pg_catalog.clock_timestamp();
END
$$;
REVOKE ALL ON FUNCTION idem_stats_reset(text) FROM PUBLIC;

-- A health snapshot, computed now: one row per scope that has records (one row with scope NULL when none
-- has), the database-wide figures repeated on each. Reads every retained record once. The partitions are
-- those attached to idempotency.records (pg_inherits), their ranges those idempotency.partition_ranges
-- keeps.
CREATE FUNCTION idem_metrics()
RETURNS TABLE (scope text, retained_keys bigint, completed_keys bigint, in_flight bigint,
               oldest_lease_age interval, expired_leases bigint, awaiting_retry bigint,
               dead_letters bigint, last_dead_letter_at timestamptz,
               partitions integer, sealed_partitions integer, premade_until timestamptz,
               premade_ahead interval, last_round_at timestamptz, last_round_duration interval,
               rounds bigint, failed_rounds bigint, last_error text, last_error_at timestamptz,
               worker_running boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
WITH k AS (
    SELECT r.scope,
           pg_catalog.count(*) AS retained_keys,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'completed') AS completed_keys,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.token IS NOT NULL
                              AND r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS in_flight,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
               pg_catalog.min(r.created_at) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending'
                                                      AND r.token IS NOT NULL
                                                      AND r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())
               AS oldest_lease_age,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.token IS NOT NULL
                              AND NOT coalesce(r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false))
               AS expired_leases,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'pending' AND r.token IS NULL) AS awaiting_retry,
           pg_catalog.count(*) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'failed') AS dead_letters,
           pg_catalog.max(r.updated_at) FILTER (WHERE r.status OPERATOR(pg_catalog.=) 'failed') AS last_dead_letter_at
      FROM idempotency.records r
     GROUP BY r.scope
), p AS (
    SELECT pg_catalog.count(*)::integer AS partitions,
           pg_catalog.count(x.partition)::integer AS sealed_partitions,
           pg_catalog.max(pr.range_to) AS premade_until
      FROM pg_catalog.pg_inherits i
      LEFT JOIN idempotency.sealed x ON x.partition OPERATOR(pg_catalog.=) i.inhrelid
      LEFT JOIN idempotency.partition_ranges pr ON pr.partition OPERATOR(pg_catalog.=) i.inhrelid
     WHERE i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid
), m AS (
    SELECT * FROM idempotency.maintenance_state()
)
SELECT k.scope::text,
       coalesce(k.retained_keys, 0), coalesce(k.completed_keys, 0), coalesce(k.in_flight, 0),
       k.oldest_lease_age, coalesce(k.expired_leases, 0), coalesce(k.awaiting_retry, 0),
       coalesce(k.dead_letters, 0), k.last_dead_letter_at,
       p.partitions, p.sealed_partitions, p.premade_until,
       p.premade_until OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp(),
       m.last_round_at,
       pg_catalog.make_interval(secs => m.last_round_micros::pg_catalog.float8 OPERATOR(pg_catalog./) 1e6::pg_catalog.float8),
       coalesce(m.rounds, 0), coalesce(m.failed_rounds, 0), m.last_error, m.last_error_at,
       false
  FROM p
  LEFT JOIN m ON true
  LEFT JOIN k ON true
 ORDER BY k.scope
$$;
REVOKE ALL ON FUNCTION idem_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_metrics() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idem_metrics() IS
'Health snapshot computed now, one row per scope: retained, completed, in flight, oldest in flight, expired leases, awaiting retry, dead letters; and for the database: partitions, premade_ahead, the maintenance rounds (needs the library preloaded), worker_running. Reads every retained record.';
