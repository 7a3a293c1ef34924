//! Membership filters of sealed partitions: a claim of a new key reads one 32-byte block per
//! sealed partition instead of descending its `(scope, key)` index.
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
//! partition will ever hold; keys deleted later only make it answer "maybe" more often.
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
use super::catalog::{self, Invalidated};
use super::spi::{arg, ts_arg, Conn, Snap, Stmt};
use crate::gucs;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

pub const BLOCK_BYTES: usize = 32;
/// Blocks per row of `idempotency.filter_chunks`: 7,936 bytes, so that a row fills one 8 kB page.
pub const CHUNK_BLOCKS: usize = 248;
const BITS_PER_KEY: u64 = 15;
/// Parquet's split block Bloom filter salts.
const SALT: [u32; 8] =
    [0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31];

/// Blocks for a filter of `keys` keys (at least one).
pub fn blocks_for(keys: u64) -> u32 {
    (keys * BITS_PER_KEY).div_ceil(BLOCK_BYTES as u64 * 8).max(1) as u32
}

/// The block a hash falls in: its high half scaled to the number of blocks.
pub fn block_of(hash: u64, blocks: u32) -> usize {
    (((hash >> 32) * blocks as u64) >> 32) as usize
}

/// The bit each of the block's eight words must have, from the hash's low half.
fn masks(hash: u64) -> [u32; 8] {
    let low = hash as u32;
    SALT.map(|salt| 1u32 << (low.wrapping_mul(salt) >> 27))
}

/// Whether a block (32 bytes, little-endian words) may hold the hash.
pub fn block_has(block: &[u8], hash: u64) -> bool {
    masks(hash).iter().enumerate().all(|(i, m)| {
        let word = u32::from_le_bytes(block[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        word & m != 0
    })
}

/// Adds a hash to a filter of `bits.len() / 32` blocks.
pub fn insert(bits: &mut [u8], hash: u64) {
    let blocks = (bits.len() / BLOCK_BYTES) as u32;
    let at = block_of(hash, blocks) * BLOCK_BYTES;
    for (i, m) in masks(hash).iter().enumerate() {
        let word = &mut bits[at + i * 4..at + i * 4 + 4];
        let v = u32::from_le_bytes((&*word).try_into().expect("4 bytes")) | m;
        word.copy_from_slice(&v.to_le_bytes());
    }
}

/// A sealed partition's filter as a backend knows it: its size, where its chunks lie, and maybe a
/// copy of its bits in the backend's memory.
pub struct Filter {
    partition: pg_sys::Oid,
    blocks: u32,
    chunks: Vec<pg_sys::ItemPointerData>,
    copy: RefCell<BitsCopy>,
}

/// A filter's bits in the backend's own memory: read once, within `idempotency.filter_cache`, so that a
/// claim reads a block with no buffer lookup, pin or tuple fetch. Filters never change once written;
/// the copies go with the rest of what the backend knows of the sealed partitions (`forget`).
enum BitsCopy {
    Unread,
    Bits(Box<[u8]>),
    /// Over the budget, or a chunk did not read as listed: read in shared buffers.
    No,
}

thread_local! {
    /// Bytes of filter copies this backend holds.
    static COPIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What a backend knows of the sealed partitions, loaded on first use and forgotten whenever the
/// record table's relcache entry is invalidated (a seal, a partition created or dropped).
#[derive(Default)]
pub struct Sealed {
    /// Sealed partitions by oid; None for one sealed without a filter (memory bound reached).
    pub filters: HashMap<pg_sys::Oid, Option<Rc<Filter>>>,
    /// `idempotency.filter_chunks`.
    pub chunks_rel: pg_sys::Oid,
    /// The end of the newest sealed partition's range (rows may be moved up to there).
    pub sealed_to: Option<pg_sys::TimestampTz>,
}

thread_local! {
    static SEALED: RefCell<Option<Rc<Sealed>>> = const { RefCell::new(None) };
}

/// Called by [`catalog`]'s relcache callback.
pub fn forget(what: Invalidated) {
    if let Invalidated::RecordTable = what {
        SEALED.with(|s| s.borrow_mut().take());
        COPIED.with(|c| c.set(0));
    }
}

/// The sealed partitions that exist, with the chunk locations of their filters, one row per
/// chunk in order (a partition without a filter has one row with a NULL chunk). A row of
/// `idempotency.sealed` counts only while its partition still has the oid and name it was sealed
/// under: a dropped partition's oid given to a new relation never inherits its filter.
static LOAD: Stmt = Stmt {
    sql: "SELECT s.partition, s.blocks, (t::text::point)[0]::int8, (t::text::point)[1]::int4,
                 (SELECT max(range_to) FROM idempotency.sealed),
                 'idempotency.filter_chunks'::regclass::oid
            FROM idempotency.sealed s
            JOIN pg_catalog.pg_class c ON c.oid = s.partition AND c.relname = s.partition_name
            JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
                 AND i.inhparent = 'idempotency.records'::regclass
            LEFT JOIN LATERAL unnest(s.chunks) WITH ORDINALITY AS u(t, n) ON true
           ORDER BY s.partition, u.n",
    args: &[],
};

/// Whether the schema has sealed partitions at all: not between the restart on this library
/// and `ALTER EXTENSION idempotency UPDATE` from 0.2.0, when everything works as 0.2.0 did.
pub fn installed() -> bool {
    // SAFETY: syscache lookups by name with C string constants; a missing schema is no error here.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), true);
        schema != pg_sys::InvalidOid && pg_sys::get_relname_relid(c"sealed".as_ptr(), schema) != pg_sys::InvalidOid
    }
}

/// What this backend knows of the sealed partitions (read under the latest snapshot when it
/// knows nothing). Knowing less than the truth is safe: a partition not known as sealed is probed.
pub fn sealed() -> Rc<Sealed> {
    if let Some(known) = SEALED.with(|s| s.borrow().clone()) {
        return known;
    }
    if !installed() {
        let known = Rc::new(Sealed::default());
        SEALED.with(|s| *s.borrow_mut() = Some(known.clone()));
        return known;
    }
    let conn = Conn::open();
    let (known, settled) = catalog::read_for_cache(|| load(&conn));
    let known = Rc::new(known);
    // Unsettled: used for this call only (knowing less than the truth is safe, see above).
    if settled {
        SEALED.with(|s| *s.borrow_mut() = Some(known.clone()));
    }
    known
}

fn load(conn: &Conn) -> Sealed {
    let mut known = Sealed::default();
    let rows = conn.run(&LOAD, &[], Snap::Latest);
    let mut building: HashMap<pg_sys::Oid, Filter> = HashMap::new();
    for i in 0..rows.len() {
        let partition: pg_sys::Oid = rows.get(i, 1).expect("partition");
        let blocks: i32 = rows.get(i, 2).expect("blocks");
        known.sealed_to = rows.get_ts(i, 5);
        known.chunks_rel = rows.get(i, 6).expect("filter_chunks");
        let (Some(block), Some(item)) = (rows.get::<i64>(i, 3), rows.get::<i32>(i, 4)) else {
            known.filters.insert(partition, None);
            continue;
        };
        let mut tid = pg_sys::ItemPointerData::default();
        pgrx::itemptr::item_pointer_set_all(&mut tid, block as u32, item as u16);
        building
            .entry(partition)
            .or_insert_with(|| Filter {
                partition,
                blocks: blocks as u32,
                chunks: Vec::new(),
                copy: RefCell::new(BitsCopy::Unread),
            })
            .chunks
            .push(tid);
    }
    for (oid, filter) in building {
        let complete =
            filter.blocks > 0 && filter.chunks.len() == (filter.blocks as usize).div_ceil(CHUNK_BLOCKS);
        known.filters.insert(oid, complete.then(|| Rc::new(filter)));
    }
    known
}

/// `idempotency.filter_chunks` for the filter reads of one lookup: opened (AccessShareLock, kept to the
/// end of the transaction, as a query would) only when bits must be read from it, so that a claim
/// answered by the backend's copies alone never opens it.
pub struct Chunks {
    oid: pg_sys::Oid,
    rel: pg_sys::Relation,
}

impl Chunks {
    pub fn new(oid: pg_sys::Oid) -> Chunks {
        Chunks { oid, rel: std::ptr::null_mut() }
    }

    /// # Safety
    /// Inside a transaction; the relation stays open until [`Chunks::close`] or the transaction's end.
    unsafe fn rel(&mut self) -> pg_sys::Relation {
        if self.rel.is_null() {
            self.rel = pg_sys::table_open(self.oid, pg_sys::AccessShareLock as i32);
        }
        self.rel
    }

    /// Closes the relation if it was opened (its lock stays to the end of the transaction).
    pub fn close(&mut self) {
        if !self.rel.is_null() {
            // SAFETY: closes the relation `rel` opened, once (the pointer is cleared).
            unsafe { pg_sys::table_close(self.rel, pg_sys::NoLock as i32) };
            self.rel = std::ptr::null_mut();
        }
    }
}

impl Filter {
    /// Whether the partition may hold the key of this hash: false only when its filter says no.
    /// Anything unexpected (a chunk row gone or not the one listed) answers "maybe": the caller
    /// then probes the index, which is never wrong.
    ///
    /// # Safety
    /// Inside a transaction; `chunks` stands for `idempotency.filter_chunks`.
    pub unsafe fn may_hold(&self, chunks: &mut Chunks, hash: u64) -> bool {
        let block = block_of(hash, self.blocks);
        if let Some(maybe) = self.from_copy(chunks, block, hash) {
            return maybe;
        }
        let (chunk, offset) = (block / CHUNK_BLOCKS, (block % CHUNK_BLOCKS) * BLOCK_BYTES);
        self.read_chunk(chunks.rel(), chunk, |data| {
            data.get(offset..offset + BLOCK_BYTES).is_none_or(|bits| block_has(bits, hash))
        })
        .unwrap_or(true)
    }

    /// The answer from the backend's copy of the bits, made on first use when the budget allows;
    /// None when there is no copy.
    ///
    /// # Safety
    /// As for [`Filter::may_hold`].
    unsafe fn from_copy(&self, chunks: &mut Chunks, block: usize, hash: u64) -> Option<bool> {
        if matches!(*self.copy.borrow(), BitsCopy::Unread) {
            let size = self.blocks as usize * BLOCK_BYTES;
            let fits = COPIED.with(|c| c.get() + size <= gucs::filter_cache());
            let mut bits = Vec::with_capacity(if fits { size } else { 0 });
            let read = fits
                && (0..self.chunks.len()).all(|chunk| {
                    self.read_chunk(chunks.rel(), chunk, |data| bits.extend_from_slice(data)).is_some()
                });
            *self.copy.borrow_mut() = if read && bits.len() >= size {
                COPIED.with(|c| c.set(c.get() + size));
                BitsCopy::Bits(bits.into_boxed_slice())
            } else {
                BitsCopy::No
            };
        }
        match &*self.copy.borrow() {
            BitsCopy::Bits(bits) => Some(block_has(&bits[block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES], hash)),
            _ => None,
        }
    }

    /// Runs `read` on the bytes of chunk number `chunk`, in place in its shared buffer. None when the
    /// row is gone or is not that chunk of this partition's filter (anything unexpected).
    ///
    /// # Safety
    /// `chunks` is `idempotency.filter_chunks`, open and locked.
    unsafe fn read_chunk<R>(&self, chunks: pg_sys::Relation, chunk: usize, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let tid = self.chunks.get(chunk)?;
        let mut tuple = pg_sys::HeapTupleData { t_self: *tid, ..Default::default() };
        let mut buffer: pg_sys::Buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
        // Any version will do: a chunk row is written once and never updated, and its partition
        // and chunk number are checked below.
        if !pg_sys::heap_fetch(chunks, &raw mut pg_sys::SnapshotAnyData, &mut tuple, &mut buffer, true) {
            if buffer != pg_sys::InvalidBuffer as pg_sys::Buffer {
                pg_sys::ReleaseBuffer(buffer);
            }
            return None;
        }
        // heap_deform_tuple writes one value per column of the relation: a column a DBA added to the
        // table would write past arrays sized for ours, so such a table is "unexpected" too.
        if (*(*chunks).rd_att).natts != 3 {
            pg_sys::ReleaseBuffer(buffer);
            return None;
        }
        let mut values = [pg_sys::Datum::from(0usize); 3];
        let mut nulls = [true; 3];
        pg_sys::heap_deform_tuple(&mut tuple, (*chunks).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
        let mut result = None;
        if !nulls.iter().any(|n| *n)
            && pg_sys::Oid::from(values[0].value() as u32) == self.partition
            && values[1].value() as i32 == chunk as i32
        {
            // Stored inline and uncompressed (STORAGE PLAIN), so this returns the page's own bytes.
            let bits = pg_sys::pg_detoast_datum_packed(values[2].cast_mut_ptr());
            let len = pgrx::varlena::varsize_any_exhdr(bits);
            let data = std::slice::from_raw_parts(pgrx::varlena::vardata_any(bits) as *const u8, len);
            result = Some(read(data));
        }
        pg_sys::ReleaseBuffer(buffer);
        result
    }
}

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
    let until = as_of.min(super::xact::clock());
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
    let _pinned = super::settings::Pinned::enter();
    let conn = Conn::open();
    // Claims this transaction remembers get their rows first: the seal must see every key.
    super::deferred::write_all(&conn, None);
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
    conn.execute(&format!("LOCK TABLE idempotency.{} IN SHARE MODE", super::spi::quote_ident(&name)));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed-seed stream of well-mixed 64-bit values (splitmix64), standing in for key hashes.
    fn hashes(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_add(0x9e3779b97f4a7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
                z ^ (z >> 31)
            })
            .collect()
    }

    fn filter_of(keys: &[u64]) -> Vec<u8> {
        let mut bits = vec![0u8; blocks_for(keys.len() as u64) as usize * BLOCK_BYTES];
        for h in keys {
            insert(&mut bits, *h);
        }
        bits
    }

    fn holds(bits: &[u8], h: u64) -> bool {
        let at = block_of(h, (bits.len() / BLOCK_BYTES) as u32) * BLOCK_BYTES;
        block_has(&bits[at..at + BLOCK_BYTES], h)
    }

    #[test]
    fn never_says_no_for_an_inserted_key() {
        for n in [1, 7, 1000, 100_000] {
            let keys = hashes(n as u64, n);
            let bits = filter_of(&keys);
            assert!(keys.iter().all(|h| holds(&bits, *h)), "a false no among {n} keys");
        }
    }

    #[test]
    fn false_maybe_rate_is_about_a_fifth_of_a_percent() {
        let keys = hashes(1, 200_000);
        let bits = filter_of(&keys);
        let others = hashes(2, 200_000);
        let maybes = others.iter().filter(|h| holds(&bits, **h)).count();
        let rate = maybes as f64 / others.len() as f64;
        assert!(rate < 0.003, "false maybe rate {rate}");
        assert!(rate > 0.0005, "suspiciously few false maybes: {rate}");
    }

    #[test]
    fn size_is_fifteen_bits_a_key() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(1_000_000) as usize * BLOCK_BYTES, 1_875_008);
        assert!(CHUNK_BLOCKS * BLOCK_BYTES + 64 < 8160, "a chunk row fits one heap page");
    }
}
