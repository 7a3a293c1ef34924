-- 0.3.0 -> 0.4.0: observability and steering. Cumulative statistics per scope (shared memory, with
-- the library preloaded), the health snapshot idem_metrics(), the views idempotency.in_flight and
-- idempotency.dead_letters, and idem_redrive / idem_redrive_scope / idem_forget for the new role
-- idempotency_admin. Nothing stored changes: no table is touched.
-- Run by ALTER EXTENSION idempotency UPDATE, after PostgreSQL was restarted on the 0.4.0 library.

CREATE  FUNCTION "idem_forget"(
	"key" TEXT, /* Option < & str > */
	"scope" TEXT DEFAULT 'default' /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'idem_forget_wrapper';

CREATE  FUNCTION "idem_redrive"(
	"key" TEXT, /* Option < & str > */
	"scope" TEXT DEFAULT 'default' /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'idem_redrive_wrapper';

CREATE  FUNCTION "idem_redrive_scope"(
	"scope" TEXT, /* Option < & str > */
	"failed_since" timestamp with time zone DEFAULT NULL, /* Option < TimestampWithTimeZone > */
	"max_keys" INT DEFAULT 1000 /* Option < i32 > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'idem_redrive_scope_wrapper';

CREATE  FUNCTION "idem_stats_reset"(
	"scope" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS timestamp with time zone /* Ts */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'idem_stats_reset_wrapper';

CREATE  FUNCTION idempotency."stats_totals"() RETURNS TABLE (
	"counts" bigint[],  /* Vec < i64 > */
	"scopes" bigint,  /* i64 */
	"enabled" bool,  /* bool */
	"stats_reset" timestamp with time zone  /* Option < Ts > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stats_totals_wrapper';

CREATE  FUNCTION idempotency."maintenance_state"() RETURNS TABLE (
	"last_round_at" timestamp with time zone,  /* Option < Ts > */
	"last_round_micros" bigint,  /* i64 */
	"rounds" bigint,  /* i64 */
	"failed_rounds" bigint,  /* i64 */
	"last_error" TEXT,  /* Option < String > */
	"last_error_at" timestamp with time zone  /* Option < Ts > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'maintenance_state_wrapper';

CREATE  FUNCTION idempotency."scope_stats"() RETURNS TABLE (
	"scope" TEXT,  /* Option < String > */
	"counts" bigint[],  /* Vec < i64 > */
	"stats_reset" timestamp with time zone  /* Option < Ts > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'scope_stats_wrapper';

-- Cumulative counters per scope, from shared memory (src/stats). The array's order is the Counter
-- enum's; lock waits are kept in microseconds.
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
       s.counts[14] / 1000.0::double precision AS lock_wait_ms,
       s.counts[15] AS completes,
       s.counts[16] AS fails,
       s.counts[17] AS heartbeats,
       s.stats_reset
  FROM idempotency.scope_stats() s;

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

-- Like every function of the extension, none is executable by PUBLIC.
REVOKE ALL ON FUNCTION
    idem_forget(text, text),
    idem_redrive(text, text),
    idem_redrive_scope(text, timestamptz, integer),
    idem_stats_reset(text),
    idem_stats(),
    idem_metrics(),
    idempotency.stats_totals(),
    idempotency.maintenance_state(),
    idempotency.scope_stats()
FROM PUBLIC;

-- Watching and steering: idempotency_admin redrives and forgets keys and resets the statistics;
-- it and pg_monitor read the statistics, the health snapshot and the views of keys in flight and
-- dead letters. Consumers get none of it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_admin') THEN
        CREATE ROLE idempotency_admin NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA idempotency TO idempotency_admin, pg_monitor;
GRANT SELECT ON idempotency.stats, idempotency.in_flight, idempotency.dead_letters, idempotency.partitions
    TO idempotency_admin, pg_monitor;
GRANT EXECUTE ON FUNCTION
    idem_stats(),
    idem_metrics(),
    idempotency.scope_stats(),
    idempotency.stats_totals(),
    idempotency.maintenance_state()
TO idempotency_admin, pg_monitor;
GRANT EXECUTE ON FUNCTION
    idem_stats_reset(text),
    idem_redrive(text, text),
    idem_redrive_scope(text, timestamptz, integer),
    idem_forget(text, text)
TO idempotency_admin;

COMMENT ON VIEW idempotency.stats IS
'Cumulative counters per scope of this database since stats_reset (shared memory; needs shared_preload_libraries). Counted when the calling transaction ends, committed or not. scope NULL: the scopes beyond idempotency.stats_max_scopes. claims = claimed_new + takeovers + retries + answered_*.';
COMMENT ON VIEW idempotency.in_flight IS
'Pending keys: state leased (live lease), expired (lease ended, not taken over yet) or released (a retryable failure, waiting for the next claim); age = now - created_at.';
COMMENT ON VIEW idempotency.dead_letters IS
'Terminal failures with their stored error: idem_fail(retryable => false), retries past idempotency.max_attempts, poison messages. idem_redrive makes them claimable again.';
COMMENT ON FUNCTION idem_stats() IS
'The counters of idempotency.stats added up over all scopes of this database, with the number of scopes, whether counting is on (library preloaded and idempotency.stats on) and the oldest stats_reset.';
COMMENT ON FUNCTION idem_stats_reset(text) IS
'Zeroes the counters of one scope, or of all scopes of this database (NULL); returns the time of the reset. For idempotency_admin.';
COMMENT ON FUNCTION idem_metrics() IS
'Health snapshot computed now, one row per scope: retained, completed, in flight, oldest in flight, expired leases, awaiting retry, dead letters; and for the database: partitions, premade_ahead, the maintenance rounds (needs the library preloaded), worker_running. Reads every retained record.';
COMMENT ON FUNCTION idem_redrive(text, text) IS
'Makes a failed (dead-letter) key claimable again: released, attempts counted from zero, error kept. False when the key is not failed; P0002 when unknown. Takes the key lock. For idempotency_admin.';
COMMENT ON FUNCTION idem_redrive_scope(text, timestamptz, integer) IS
'Redrives up to max_keys failed keys of a scope (failed since failed_since, when given), in key order; returns how many. Call again until 0. Holds each key''s lock until commit. For idempotency_admin.';
COMMENT ON FUNCTION idem_forget(text, text) IS
'Deletes a key''s record whatever its state, so that it is processed again from scratch; false when unknown. A holder of its lease then gets P0002. Takes the key lock. For idempotency_admin.';
COMMENT ON FUNCTION idempotency.scope_stats() IS
'The counters behind idempotency.stats, per scope, in the order of its columns (lock waits in microseconds).';
COMMENT ON FUNCTION idempotency.stats_totals() IS
'The counters behind idem_stats(), added up over the scopes of this database.';
COMMENT ON FUNCTION idempotency.maintenance_state() IS
'The last maintenance round of this database since the server started (worker or idem_maintenance()), how many ran and failed, the last error. Empty without the library preloaded.';

