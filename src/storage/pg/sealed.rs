//! What a backend knows of the sealed partitions (loaded from `idempotency.sealed` on first use,
//! forgotten at every relcache invalidation of the record table), and the reads of their filters'
//! bits: from the backend's own copy when `idempotency.filter_cache` allows, else in place in the
//! shared buffer of their `idempotency.filter_chunks` row. Filters are written by
//! `lifecycle::sealing`; their arithmetic is `filter`.
use super::catalog::{self, Invalidated};
use super::filter::{block_has, block_of, prefetch_read, Bits, BLOCK_BYTES, CHUNK_BLOCKS};
use crate::gucs;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A sealed partition's filter as a backend knows it: its size, where its chunks lie, and maybe a
/// copy of its bits in the backend's memory.
pub struct Filter {
    partition: pg_sys::Oid,
    blocks: u32,
    chunks: Vec<pg_sys::ItemPointerData>,
    copy: RefCell<BitsCopy>,
}

/// A filter's bits in the backend's own memory, within `idempotency.filter_cache`, so that a claim reads
/// a block with no buffer lookup, pin or tuple fetch. Filters never change once written; the copies go
/// with the rest of what the backend knows of the sealed partitions (`forget`).
///
/// A chunk (one page of bits) is copied the first time a lookup reads one of its blocks: a new
/// connection's first call at a week copied all seven filters whole (7.5 MB, 945 chunks) for the seven
/// blocks it read, about half of that call's 12 ms (`benches/first-call`). The space is allocated
/// zeroed when the filter is first read (fresh pages from the system, usually, that stay untouched until
/// a chunk is copied there).
enum BitsCopy {
    Unread,
    Bits { bits: Bits, chunks: Box<[Chunk]> },
    /// Over the budget: read in shared buffers.
    No,
}

/// One chunk of a filter's copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Chunk {
    NotCopied,
    Copied,
    /// Its row did not read as `idempotency.sealed` lists it: its blocks answer "maybe".
    Unexpected,
}

thread_local! {
    /// Bytes of filter copies this backend holds (given back when a filter drops).
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
        // (The copies' bytes are given back as their filters drop: now, or when a lookup still running lets
        // them go.)
        SEALED.with(|s| s.borrow_mut().take());
    }
}

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
    let (known, settled) = catalog::read_for_cache(load, |_, what| matches!(what, Invalidated::RecordTable));
    let known = Rc::new(known);
    // Unsettled: used for this call only (knowing less than the truth is safe, see above).
    if settled {
        SEALED.with(|s| *s.borrow_mut() = Some(known.clone()));
    }
    known
}

extern "C" {
    // `catalog/partition.h`, which pgrx's bindings leave out; the same signature in 15 to 18.
    fn get_partition_parent(relid: pg_sys::Oid, even_if_detached: bool) -> pg_sys::Oid;
}

/// A sealed partition as `idempotency.sealed` lists it.
struct Row {
    partition: pg_sys::Oid,
    name: String,
    blocks: i32,
    chunks: Vec<pg_sys::ItemPointerData>,
    range_to: pg_sys::TimestampTz,
}

/// The rows of `idempotency.sealed` the latest snapshot sees, read without predicate locks (see
/// `latest`): a seal committed while SERIALIZABLE consumers run must not conflict with each of them.
///
/// # Safety
/// Inside a transaction; the table exists.
unsafe fn read_rows(table: pg_sys::Oid) -> Vec<Row> {
    let mut rows = Vec::new();
    let columns = [c"partition", c"partition_name", c"blocks", c"chunks", c"range_to"];
    super::latest::each_row(table, &columns, |v| {
        let [Some(partition), Some(name), Some(blocks), Some(chunks), Some(range_to)] = v else {
            return; // NOT NULL columns
        };
        let name = std::ffi::CStr::from_ptr(name.cast_mut_ptr::<std::ffi::c_char>()).to_string_lossy().into_owned();
        rows.push(Row {
            partition: pg_sys::Oid::from(partition.value() as u32),
            name,
            blocks: blocks.value() as i32,
            chunks: tids(*chunks),
            range_to: range_to.value() as i64,
        });
    });
    rows
}

/// The elements of a `tid[]` without NULLs, in order.
///
/// # Safety
/// `datum` is a non-NULL `tid[]`, maybe toasted.
unsafe fn tids(datum: pg_sys::Datum) -> Vec<pg_sys::ItemPointerData> {
    let array = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
    let (mut elems, mut nulls, mut n) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
    // tid: 6 bytes, by reference, aligned on shorts.
    pg_sys::deconstruct_array(array, pg_sys::TIDOID, 6, false, b's' as std::ffi::c_char, &mut elems, &mut nulls, &mut n);
    (0..n as usize)
        .filter(|&i| !*nulls.add(i))
        .map(|i| *((*elems.add(i)).cast_mut_ptr::<pg_sys::ItemPointerData>()))
        .collect()
}

/// Whether `partition` is still the partition of the record table named `name` (a dropped partition's
/// oid given to a new relation never inherits its filter).
fn still_there(partition: pg_sys::Oid, name: &str) -> bool {
    // SAFETY: syscache and pg_inherits lookups by oid; get_partition_parent is only asked about a
    // relation that is a partition, which always has a parent.
    unsafe {
        let relname = pg_sys::get_rel_name(partition);
        if relname.is_null() || std::ffi::CStr::from_ptr(relname).to_bytes() != name.as_bytes() {
            return false;
        }
        pg_sys::get_rel_relispartition(partition) && get_partition_parent(partition, true) == catalog::records_oid()
    }
}

fn load() -> Sealed {
    let mut known = Sealed::default();
    // SAFETY: inside the caller's transaction; `installed` found the table.
    let rows = unsafe {
        let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), false);
        read_rows(pg_sys::get_relname_relid(c"sealed".as_ptr(), schema))
    };
    let newest = rows.iter().map(|r| r.range_to).max();
    for row in rows.into_iter().filter(|r| still_there(r.partition, &r.name)) {
        known.sealed_to = newest;
        if known.chunks_rel == pg_sys::InvalidOid {
            // SAFETY: a catalog lookup by name; the table comes with `sealed`.
            known.chunks_rel = unsafe {
                let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), false);
                pg_sys::get_relname_relid(c"filter_chunks".as_ptr(), schema)
            };
        }
        let filter = Filter {
            partition: row.partition,
            blocks: row.blocks as u32,
            chunks: row.chunks,
            copy: RefCell::new(BitsCopy::Unread),
        };
        let complete =
            filter.blocks > 0 && filter.chunks.len() == (filter.blocks as usize).div_ceil(CHUNK_BLOCKS);
        known.filters.insert(row.partition, complete.then(|| Rc::new(filter)));
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

    /// Asks the CPU to start loading the block a lookup of this hash will test, when the backend has
    /// that chunk copied: a lookup tests one block per sealed partition, each a likely cache miss at a
    /// week of keys (several megabytes of filters per backend), so all of a key's blocks are asked for
    /// before the first is tested, and their loads overlap. Changes nothing and reads nothing.
    pub fn prefetch(&self, hash: u64) {
        let Ok(copy) = self.copy.try_borrow() else {
            return;
        };
        let BitsCopy::Bits { bits, chunks } = &*copy else {
            return;
        };
        let block = block_of(hash, self.blocks);
        if chunks.get(block / CHUNK_BLOCKS) == Some(&Chunk::Copied) {
            if let Some(bytes) = bits.get(block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES) {
                prefetch_read(bytes.as_ptr());
            }
        }
    }

    /// The answer from the backend's copy of the bits, its chunk copied on first use (see [`BitsCopy`]):
    /// "maybe" for a chunk that did not read as listed (anything unexpected, as [`Filter::may_hold`] says);
    /// None when there is no copy.
    ///
    /// # Safety
    /// As for [`Filter::may_hold`].
    unsafe fn from_copy(&self, chunks: &mut Chunks, block: usize, hash: u64) -> Option<bool> {
        let mut copy = self.copy.borrow_mut();
        if matches!(*copy, BitsCopy::Unread) {
            let size = self.blocks as usize * BLOCK_BYTES;
            *copy = if COPIED.with(|c| c.get() + size <= gucs::filter_cache()) {
                COPIED.with(|c| c.set(c.get() + size));
                BitsCopy::Bits {
                    bits: Bits::zeroed(size),
                    chunks: vec![Chunk::NotCopied; self.chunks.len()].into_boxed_slice(),
                }
            } else {
                BitsCopy::No
            };
        }
        let BitsCopy::Bits { bits, chunks: state } = &mut *copy else {
            return None;
        };
        let chunk = block / CHUNK_BLOCKS;
        let start = chunk * CHUNK_BLOCKS * BLOCK_BYTES;
        let end = bits.len().min(start + CHUNK_BLOCKS * BLOCK_BYTES);
        if *state.get(chunk)? == Chunk::NotCopied {
            let whole = self.read_chunk(chunks.rel(), chunk, |data| {
                let (into, from) = (bits.get_mut(start..end), data.get(..end.saturating_sub(start)));
                into.zip(from).map(|(into, from)| into.copy_from_slice(from)).is_some()
            });
            state[chunk] = if whole == Some(true) { Chunk::Copied } else { Chunk::Unexpected };
        }
        if state[chunk] == Chunk::Unexpected {
            return Some(true);
        }
        bits.get(block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES).map(|b| block_has(b, hash))
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

impl Drop for Filter {
    fn drop(&mut self) {
        if let BitsCopy::Bits { bits, .. } = self.copy.get_mut() {
            let _ = COPIED.try_with(|c| c.set(c.get().saturating_sub(bits.len())));
        }
    }
}
