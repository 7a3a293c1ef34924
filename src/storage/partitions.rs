//! Time partitions of `idempotency.records`.
//!
//! Partitions are native range partitions on `created_at`, aligned on
//! `date_bin(partition_interval, ts, '2000-01-01 UTC')` and named like pg_partman's children:
//! `records_pYYYY_MM_DD` for intervals of a day or more, `records_pYYYY_MM_DD_HH24MI` below.
//! Each backend remembers the range of the partition that holds the current time, so the claim
//! path pays two comparisons; only when the current time leaves that range does it look again,
//! and create the missing partitions if there is none.
use super::catalog::{self, Invalidated};
use super::keylock;
use super::spi::{arg, ts_arg, Conn, Snap, Stmt};
use crate::gucs;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    /// The range of a partition this backend has seen. Forgotten whenever the record table's
    /// relcache entry is invalidated, which any partition created, dropped, attached or detached
    /// (or rolled back) causes (see [`forget_coverage`]).
    static COVERED: Cell<Coverage> = const { Cell::new(NO_COVERAGE) };
}

const NO_COVERAGE: Coverage = Coverage { from: 0, to: 0, partition: pg_sys::InvalidOid };

/// Forgets the partition holding the present when the record table's relcache entry is
/// invalidated. Called by [`catalog`]'s callback.
pub fn forget_coverage(what: Invalidated) {
    if let Invalidated::RecordTable = what {
        COVERED.with(|c| c.set(NO_COVERAGE));
    }
}

/// A partition's range `[from, to)`.
#[derive(Clone, Copy)]
struct Coverage {
    from: pg_sys::TimestampTz,
    to: pg_sys::TimestampTz,
    partition: pg_sys::Oid,
}

/// Slots from `$1`'s slot to `$3` intervals ahead that no existing partition overlaps, each as
/// the DDL that creates it and its indexes. `$2` is the partition interval. The record table has
/// no index of its own (a partitioned index would make every restored partition's index collide
/// with the one `ATTACH PARTITION` makes), so each partition gets its own.
static MISSING_PARTITIONS: Stmt = Stmt {
    sql: r#"
WITH slots AS (
    SELECT s AS lo, s + $2 AS hi,
           'records_p' || to_char(s AT TIME ZONE 'UTC',
                                  CASE WHEN $2 >= interval '1 day' THEN 'YYYY_MM_DD' ELSE 'YYYY_MM_DD_HH24MI' END) AS name
      FROM generate_series(date_bin($2, $1, timestamptz '2000-01-01 00:00:00+00'), $1 + $2 * $3, $2) AS s
)
SELECT format('CREATE TABLE IF NOT EXISTS idempotency.%I PARTITION OF idempotency.records FOR VALUES FROM (%L) TO (%L)',
              s.name, s.lo, s.hi)
       -- Between the restart on a new build and ALTER EXTENSION UPDATE, the 0.1.0 schema has no
       -- index_partition: its partitioned indexes give the new partition its indexes.
       || CASE WHEN to_regprocedure('idempotency.index_partition(regclass)') IS NULL THEN ''
               ELSE format('; SELECT idempotency.index_partition(%L)', 'idempotency.' || quote_ident(s.name)) END
  FROM slots s
 WHERE NOT EXISTS (SELECT 1 FROM idempotency.partitions p WHERE p.range_from < s.hi AND p.range_to > s.lo)
 ORDER BY s.lo"#,
    args: &[pg_sys::TIMESTAMPTZOID, pg_sys::INTERVALOID, pg_sys::INT4OID],
};

/// The partition that holds `$1`, with its range; no row when there is none.
static COVERAGE: Stmt = Stmt {
    sql: "SELECT range_from, range_to, partition::oid FROM idempotency.partitions
           WHERE range_from <= $1 AND range_to > $1",
    args: &[pg_sys::TIMESTAMPTZOID],
};

/// Partitions whose whole range ends at or before `$1`, oldest first.
static EXPIRED: Stmt = Stmt {
    sql: "SELECT partition::text FROM idempotency.partitions WHERE range_to <= $1 ORDER BY range_to",
    args: &[pg_sys::TIMESTAMPTZOID],
};

static DROP: Stmt = Stmt {
    sql: "SELECT idempotency.drop_partition($1::regclass, $2)",
    args: &[pg_sys::TEXTOID, pg_sys::INT4OID],
};

/// The partitions (leaves) that lack one of the indexes of `idempotency.index_partition`, each
/// as the call that makes them.
static UNINDEXED: Stmt = Stmt {
    sql: "SELECT format('SELECT idempotency.index_partition(%L)', t.relid::regclass::text)
            FROM pg_catalog.pg_partition_tree('idempotency.records') t
            JOIN pg_catalog.pg_class c ON c.oid = t.relid
           WHERE t.isleaf
             AND (SELECT count(*) FROM pg_catalog.pg_class ic JOIN pg_catalog.pg_index i ON i.indexrelid = ic.oid
                   WHERE i.indrelid = t.relid
                     AND ic.relname IN (c.relname || '_scope_key_idx', c.relname || '_expires_at_idx')) < 2",
    args: &[],
};

/// `infinity` and `-infinity` have no partition.
pub fn check_finite(name: &str, ts: pg_sys::TimestampTz) {
    if ts == i64::MAX || ts == i64::MIN {
        crate::errors::invalid(format!("{name} must be a finite timestamp"));
    }
}

fn interval_arg() -> Option<pg_sys::Datum> {
    let width = gucs::partition_interval().as_micros() as i64;
    arg(Interval::new(0, 0, width).expect("interval in range"))
}

fn missing(conn: &Conn, as_of: pg_sys::TimestampTz) -> Vec<String> {
    let rows =
        conn.run(&MISSING_PARTITIONS, &[ts_arg(as_of), interval_arg(), arg(gucs::premake())], Snap::Latest);
    (0..rows.len()).filter_map(|i| rows.get::<String>(i, 1)).collect()
}

/// Creates the partitions missing from `as_of`'s slot to `premake` intervals ahead.
/// Returns how many it created. Only a backend that has something to create takes the lock
/// that serializes creators (until its transaction ends), so claims that find their partitions
/// in place never wait for each other here.
pub fn create_missing(conn: &Conn, as_of: pg_sys::TimestampTz) -> i32 {
    check_finite("as_of", as_of);
    let mut ddl = missing(conn, as_of);
    if !ddl.is_empty() {
        keylock::lock_partition_creation();
        ddl = missing(conn, as_of); // another creator may have finished meanwhile
    }
    for statement in &ddl {
        conn.execute(statement);
    }
    let rows = conn.run(&COVERAGE, &[ts_arg(as_of)], Snap::Latest);
    let range = if rows.len() == 0 {
        NO_COVERAGE
    } else {
        Coverage {
            from: rows.get_ts(0, 1).expect("range_from"),
            to: rows.get_ts(0, 2).expect("range_to"),
            partition: rows.get(0, 3).expect("partition"),
        }
    };
    COVERED.with(|c| c.set(range));
    ddl.len() as i32
}

/// Makes sure a row created at `ts` has a partition. Cheap when it already has one.
/// Only the builtin manager creates partitions on demand: under pg_partman its default
/// partition catches rows, and with `none` the DBA is in charge.
pub fn ensure_covered(conn: &Conn, ts: pg_sys::TimestampTz) {
    let Coverage { from, to, .. } = COVERED.with(|c| c.get());
    if (from <= ts && ts < to) || gucs::partition_manager() != gucs::PartitionManager::Builtin {
        return;
    }
    create_missing(conn, ts);
}

/// Where a row created at `ts` goes: the partition this backend knows holds `ts`, so that the
/// insert skips tuple routing; else the record table, which routes it (pg_partman, `none`).
/// The partition is locked for the insert first, so that no maintenance round (one aging data
/// with a future `as_of`) drops it between here and the insert. If one dropped it before, the
/// invalidations that locking (or the lookup before) processed made us forget it: it is made
/// again, as at the start of the call.
pub fn insert_target(conn: &Conn, ts: pg_sys::TimestampTz) -> pg_sys::Oid {
    for _ in 0..10 {
        ensure_covered(conn, ts);
        let c = COVERED.with(|c| c.get());
        if !(c.from <= ts && ts < c.to && c.partition != pg_sys::InvalidOid) {
            break;
        }
        // SAFETY: locks an existing partition's oid for the insert that follows, as the executor would;
        // if the partition was dropped meanwhile, the invalidation makes us look again below.
        unsafe { pg_sys::LockRelationOid(c.partition, pg_sys::RowExclusiveLock as i32) };
        if COVERED.with(|now| now.get().partition) == c.partition {
            return c.partition;
        }
    }
    catalog::records_oid()
}

/// Gives the partitions that lack them the indexes every partition needs: those pg_partman 5.x
/// makes (it copies only unique indexes from its template table), and those pg_partman made before
/// the handover. Partitions that have them are left alone (no "already exists" notices).
pub fn index_missing(conn: &Conn) {
    let calls: Vec<String> = {
        let rows = conn.run(&UNINDEXED, &[], Snap::Latest);
        (0..rows.len()).filter_map(|i| rows.get::<String>(i, 1)).collect()
    };
    for call in &calls {
        conn.execute(call);
    }
}

/// Creates the partitions missing from `as_of`'s slot to `premake` intervals ahead (the SQL
/// function `idempotency.premake_partitions`).
pub fn premake(as_of: pg_sys::TimestampTz) -> i32 {
    create_missing(&Conn::open(), as_of)
}

/// What dropping expired partitions did.
#[derive(Default)]
pub struct Dropped {
    pub dropped: i32,
    /// Partitions whose lock was not had within `idempotency.drop_lock_timeout`: next round.
    pub deferred: i32,
}

/// Drops the partitions whose whole range is older than `as_of - idempotency.retention`.
/// Each drop waits at most `idempotency.drop_lock_timeout` for its lock, so consumers' claims
/// queue behind it no longer than that.
pub fn drop_expired(conn: &Conn, as_of: pg_sys::TimestampTz) -> Dropped {
    let cutoff = as_of - gucs::retention().as_micros() as i64;
    let names: Vec<String> = {
        let rows = conn.run(&EXPIRED, &[ts_arg(cutoff)], Snap::Latest);
        (0..rows.len()).filter_map(|i| rows.get::<String>(i, 1)).collect()
    };
    let mut done = Dropped::default();
    for name in names {
        let rows = conn.run(
            &DROP,
            &[arg(name.as_str()), arg(gucs::drop_lock_timeout().as_millis() as i32)],
            Snap::Statement,
        );
        if rows.get::<bool>(0, 1) == Some(true) {
            done.dropped += 1;
        } else {
            done.deferred += 1;
        }
    }
    done
}
