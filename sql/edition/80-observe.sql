-- The SQL edition: what a DBA and a monitoring system read (sql/observe.sql, src/api/observe.rs).

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
GRANT EXECUTE ON FUNCTION idempotency.scope_stats() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.scope_stats() IS
'The counters behind idempotency.stats, per scope, in the order of its columns (lock waits in microseconds).';

CREATE FUNCTION idempotency.stats_totals()
RETURNS TABLE (counts bigint[], scopes bigint, enabled boolean, stats_reset timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.array_fill(0::bigint, ARRAY[17]), 0::bigint, false, NULL::timestamptz
$$;
REVOKE ALL ON FUNCTION idempotency.stats_totals() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.stats_totals() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.stats_totals() IS
'The counters behind idem_stats(), added up over the scopes of this database.';

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
GRANT EXECUTE ON FUNCTION idempotency.maintenance_state() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.maintenance_state() IS
'The last maintenance round of this database since the server started (worker or idem_maintenance()), how many ran and failed, the last error. Empty without the library preloaded.';

CREATE VIEW idempotency.stats AS
SELECT s.scope,
       s.counts[1]  AS claims,
       s.counts[2]  AS claimed_new,
       s.counts[3]  AS takeovers,
       s.counts[4]  AS retries,
       s.counts[5]  AS answered_completed,
       s.counts[6]  AS answered_in_progress,
       s.counts[7]  AS answered_failed,
       s.counts[8]  AS answered_mismatch,
       s.counts[9]  AS poisoned,
       s.counts[10] AS dead_lettered,
       s.counts[11] AS stale_refused,
       s.counts[12] AS serialization_failures,
       s.counts[13] AS lock_waits,
       s.counts[14]::pg_catalog.float8 OPERATOR(pg_catalog./) 1000.0::pg_catalog.float8 AS lock_wait_ms,
       s.counts[15] AS completes,
       s.counts[16] AS fails,
       s.counts[17] AS heartbeats,
       s.stats_reset
  FROM idempotency.scope_stats() s;
GRANT SELECT ON idempotency.stats TO idempotency_admin, pg_monitor;
COMMENT ON VIEW idempotency.stats IS
'Cumulative counters per scope of this database since stats_reset (shared memory; needs shared_preload_libraries). Counted when the calling transaction ends, committed or not. scope NULL: the scopes beyond idempotency.stats_max_scopes. claims = claimed_new + takeovers + retries + answered_*.';

CREATE FUNCTION idem_stats()
RETURNS TABLE (claims bigint, claimed_new bigint, takeovers bigint, retries bigint,
               answered_completed bigint, answered_in_progress bigint, answered_failed bigint,
               answered_mismatch bigint, poisoned bigint, dead_lettered bigint, stale_refused bigint,
               serialization_failures bigint, lock_waits bigint, lock_wait_ms double precision,
               completes bigint, fails bigint, heartbeats bigint,
               scopes bigint, enabled boolean, stats_reset timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT t.counts[1], t.counts[2], t.counts[3], t.counts[4], t.counts[5], t.counts[6], t.counts[7],
       t.counts[8], t.counts[9], t.counts[10], t.counts[11], t.counts[12], t.counts[13],
       t.counts[14]::pg_catalog.float8 OPERATOR(pg_catalog./) 1000.0::pg_catalog.float8,
       t.counts[15], t.counts[16], t.counts[17],
       t.scopes, t.enabled, t.stats_reset
  FROM idempotency.stats_totals() t
$$;
REVOKE ALL ON FUNCTION idem_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idem_stats() IS
'The counters of idempotency.stats added up over all scopes of this database, with the number of scopes, whether counting is on (library preloaded and idempotency.stats on) and the oldest stats_reset.';

CREATE FUNCTION idem_stats_reset(scope text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.notice_no_stats();
    RETURN pg_catalog.clock_timestamp();
END
$$;
REVOKE ALL ON FUNCTION idem_stats_reset(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats_reset(text) TO idempotency_admin;
COMMENT ON FUNCTION idem_stats_reset(text) IS
'Zeroes the counters of one scope, or of all scopes of this database (NULL); returns the time of the reset. For idempotency_admin.';

-- Keys that are pending: held by a live lease, with an ended lease nobody took over yet, or released by a
-- retryable failure.
CREATE VIEW idempotency.in_flight AS
SELECT r.scope,
       r.key,
       CASE WHEN r.token IS NULL THEN 'released'
            WHEN r.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() THEN 'leased'
            ELSE 'expired' END AS state,
       r.token,
       r.attempts,
       r.created_at,
       r.updated_at,
       r.expires_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) r.created_at AS age
  FROM idempotency.records r
 WHERE r.expires_at IS NOT NULL AND r.status OPERATOR(pg_catalog.=) 'pending';
GRANT SELECT ON idempotency.in_flight TO idempotency_admin;
COMMENT ON VIEW idempotency.in_flight IS
'Pending keys: state leased (live lease), expired (lease ended, not taken over yet) or released (a retryable failure, waiting for the next claim); age = now - created_at.';

-- Terminal failures: idem_fail(retryable => false), retryable failures past max_attempts, poison messages.
CREATE VIEW idempotency.dead_letters AS
SELECT r.scope,
       r.key,
       r.error,
       r.attempts,
       r.created_at,
       r.updated_at AS failed_at
  FROM idempotency.records r
 WHERE r.status OPERATOR(pg_catalog.=) 'failed';
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;
COMMENT ON VIEW idempotency.dead_letters IS
'Terminal failures with their stored error: idem_fail(retryable => false), retries past idempotency.max_attempts, poison messages. idem_redrive makes them claimable again.';

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
