//! Sealing past partitions and writing their membership filters: a claim of a new key then reads one 32-byte block per
//! sealed partition instead of descending its lookup index.
//!
//! **Sealing.** A partition whose whole range is past takes no new row once maintenance has sealed
//! it. The seal takes a SHARE lock on the partition, which waits for every transaction that wrote
//! there (writers hold ROW EXCLUSIVE until they end) and keeps new writers out until it commits;
//! it then reads every key under the latest snapshot, writes the filter and the row of
//! `idempotency.sealed`, and invalidates the record table's relcache entry. A writer locks its
//! target partition before inserting (see `partitions::insert_target`), and that lock processes the
//! invalidation: a writer that arrives after the seal learns that the partition is sealed and puts
//! its row into the first partition that is not (with `created_at` moved to that partition's
//! start), whatever its transaction's start time or the clock say. So a filter holds every key its
//! partition will ever hold; keys deleted later only make it answer "maybe" more often. A lookup processes
//! the invalidation too, once it holds its keys' locks (see `probe::Prober::open`): a key moved past the
//! seal may lie in a partition ahead of the clock, which it searches only when it knows of the seal. (A
//! writer that learned of a seal from a fresh read, between its commit and its invalidation, waits for its
//! lock before moving a row past it: see `partitions::insert_target`.)
//!
//! **Format** (on disk, part of the upgrade contract): a split block Bloom filter as Parquet
//! specifies it (32-byte blocks of eight 32-bit words, one bit set per word by eight fixed salts),
//! over the key lock's 64-bit hash (`keylock::hash_key`, equal to
//! `hashtextextended(scope || E'\x1f' || key, 18756)`), so maintenance computes it in SQL and both sides
//! agree by construction. (A claim computes it twice, once for the lock and once for the filters; passing
//! the lock's hash down to the lookup would save that.)
//! 15 bits a key: 1.875 MB per million keys, about 0.2% false "maybe"s. (10 bits, 1.3%, cost a claim at
//! 30 sealed partitions a third of an index probe; filters written by earlier versions keep their size.)
//!
//! **Where the bits are**: rows of `idempotency.filter_chunks` (248 blocks each, stored inline and
//! uncompressed), read in place through shared buffers by their ctid, which `idempotency.sealed`
//! lists. All backends share them, and they are WAL-logged like any table: they survive a restart
//! or a crash and reach replicas. A crate's Bloom filter wants its own aligned buffer; these bits
//! are read where they lie in a shared buffer page, hence the few lines below. pg_dump does not
//! keep them: a restored database has no sealed partition until maintenance seals them again.
use crate::storage::pg::catalog;
use crate::storage::pg::filter::{blocks_for, insert, BLOCK_BYTES, CHUNK_BLOCKS};
use crate::storage::pg::sealed::installed;
use crate::storage::pg::settings::Pinned;
use crate::storage::pg::spi::{arg, quote_ident, ts_arg, Conn, Snap, Stmt};
use crate::storage::pg::xact;
use crate::gucs;
use pgrx::pg_sys;
use std::sync::atomic::{AtomicBool, Ordering};

/// Past partitions not sealed yet, oldest first.
static UNSEALED: Stmt = Stmt {
    sql: "SELECT p.partition::oid, c.relname::text, p.range_to
            FROM idempotency.partitions p JOIN pg_catalog.pg_class c ON c.oid = p.partition::oid
           WHERE p.range_to <= $1
             AND NOT EXISTS (SELECT 1 FROM idempotency.sealed s
                              WHERE s.partition = p.partition::oid AND s.partition_name = c.relname)
           ORDER BY p.range_to",
    args: &[pg_sys::TIMESTAMPTZOID],
};
/// Rows of partitions that are gone (dropped by retention, pg_partman or a DBA).
static FORGET_GONE: Stmt = Stmt {
    sql: "WITH gone AS (
              DELETE FROM idempotency.sealed s
               WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_inherits i
                                     ON i.inhrelid = c.oid AND i.inhparent = 'idempotency.records'::regclass
                                  WHERE c.oid = s.partition AND c.relname = s.partition_name)
              RETURNING partition)
          DELETE FROM idempotency.filter_chunks f USING gone WHERE f.partition = gone.partition",
    args: &[],
};
static LOCK: Stmt =
    Stmt { sql: "SELECT idempotency.seal_lock($1::regclass, $2)", args: &[pg_sys::OIDOID, pg_sys::INT4OID] };
static KEY_HASHES: Stmt =
    Stmt { sql: "SELECT hashtextextended(scope || E'\\x1f' || key, 18756) FROM {partition}", args: &[] };
static KEY_COUNT: Stmt = Stmt { sql: "SELECT count(*) FROM {partition}", args: &[] };
static BYTES_USED: Stmt =
    Stmt { sql: "SELECT (coalesce(sum(blocks::int8), 0) * 32)::int8 FROM idempotency.sealed", args: &[] };
static ADD_CHUNK: Stmt = Stmt {
    sql: "INSERT INTO idempotency.filter_chunks (partition, chunk, bits) VALUES ($1, $2, $3) RETURNING ctid::text",
    args: &[pg_sys::OIDOID, pg_sys::INT4OID, pg_sys::BYTEAOID],
};
static ADD_SEALED: Stmt = Stmt {
    sql: "INSERT INTO idempotency.sealed (partition, partition_name, range_to, keys, blocks, chunks)
          VALUES ($1, $2, $3, $4, $5, $6::text[]::tid[])",
    args: &[
        pg_sys::OIDOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT8OID,
        pg_sys::INT4OID,
        pg_sys::TEXTARRAYOID,
    ],
};

/// The memory bound was met once in this process: said once, at LOG level.
static BOUND_LOGGED: AtomicBool = AtomicBool::new(false);

/// What sealing did in one maintenance round.
#[derive(Default)]
pub struct Sealing {
    pub sealed: i32,
    /// Partitions whose lock was not had within `idempotency.drop_lock_timeout`: next round.
    pub deferred: i32,
}

/// Seals the partitions whose whole range ended before both `as_of` and the clock (a partition
/// is never sealed ahead of time, so rows moved out of a sealed one land no later than now), and
/// forgets the filters of partitions that are gone.
pub fn seal_past(conn: &Conn, as_of: pg_sys::TimestampTz) -> Sealing {
    if !installed() {
        return Sealing::default();
    }
    conn.run(&FORGET_GONE, &[], Snap::Statement);
    let until = as_of.min(xact::clock());
    let candidates: Vec<(pg_sys::Oid, String, pg_sys::TimestampTz)> = {
        let rows = conn.run(&UNSEALED, &[ts_arg(until)], Snap::Latest);
        (0..rows.len())
            .map(|i| {
                (rows.get(i, 1).expect("oid"), rows.get(i, 2).expect("name"), rows.get_ts(i, 3).expect("to"))
            })
            .collect()
    };
    let mut done = Sealing::default();
    let wait_ms = gucs::drop_lock_timeout().as_millis() as i32;
    for (partition, name, range_to) in candidates {
        let locked = conn.run(&LOCK, &[arg(partition), arg(wait_ms)], Snap::Statement).get::<bool>(0, 1);
        if locked != Some(true) {
            done.deferred += 1;
            continue;
        }
        seal(conn, partition, &name, range_to);
        done.sealed += 1;
    }
    if done.sealed > 0 {
        announce_seal();
    }
    done
}

/// Makes every backend re-read what is sealed, and where new rows go, once this transaction commits:
/// the invalidation a late writer processes when it locks its partition.
fn announce_seal() {
    // SAFETY: queues a relcache invalidation of an existing relation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(catalog::records_oid()) };
}

/// A range partition of the record table, by oid: its name and the end of its range.
static PARTITION: Stmt = Stmt {
    sql: "SELECT c.relname::text, p.range_to,
                 EXISTS (SELECT 1 FROM idempotency.sealed s WHERE s.partition = c.oid AND s.partition_name = c.relname)
            FROM idempotency.partitions p JOIN pg_catalog.pg_class c ON c.oid = p.partition::oid
           WHERE p.partition::oid = $1 AND p.range_to IS NOT NULL",
    args: &[pg_sys::OIDOID],
};

/// Seals one partition now, waiting for its lock as long as the session's `lock_timeout` allows
/// (`idempotency.seal_partition`). Sealing a partition that still holds the present moves the
/// rows of new keys to the next partition, ahead of their time. False if it was already sealed.
pub fn seal_partition(partition: pg_sys::Oid) -> bool {
    if !installed() {
        crate::errors::invalid("the schema predates sealed partitions: run ALTER EXTENSION idempotency UPDATE".into());
    }
    let _pinned = Pinned::enter();
    let conn = Conn::open();
    conn.run(&FORGET_GONE, &[], Snap::Statement);
    let (name, range_to, sealed) = {
        let rows = conn.run(&PARTITION, &[arg(partition)], Snap::Latest);
        if rows.len() == 0 {
            crate::errors::invalid(format!(
                "relation {} is not a range partition of idempotency.records",
                partition.to_u32()
            ));
        }
        (
            rows.get::<String>(0, 1).expect("name"),
            rows.get_ts(0, 2).expect("range_to"),
            rows.get::<bool>(0, 3).expect("sealed"),
        )
    };
    if sealed {
        return false;
    }
    conn.execute(&format!("LOCK TABLE idempotency.{} IN SHARE MODE", quote_ident(&name)));
    seal(&conn, partition, &name, range_to);
    announce_seal();
    true
}

/// Builds and stores one partition's filter; the caller holds its SHARE lock.
fn seal(conn: &Conn, partition: pg_sys::Oid, name: &str, range_to: pg_sys::TimestampTz) {
    // The latest snapshot: the writers the lock waited for committed after this transaction's
    // snapshot (REPEATABLE READ) was taken, and their keys must be in. The keys are counted first, so
    // the filter's size is checked against the budget before anything is read or allocated for it.
    let keys: i64 = conn.run_on(&KEY_COUNT, partition, &[], Snap::Latest).get(0, 1).unwrap_or(0);
    let blocks = blocks_for(keys as u64);
    let used: i64 = conn.run(&BYTES_USED, &[], Snap::Statement).get(0, 1).unwrap_or(0);
    let bytes = blocks as u64 * BLOCK_BYTES as u64;
    let mut tids: Vec<String> = Vec::new();
    let stored_blocks = if used as u64 + bytes > gucs::filter_memory() {
        if !BOUND_LOGGED.swap(true, Ordering::Relaxed) {
            pgrx::log!(
                "idempotency: idempotency.filter_memory ({} kB) is reached: partition {name} is sealed without a filter, and claims probe its index",
                gucs::filter_memory() / 1024
            );
        }
        0
    } else {
        // Streamed: the hashes go into the bits a batch at a time, never all in memory at once.
        let mut bits = vec![0u8; bytes as usize];
        conn.for_each_batch_on(&KEY_HASHES, partition, 10_000, |rows| {
            for i in 0..rows.len() {
                insert(&mut bits, rows.get::<i64>(i, 1).expect("hash") as u64);
            }
        });
        for (n, chunk) in bits.chunks(CHUNK_BLOCKS * BLOCK_BYTES).enumerate() {
            let rows = conn.run(&ADD_CHUNK, &[arg(partition), arg(n as i32), arg(chunk)], Snap::Statement);
            tids.push(rows.get::<String>(0, 1).expect("ctid"));
        }
        blocks as i32
    };
    conn.run(
        &ADD_SEALED,
        &[
            arg(partition),
            arg(name),
            ts_arg(range_to),
            arg(keys),
            arg(stored_blocks),
            arg(tids),
        ],
        Snap::Statement,
    );
}
