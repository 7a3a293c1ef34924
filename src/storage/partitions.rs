//! Time partitions of `idempotency.records`.
//!
//! Partitions are native range partitions on `created_at`, aligned on
//! `date_bin(partition_interval, ts, '2000-01-01 UTC')` and named like pg_partman's children:
//! `records_pYYYY_MM_DD` for intervals of a day or more, `records_pYYYY_MM_DD_HH24MI` below.
//! Each backend remembers up to when the partitions reach, so the claim path pays one
//! comparison; only when the current time is not covered does it create the missing ones.
use super::keylock;
use super::spi::{arg, Conn, Snap, Stmt};
use crate::gucs;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    /// Upper bound of the newest partition this backend has seen committed (or created itself).
    static COVERED_UNTIL: Cell<pg_sys::TimestampTz> = const { Cell::new(i64::MIN) };
}

/// Slots from `$1`'s slot to `$3` intervals ahead that no existing partition overlaps, each as
/// the DDL that creates it. `$2` is the partition interval.
static MISSING_PARTITIONS: Stmt = Stmt {
    sql: r#"
WITH existing AS (
    SELECT m[1]::timestamptz AS lo, m[2]::timestamptz AS hi
      FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid,
           regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                        'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS m
     WHERE i.inhparent = 'idempotency.records'::regclass
), slots AS (
    SELECT s AS lo, s + $2 AS hi
      FROM generate_series(date_bin($2, $1, timestamptz '2000-01-01 00:00:00+00'), $1 + $2 * $3, $2) AS s
)
SELECT format('CREATE TABLE IF NOT EXISTS idempotency.%I PARTITION OF idempotency.records FOR VALUES FROM (%L) TO (%L)',
              'records_p' || to_char(s.lo AT TIME ZONE 'UTC',
                                     CASE WHEN $2 >= interval '1 day' THEN 'YYYY_MM_DD' ELSE 'YYYY_MM_DD_HH24MI' END),
              s.lo, s.hi)
  FROM slots s
 WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.lo < s.hi AND e.hi > s.lo)
 ORDER BY s.lo"#,
    args: &[pg_sys::TIMESTAMPTZOID, pg_sys::INTERVALOID, pg_sys::INT4OID],
};

/// The upper bound of the newest partition.
static COVERAGE: Stmt = Stmt {
    sql: r#"
SELECT max((regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz)
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'idempotency.records'::regclass"#,
    args: &[],
};

fn interval_arg() -> Option<pg_sys::Datum> {
    let secs = gucs::partition_interval_s();
    arg(Interval::new(0, 0, secs * 1_000_000).expect("interval in range"))
}

/// Creates the partitions missing from `as_of`'s slot to `premake` intervals ahead.
/// Returns how many it created.
pub fn create_missing(conn: &Conn, as_of: pg_sys::TimestampTz) -> i32 {
    keylock::lock_partition_creation();
    let ddl: Vec<String> = {
        let rows = conn.run(
            &MISSING_PARTITIONS,
            &[
                arg(TimestampWithTimeZone::try_from(as_of).expect("valid timestamp")),
                interval_arg(),
                arg(gucs::premake()),
            ],
            Snap::Latest,
        );
        (0..rows.len()).filter_map(|i| rows.get::<String>(i, 1)).collect()
    };
    for statement in &ddl {
        conn.execute(statement);
    }
    if !ddl.is_empty() {
        // A rollback would take the new partitions away again: forget what we learned.
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, || {
            COVERED_UNTIL.with(|c| c.set(i64::MIN))
        });
    }
    let until = conn.run(&COVERAGE, &[], Snap::Latest).get_ts(0, 1).unwrap_or(i64::MIN);
    COVERED_UNTIL.with(|c| c.set(until));
    ddl.len() as i32
}

/// Makes sure a row created at `ts` has a partition. Cheap when it already has one.
pub fn ensure_covered(conn: &Conn, ts: pg_sys::TimestampTz) {
    if ts < COVERED_UNTIL.with(|c| c.get()) {
        return;
    }
    create_missing(conn, ts);
}
