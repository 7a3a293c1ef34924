//! Time partitions of `idempotency.records`.
//!
//! Partitions are native range partitions on `created_at`, aligned on
//! `date_bin(partition_interval, ts, '2000-01-01 UTC')` and named like pg_partman's children:
//! `records_pYYYY_MM_DD` for intervals of a day or more, `records_pYYYY_MM_DD_HH24MI` below.
//! Each backend remembers the range of the partition that holds the current time, so the claim
//! path pays two comparisons; only when the current time leaves that range does it look again,
//! and create the missing partitions if there is none.
use crate::storage::pg::catalog::{self, Invalidated};
use crate::storage::pg::keylock;
use crate::storage::pg::settings::Pinned;
use crate::storage::pg::{sealed, xact};
use crate::storage::pg::spi::{arg, ts_arg, Conn, Snap, Stmt};
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

const NO_COVERAGE: Coverage = Coverage {
    lo: 0,
    from: 0,
    to: 0,
    partition: pg_sys::InvalidOid,
    sealed_to: None,
    sealed_before: pg_sys::InvalidOid,
};

/// Forgets the partition holding the present when the record table's relcache entry is
/// invalidated. Called by [`catalog`]'s callback.
pub fn forget_coverage(what: Invalidated) {
    if let Invalidated::RecordTable = what {
        COVERED.with(|c| c.set(NO_COVERAGE));
    }
}

/// Where rows created at any time in `[lo, to)` go: `partition`, whose range is `[from, to)`, with
/// `created_at` no earlier than `from` (`lo < from` when the times before `from` are sealed).
#[derive(Clone, Copy)]
struct Coverage {
    lo: pg_sys::TimestampTz,
    from: pg_sys::TimestampTz,
    to: pg_sys::TimestampTz,
    partition: pg_sys::Oid,
    /// The end of the newest sealed partition, if any: a row routed by the record table itself
    /// (no partition found) gets at least this `created_at`, so no row reaches a sealed partition.
    sealed_to: Option<pg_sys::TimestampTz>,
    /// The newest sealed partition whose range ends by `from` (none: InvalidOid): the last one a row
    /// created before `from` is moved past.
    sealed_before: pg_sys::Oid,
}

impl Coverage {
    fn holds(&self, ts: pg_sys::TimestampTz) -> bool {
        self.lo <= ts && ts < self.to
    }
}

/// Slots from `$1`'s slot to `$3` intervals ahead that no existing partition overlaps, each as
/// the DDL that creates it and its indexes, then attaches it. Attaching takes SHARE UPDATE EXCLUSIVE on
/// the record table where `CREATE TABLE ... PARTITION OF` takes ACCESS EXCLUSIVE: a consumer whose claim
/// makes the partition then holds nothing until its commit that keeps monitoring or pg_dump from reading
/// the record table. The bounds are written as UTC ISO text, which reads back as the same instant under
/// any `DateStyle` and `TimeZone` (the DDL also runs with them pinned). `$2` is the partition interval.
/// The record table has no index of its own (a partitioned index would make every restored partition's
/// index collide with the one `ATTACH PARTITION` makes), so each partition gets its own.
static MISSING_PARTITIONS: Stmt = Stmt {
    sql: r#"
WITH slots AS (
    SELECT s AS lo, s + $2 AS hi,
           'records_p' || to_char(s AT TIME ZONE 'UTC',
                                  CASE WHEN $2 >= interval '1 day' THEN 'YYYY_MM_DD' ELSE 'YYYY_MM_DD_HH24MI' END) AS name
      FROM generate_series(date_bin($2, $1, timestamptz '2000-01-01 00:00:00+00'), $1 + $2 * $3, $2) AS s
)
SELECT format('CREATE TABLE idempotency.%I (LIKE idempotency.records INCLUDING DEFAULTS INCLUDING STORAGE)', s.name)
       -- Between the restart on a new build and ALTER EXTENSION UPDATE, the 0.1.0 schema has no
       -- index_partition: its partitioned indexes give the new partition its indexes when it is attached.
       || CASE WHEN to_regprocedure('idempotency.index_partition(regclass)') IS NULL THEN ''
               ELSE format('; SELECT idempotency.index_partition(%L)', 'idempotency.' || quote_ident(s.name)) END
       || format('; ALTER TABLE idempotency.records ATTACH PARTITION idempotency.%I FOR VALUES FROM (%L) TO (%L)',
                 s.name, to_char(s.lo AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00',
                 to_char(s.hi AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00')
  FROM slots s
 WHERE NOT EXISTS (SELECT 1 FROM idempotency.partitions p WHERE p.range_from < s.hi AND p.range_to > s.lo)
 ORDER BY s.lo"#,
    args: &[pg_sys::TIMESTAMPTZOID, pg_sys::INTERVALOID, pg_sys::INT4OID],
};

/// Where a row created at `$1` goes: the first partition that is not sealed and whose range ends
/// after `$1`, with its range (none: no column), and the end of the newest sealed partition.
/// Usually the partition holding `$1`; a later one when `$1` falls in a sealed partition (a
/// transaction that began before its end, a clock stepped back).
/// The same, on a 0.2.0 schema (the new library before `ALTER EXTENSION UPDATE`): nothing is sealed.
static COVERAGE_UNSEALED: Stmt = Stmt {
    sql: "SELECT p.range_from, p.range_to, p.partition, NULL::timestamptz
            FROM (SELECT) AS one
            LEFT JOIN LATERAL (
                  SELECT v.range_from, v.range_to, v.partition::oid AS partition
                    FROM idempotency.partitions v WHERE v.range_to > $1
                   ORDER BY v.range_from LIMIT 1) p ON true",
    args: &[pg_sys::TIMESTAMPTZOID],
};
/// `$2` lists the sealed partitions (from `sealed`, read without predicate locks): the query reads no
/// table of the storage (the view's join to `idempotency.sealed` goes, its columns unused), so it takes no
/// predicate locks in a SERIALIZABLE caller's transaction. Also the newest of them that ends by the
/// partition's start.
static COVERAGE: Stmt = Stmt {
    sql: "SELECT p.range_from, p.range_to, p.partition,
                 (SELECT s.partition::oid FROM idempotency.partitions s
                   WHERE s.partition::oid = ANY ($2) AND s.range_to <= p.range_from
                   ORDER BY s.range_to DESC LIMIT 1)
            FROM (SELECT) AS one
            LEFT JOIN LATERAL (
                  SELECT v.range_from, v.range_to, v.partition::oid AS partition
                    FROM idempotency.partitions v
                   WHERE v.range_to > $1 AND v.partition::oid <> ALL ($2)
                   ORDER BY v.range_from LIMIT 1) p ON true",
    args: &[pg_sys::TIMESTAMPTZOID, pg_sys::OIDARRAYOID],
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
             AND NOT (EXISTS (SELECT FROM pg_catalog.pg_class ic JOIN pg_catalog.pg_index i ON i.indexrelid = ic.oid
                               WHERE i.indrelid = t.relid AND ic.relname = c.relname || '_expires_at_idx')
                  -- the lookup index of 0.7.0, or of 0.6.0 until the update
                  AND EXISTS (SELECT FROM pg_catalog.pg_class ic JOIN pg_catalog.pg_index i ON i.indexrelid = ic.oid
                               WHERE i.indrelid = t.relid
                                 AND ic.relname IN (c.relname || '_key_scope_idx', c.relname || '_scope_key_idx')))",
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

fn missing(conn: &Conn, as_of: pg_sys::TimestampTz, ahead: i32) -> Vec<String> {
    let rows = conn.run(&MISSING_PARTITIONS, &[ts_arg(as_of), interval_arg(), arg(ahead)], Snap::Latest);
    (0..rows.len()).filter_map(|i| rows.get::<String>(i, 1)).collect()
}

/// Creates the partitions missing from `as_of`'s slot to `premake` intervals ahead.
/// Returns how many it created. Only a backend that has something to create takes the lock
/// that serializes creators (until its transaction ends), so claims that find their partitions
/// in place never wait for each other here.
pub fn create_missing(conn: &Conn, as_of: pg_sys::TimestampTz) -> i32 {
    check_finite("as_of", as_of);
    let ahead = gucs::premake();
    let mut ddl = missing(conn, as_of, ahead);
    // In a consumer's session too: its DateStyle, TimeZone or default_tablespace must not reach the DDL.
    let _pinned = (!ddl.is_empty()).then(Pinned::enter);
    if !ddl.is_empty() {
        keylock::lock_partition_creation();
        ddl = missing(conn, as_of, ahead); // another creator may have finished meanwhile
    }
    for statement in &ddl {
        conn.execute(statement);
    }
    look_up_coverage(conn, as_of);
    ddl.len() as i32
}

/// Finds (and remembers) where rows created at `ts` go.
fn look_up_coverage(conn: &Conn, ts: pg_sys::TimestampTz) {
    let (range, settled) =
        catalog::read_for_cache(|| read_coverage(conn, ts), |_, what| matches!(what, Invalidated::RecordTable));
    if !settled {
        // A partition of the last read may be gone already: nothing safe to write to.
        crate::errors::partitions_changing();
    }
    COVERED.with(|c| c.set(range));
}

fn read_coverage(conn: &Conn, ts: pg_sys::TimestampTz) -> Coverage {
    let (rows, sealed_to) = if sealed::installed() {
        let known = sealed::sealed();
        let partitions: Vec<pg_sys::Oid> = known.filters.keys().copied().collect();
        (conn.run(&COVERAGE, &[ts_arg(ts), arg(partitions)], Snap::Latest), known.sealed_to)
    } else {
        (conn.run(&COVERAGE_UNSEALED, &[ts_arg(ts)], Snap::Latest), None)
    };
    match (rows.get_ts(0, 1), rows.get_ts(0, 2), rows.get::<pg_sys::Oid>(0, 3)) {
        (Some(from), Some(to), Some(partition)) => Coverage {
            lo: ts.min(from),
            from,
            to,
            partition,
            sealed_to,
            sealed_before: rows.get::<pg_sys::Oid>(0, 4).unwrap_or(pg_sys::InvalidOid),
        },
        // No partition takes the row: the record table routes it (pg_partman's default
        // partition), to the sealed partitions' end at the earliest; an empty range, so the
        // next call looks again.
        _ => Coverage {
            lo: ts,
            from: ts.max(sealed_to.unwrap_or(ts)),
            to: ts,
            partition: pg_sys::InvalidOid,
            sealed_to,
            sealed_before: pg_sys::InvalidOid,
        },
    }
}

/// Makes sure a row created at `ts` has a partition. Cheap when it already has one.
/// Only the builtin manager creates partitions on demand: under pg_partman its default
/// partition catches rows, and with `none` the DBA is in charge. A consumer whose own time has its
/// partition makes nothing: premaking ahead is maintenance's. Only when that partition is missing (no
/// round made it yet, or a round as of a later time dropped it) does it make it, and `premake` more, in
/// its own transaction. (It used to make whatever was missing up to `premake` intervals ahead whenever
/// the partition it knew ended: the first claim after midnight, before any round of the new day, made
/// the day `premake` days ahead in its own transaction and held the creation lock until it ended, so
/// every other claim of the new day, and the next round, waited for it.)
pub fn ensure_covered(conn: &Conn, ts: pg_sys::TimestampTz) {
    if COVERED.with(|c| c.get()).holds(ts) {
        return;
    }
    if gucs::partition_manager() == gucs::PartitionManager::Builtin {
        if missing(conn, ts, 0).is_empty() {
            look_up_coverage(conn, ts);
            let c = COVERED.with(|c| c.get());
            if c.holds(ts) && c.partition != pg_sys::InvalidOid {
                return;
            }
        }
        if create_missing(conn, ts) > 0 {
            keylock::keep_all_from_now_on();
        }
    } else {
        look_up_coverage(conn, ts);
    }
}

/// Where a row created at `ts` goes, and the `created_at` it gets: the partition this backend
/// knows takes it, so that the insert skips tuple routing; else the record table, which routes
/// it (pg_partman's default partition, `none`).
///
/// The partition is locked for the insert first (ROW EXCLUSIVE, as the executor would). That
/// lock is what closes a seal (see `sealing`): a seal holds SHARE until it commits, and taking
/// the lock processes the invalidation the seal sent, which makes us forget the partition and
/// look again. It also keeps a maintenance round (one aging data with a future `as_of`) from
/// dropping the partition before the insert; if one dropped it before, the invalidation makes us
/// look again too, and make it again as at the start of the call.
///
/// A row moved past sealed partitions first takes the same lock on the last of them, which waits for its
/// seal if that is still committing: a seal is visible before its invalidation is sent (PostgreSQL sends
/// it after the commit, before releasing the locks), so this backend may have learned of it from a fresh
/// read while another has not yet, and that one's lookup of the key, once this transaction has committed,
/// must know of the seal to search the partition the row is moved to (see `probe::Prober::open`).
pub fn insert_target(conn: &Conn, ts: pg_sys::TimestampTz) -> (pg_sys::Oid, pg_sys::TimestampTz) {
    for _ in 0..10 {
        ensure_covered(conn, ts);
        let c = COVERED.with(|c| c.get());
        if !(c.holds(ts) && c.partition != pg_sys::InvalidOid) {
            break;
        }
        // SAFETY: locks partitions' oids, as the executor would for the insert that follows (one dropped
        // meanwhile is only an oid); if the target was dropped or sealed, the invalidation makes us look again.
        unsafe {
            if ts < c.from && c.sealed_before != pg_sys::InvalidOid {
                pg_sys::LockRelationOid(c.sealed_before, pg_sys::RowExclusiveLock as i32);
            }
            pg_sys::LockRelationOid(c.partition, pg_sys::RowExclusiveLock as i32)
        };
        if COVERED.with(|now| now.get().partition) == c.partition {
            return (c.partition, ts.max(c.from));
        }
    }
    let c = COVERED.with(|c| c.get());
    (catalog::records_oid(), ts.max(c.sealed_to.unwrap_or(ts)))
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
    /// Partitions whose drop failed, as "partition: message".
    pub failed: Vec<String>,
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
        // Each drop on its own: a partition that cannot be dropped (a DBA's view on it) is reported,
        // and the others still go.
        let dropped = xact::in_subtransaction(|| {
            let rows = conn.run(
                &DROP,
                &[arg(name.as_str()), arg(gucs::drop_lock_timeout().as_millis() as i32)],
                Snap::Statement,
            );
            rows.get::<bool>(0, 1) == Some(true)
        });
        match dropped {
            Ok(true) => done.dropped += 1,
            Ok(false) => done.deferred += 1,
            Err(message) => done.failed.push(format!("{name}: {message}")),
        }
    }
    done
}
