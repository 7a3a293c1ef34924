-- Observability: the views and functions a DBA and a monitoring system read. Runs after the generated
-- functions it uses (idempotency.scope_stats, stats_totals, maintenance_state); privileges and comments
-- are in finalize.sql.

-- Cumulative counters per scope, from shared memory (src/stats). The array's order is the Counter
-- enum's; lock waits are kept in microseconds.
-- The views' operators have operands of exactly their types (no planted lookalike in the schema
-- CREATE EXTENSION ran in can match better) and their functions are qualified.
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
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
SELECT t.counts[1], t.counts[2], t.counts[3], t.counts[4], t.counts[5], t.counts[6], t.counts[7],
       t.counts[8], t.counts[9], t.counts[10], t.counts[11], t.counts[12], t.counts[13],
       t.counts[14] / 1000.0::double precision, t.counts[15], t.counts[16], t.counts[17],
       t.scopes, t.enabled, t.stats_reset
  FROM idempotency.stats_totals() t
$$;
GRANT EXECUTE ON FUNCTION idem_stats() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idem_stats() IS
'The counters of idempotency.stats added up over all scopes of this database, with the number of scopes, whether counting is on (library preloaded and idempotency.stats on) and the oldest stats_reset.';

-- Keys that are pending: held by a live lease, with an ended lease nobody took over yet, or released
-- by a retryable failure. Pending rows always have expires_at, so the expires_at index finds them
-- without reading the settled ones.
CREATE VIEW idempotency.in_flight AS
SELECT r.scope,
       r.key,
       CASE WHEN r.token IS NULL THEN 'released'
            WHEN r.expires_at > pg_catalog.clock_timestamp() THEN 'leased'
            ELSE 'expired' END AS state,
       r.token,
       r.attempts,
       r.created_at,
       r.updated_at,
       r.expires_at,
       pg_catalog.clock_timestamp() - r.created_at AS age
  FROM idempotency.records r
 WHERE r.expires_at IS NOT NULL AND r.status = 'pending';
GRANT SELECT ON idempotency.in_flight TO idempotency_admin;
COMMENT ON VIEW idempotency.in_flight IS
'Pending keys: state leased (live lease), expired (lease ended, not taken over yet) or released (a retryable failure, waiting for the next claim); age = now - created_at.';

-- Terminal failures: idem_fail(retryable => false), retryable failures past idempotency.max_attempts,
-- and poison messages (error = {"error": "max_attempts_exceeded", ...}).
CREATE VIEW idempotency.dead_letters AS
SELECT r.scope,
       r.key,
       r.error,
       r.attempts,
       r.created_at,
       r.updated_at AS failed_at
  FROM idempotency.records r
 WHERE r.status = 'failed';
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;
COMMENT ON VIEW idempotency.dead_letters IS
'Terminal failures with their stored error: idem_fail(retryable => false), retries past idempotency.max_attempts, poison messages. idem_redrive makes them claimable again.';

-- A health snapshot, computed now: one row per scope that has records (one row with scope NULL when
-- none has), the database-wide figures repeated on each. Reads every retained record once.
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
           count(*) AS retained_keys,
           count(*) FILTER (WHERE r.status = 'completed') AS completed_keys,
           count(*) FILTER (WHERE r.status = 'pending' AND r.token IS NOT NULL
                              AND r.expires_at > clock_timestamp()) AS in_flight,
           clock_timestamp() - min(r.created_at) FILTER (WHERE r.status = 'pending' AND r.token IS NOT NULL
                                                           AND r.expires_at > clock_timestamp()) AS oldest_lease_age,
           count(*) FILTER (WHERE r.status = 'pending' AND r.token IS NOT NULL
                              AND NOT coalesce(r.expires_at > clock_timestamp(), false)) AS expired_leases,
           count(*) FILTER (WHERE r.status = 'pending' AND r.token IS NULL) AS awaiting_retry,
           count(*) FILTER (WHERE r.status = 'failed') AS dead_letters,
           max(r.updated_at) FILTER (WHERE r.status = 'failed') AS last_dead_letter_at
      FROM idempotency.records r
     GROUP BY r.scope
), p AS (
    SELECT count(*)::integer AS partitions,
           count(v.sealed_at)::integer AS sealed_partitions,
           max(v.range_to) AS premade_until
      FROM idempotency.partitions v
), m AS (
    SELECT * FROM idempotency.maintenance_state()
)
SELECT k.scope,
       coalesce(k.retained_keys, 0), coalesce(k.completed_keys, 0), coalesce(k.in_flight, 0),
       k.oldest_lease_age, coalesce(k.expired_leases, 0), coalesce(k.awaiting_retry, 0),
       coalesce(k.dead_letters, 0), k.last_dead_letter_at,
       p.partitions, p.sealed_partitions, p.premade_until, p.premade_until - clock_timestamp(),
       m.last_round_at, make_interval(secs => m.last_round_micros / 1e6),
       coalesce(m.rounds, 0), coalesce(m.failed_rounds, 0), m.last_error, m.last_error_at,
       EXISTS (SELECT FROM pg_stat_activity a WHERE a.backend_type = 'idempotency launcher')
  FROM p
  LEFT JOIN m ON true
  LEFT JOIN k ON true
 ORDER BY k.scope
$$;
GRANT EXECUTE ON FUNCTION idem_metrics() TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idem_metrics() IS
'Health snapshot computed now, one row per scope: retained, completed, in flight, oldest in flight, expired leases, awaiting retry, dead letters; and for the database: partitions, premade_ahead, the maintenance rounds (needs the library preloaded), worker_running. Reads every retained record.';
