//! Finds keys' records by probing each partition's lookup index on `(key, scope)` directly.
//!
//! A key can be in any partition, so every lookup searches them all. Through SPI that is an
//! executor plan with one index scan per partition, and starting that executor cost most of
//! `idem_once`'s CPU (measured with perf: `ExecutorStart` plus the CTE's subplans, 60-70%).
//! Here the same access method calls (`index_beginscan`, `index_getnext_slot`) run without the
//! executor, under the latest snapshot, taking the same `AccessShareLock`s the plan would, so
//! visibility, HOT chains and SERIALIZABLE's predicate locks behave exactly as they did.
use super::catalog::{self, Invalidated};
use super::sealed::{self, Chunks, Filter};
use super::keylock;
use super::unlocked;
use super::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The record columns a lookup reads, in the order of [`COLUMN_NAMES`].
#[derive(Clone, Copy)]
pub enum Col {
    Status,
    Token,
    Attempts,
    Fingerprint,
    ExpiresAt,
    Payload,
    Error,
}

const COLUMN_NAMES: [&std::ffi::CStr; 7] =
    [c"status", c"token", c"attempts", c"fingerprint", c"expires_at", c"payload", c"error"];

/// What a backend remembers about one partition: its lookup index and where the columns
/// are (a partition attached by a DBA may order its columns differently from the parent).
#[derive(Clone, Copy)]
struct Layout {
    index: pg_sys::Oid,
    /// The index is on `(key, scope)` (0.7.0 on), rather than `(scope, key)` (until the update to 0.7.0).
    key_first: bool,
    columns: [i32; 7],
}

thread_local! {
    static LAYOUTS: RefCell<HashMap<pg_sys::Oid, Layout>> = RefCell::new(HashMap::new());
}

/// Forgets what was learned from a partition whose relcache entry was invalidated (index rebuilt,
/// column dropped, partition dropped), or from all of them. Called by [`catalog`]'s callback.
pub fn forget_layouts(what: Invalidated) {
    LAYOUTS.with(|l| match what {
        Invalidated::RecordTable => l.borrow_mut().clear(),
        Invalidated::Relation(relid) => {
            l.borrow_mut().remove(&relid);
        }
    });
}

/// The lookup index of an open partition, on `(key, scope)` or `(scope, key)`, and its column numbers.
///
/// # Safety
/// `part` is an open relation, a leaf partition of the record table.
unsafe fn layout(part: pg_sys::Relation) -> Layout {
    let relid = (*part).rd_id;
    if let Some(found) = LAYOUTS.with(|l| l.borrow().get(&relid).copied()) {
        return found;
    }
    let desc = (*part).rd_att;
    let mut columns = [0i32; 7];
    for (slot, name) in columns.iter_mut().zip(COLUMN_NAMES) {
        *slot = pg_sys::SPI_fnumber(desc, name.as_ptr());
        if *slot <= 0 {
            panic!("partition {} of idempotency.records has no column {name:?}", name_of(part));
        }
    }
    let scope_col = pg_sys::SPI_fnumber(desc, c"scope".as_ptr()) as i16;
    let key_col = pg_sys::SPI_fnumber(desc, c"key".as_ptr()) as i16;
    let list = pg_sys::RelationGetIndexList(part);
    let mut index = pg_sys::InvalidOid;
    let mut key_first = false;
    for i in 0..if list.is_null() { 0 } else { (*list).length } {
        let candidate = (*(*list).elements.add(i as usize)).oid_value;
        let rel = pg_sys::index_open(candidate, pg_sys::AccessShareLock as i32);
        let form = (*rel).rd_index;
        // (The first two key columns, read only when the index has two: `indkey` has `indnatts` entries.)
        let leading = ((*form).indnkeyatts >= 2).then(|| (*form).indkey.values.as_slice(2));
        let usable = (*(*rel).rd_rel).relam == pg_sys::BTREE_AM_OID
            && (*form).indisvalid
            && (leading == Some(&[scope_col, key_col][..]) || leading == Some(&[key_col, scope_col][..]))
            && pg_sys::RelationGetIndexPredicate(rel).is_null();
        key_first = leading == Some(&[key_col, scope_col][..]);
        pg_sys::index_close(rel, pg_sys::NoLock as i32);
        if usable {
            index = candidate;
            break;
        }
    }
    if index == pg_sys::InvalidOid {
        crate::errors::partition_not_indexed(&name_of(part));
    }
    let found = Layout { index, key_first, columns };
    LAYOUTS.with(|l| l.borrow_mut().insert(relid, found));
    found
}

/// # Safety
/// `rel` is an open relation.
unsafe fn name_of(rel: pg_sys::Relation) -> String {
    std::ffi::CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned()
}

/// One partition, open, with an index scan ready to be pointed at a key.
struct Partition {
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    scan: pg_sys::IndexScanDesc,
    /// A scan under the prober's dirty snapshot, made on first use (see `unfinished_insert`).
    dirty_scan: pg_sys::IndexScanDesc,
    slot: *mut pg_sys::TupleTableSlot,
    columns: [i32; 7],
    key_first: bool,
}

/// A partition to search: opened on first use; a sealed one with a filter only when its filter
/// says the key may be there.
struct Part {
    relid: pg_sys::Oid,
    /// Sealed: it takes no new row (see `lifecycle::sealing`).
    sealed: bool,
    filter: Option<Rc<Filter>>,
    open: Option<Partition>,
}

/// Scans over every partition, for lookups of keys of one scope under the latest snapshot.
/// Open it after taking the keys' locks, so that the snapshot sees what their previous holders
/// committed. Every relation it opens stays locked (`AccessShareLock`) until the end of the
/// transaction, as a query would leave it; the record table's own lock keeps every partition
/// from being dropped meanwhile, so those opened later are still there.
pub struct Prober {
    scope: pg_sys::Datum,
    scope_text: String,
    snapshot: pg_sys::Snapshot,
    parts: Vec<Part>,
    /// `idempotency.filter_chunks`, opened at the first read of a filter that has no copy.
    chunks: Chunks,
    /// A dirty snapshot (it sees uncommitted rows), when another transaction may have unfinished writes
    /// of keys it no longer locks (see `unlocked`); boxed, for the scans that point at it.
    dirty: Option<Box<pg_sys::SnapshotData>>,
}

impl Prober {
    pub fn open(scope: &str) -> Prober {
        let known = sealed::sealed();
        // SAFETY: called inside a transaction (from a SQL function): the snapshot is registered here and
        // unregistered in `drop` (or released by the abort); the record table is opened and locked by
        // PostgreSQL's own functions.
        unsafe {
            // Read before the snapshot, which must then see what a transaction counted there committed
            // before it was no longer counted (its end is visible before the count drops).
            let dirty = unlocked::others_may_have().then(|| {
                Box::new(pg_sys::SnapshotData {
                    snapshot_type: pg_sys::SnapshotType::SNAPSHOT_DIRTY,
                    ..Default::default()
                })
            });
            let mut leaves = Vec::new();
            // Rows moved out of sealed partitions may start as late as the newest seal's end.
            let horizon = xact::clock().max(known.sealed_to.unwrap_or(i64::MIN)) + FUTURE_MARGIN_US;
            // (Opening the record table may wait behind a partition drop: the snapshot is taken after.)
            collect_leaves(catalog::records_oid(), Some(horizon), &mut leaves);
            // Newest first: a duplicate is most likely a recent key.
            leaves.reverse();
            let parts = leaves
                .into_iter()
                .map(|relid| Part {
                    relid,
                    sealed: known.filters.contains_key(&relid),
                    filter: known.filters.get(&relid).cloned().flatten(),
                    open: None,
                })
                .collect();
            // Like a non-read-only SPI statement: make this transaction's earlier writes visible.
            pg_sys::CommandCounterIncrement();
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
            Prober {
                scope: scope.into_datum().expect("text datum"),
                scope_text: scope.to_string(),
                snapshot,
                parts,
                chunks: Chunks::new(known.chunks_rel),
                dirty,
            }
        }
    }

    /// Finds `key`'s record and hands it to `read` while it is pinned; None when no partition
    /// has it. What the latest snapshot sees, committed: for reads that take no key lock.
    pub fn find<T>(&mut self, key: &str, read: impl FnOnce(&Tuple) -> T) -> Option<T> {
        let key_datum = key.into_datum().expect("text datum");
        let i = self.locate(key, key_datum)?;
        let part = self.parts[i].open.as_ref().expect("located in an open partition");
        Some(Self::read_found(part, read))
    }

    /// As [`Prober::find`], for a caller that holds the key's lock and may write the key: the record
    /// only when no other transaction has an unfinished write of the key, which a transaction that
    /// gave the key's lock back may have (see `unlocked`): then `Busy` with that transaction (None when
    /// the write has just committed, and a new prober will see it), and the caller gives its lock back,
    /// waits for that transaction and looks again.
    pub fn find_settled<T>(&mut self, key: &str, read: impl FnOnce(&Tuple) -> T) -> Probe<T> {
        let key_datum = key.into_datum().expect("text datum");
        match self.locate(key, key_datum) {
            Some(i) => {
                let part = self.parts[i].open.as_ref().expect("located in an open partition");
                if let Some(dirty) = self.dirty.as_deref_mut() {
                    // SAFETY: the slot holds the pinned tuple `locate` found.
                    if let Err(writer) = unsafe { settled(part.slot, dirty) } {
                        // SAFETY: the slot is this partition's, holding a tuple.
                        unsafe { pg_sys::ExecClearTuple(part.slot) };
                        return Probe::Busy(writer);
                    }
                }
                Probe::Found(Self::read_found(part, read))
            }
            None if self.dirty.is_some() => match self.unfinished_insert(key_datum) {
                Some(writer) => Probe::Busy(writer),
                None => Probe::Missing,
            },
            None => Probe::Missing,
        }
    }

    fn read_found<T>(part: &Partition, read: impl FnOnce(&Tuple) -> T) -> T {
        // SAFETY: the slot holds the tuple `locate` found, pinned until ExecClearTuple.
        unsafe {
            // The per-key lock and the waits of `find_settled` allow one such record per key: this one.
            let tuple = Tuple { slot: part.slot, columns: &part.columns, relid: (*part.heap).rd_id };
            let answer = read(&tuple);
            pg_sys::ExecClearTuple(part.slot);
            answer
        }
    }

    /// The partition whose slot now holds `key`'s record under the snapshot, if any.
    fn locate(&mut self, key: &str, key_datum: pg_sys::Datum) -> Option<usize> {
        let mut hash = None;
        let scope = self.scope;
        for i in 0..self.parts.len() {
            if let Some(filter) = self.parts[i].filter.clone() {
                let h = *hash.get_or_insert_with(|| keylock::hash_key(&self.scope_text, key));
                // SAFETY: inside the caller's transaction; `chunks` is closed in `drop`.
                let maybe = unsafe { filter.may_hold(&mut self.chunks, h) };
                if !maybe {
                    continue;
                }
            }
            let part = self.partition(i);
            // SAFETY: the scan and slot are those `open_partition` made.
            if unsafe { fetch(part, part.scan, scope, key_datum) } {
                return Some(i);
            }
        }
        None
    }

    /// Partition `i`, opened on first use.
    fn partition(&mut self, i: usize) -> &mut Partition {
        let snapshot = self.snapshot;
        let part = &mut self.parts[i];
        // SAFETY: opens a leaf of the record table, which the lock on the record table keeps in
        // place; the scan is made for that index under our registered snapshot.
        part.open.get_or_insert_with(|| unsafe { open_partition(part.relid, snapshot) })
    }

    /// Another transaction's uncommitted insert of the key, or an insert committed after the snapshot,
    /// in a partition that takes inserts (a sealed one takes none). Some(its transaction, or None
    /// when committed); None when there is none.
    fn unfinished_insert(&mut self, key_datum: pg_sys::Datum) -> Option<Option<pg_sys::TransactionId>> {
        let dirty: *mut pg_sys::SnapshotData = self.dirty.as_deref_mut().expect("a dirty snapshot");
        let scope = self.scope;
        for i in 0..self.parts.len() {
            if self.parts[i].sealed {
                continue;
            }
            let part = self.partition(i);
            // SAFETY: the dirty scan is made once per partition under the prober's own dirty snapshot
            // (which lives in a Box as long as the prober) and ended in `drop`; the slot is reused,
            // cleared after each tuple.
            unsafe {
                if part.dirty_scan.is_null() {
                    part.dirty_scan = super::compat::index_beginscan(part.heap, part.index, dirty, 2, 0);
                }
                (*dirty).xmin = pg_sys::InvalidTransactionId;
                (*dirty).xmax = pg_sys::InvalidTransactionId;
                let mut found = fetch(part, part.dirty_scan, scope, key_datum);
                while found {
                    let tuple = Tuple { slot: part.slot, columns: &part.columns, relid: (*part.heap).rd_id };
                    let own = pg_sys::TransactionIdIsCurrentTransactionId(tuple.xmin());
                    pg_sys::ExecClearTuple(part.slot);
                    if !own {
                        let writer = [(*dirty).xmin, (*dirty).xmax].into_iter().find(|x| *x != pg_sys::InvalidTransactionId);
                        return Some(writer);
                    }
                    // Another version of the chain: a non-MVCC scan returns every one it may see.
                    found = pg_sys::index_getnext_slot(
                        part.dirty_scan,
                        pg_sys::ScanDirection::ForwardScanDirection,
                        part.slot,
                    );
                }
            }
        }
        None
    }
}

/// What [`Prober::find_settled`] found.
pub enum Probe<T> {
    Found(T),
    Missing,
    /// Another transaction is writing the key: wait for it (Some), or look again (None).
    Busy(Option<pg_sys::TransactionId>),
}

/// Points `scan` (of `part`'s index) at `(scope, key)`; true when its first tuple is now in the slot.
///
/// # Safety
/// `scan` is an index scan of `part.index`, made by this module; `part.slot` is empty.
unsafe fn fetch(part: &Partition, scan: pg_sys::IndexScanDesc, scope: pg_sys::Datum, key: pg_sys::Datum) -> bool {
    let mut keys: [pg_sys::ScanKeyData; 2] = Default::default();
    // In the index's column order.
    let values = if part.key_first { [key, scope] } else { [scope, key] };
    for (i, (entry, value)) in keys.iter_mut().zip(values).enumerate() {
        pg_sys::ScanKeyEntryInitialize(
            entry,
            0,
            (i + 1) as i16,
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::InvalidOid,
            *(*part.index).rd_indcollation.add(i),
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            value,
        );
    }
    // The scan keys live on this stack frame during the rescan, which copies them.
    pg_sys::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
    pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, part.slot)
}

/// Whether the version a snapshot found is still the key's settled record: Err(Some(xid)) when another
/// transaction is updating or deleting it, Err(None) when a transaction that committed after the
/// snapshot did.
///
/// # Safety
/// `slot` is a buffer heap tuple slot holding a pinned tuple.
unsafe fn settled(slot: *mut pg_sys::TupleTableSlot, dirty: &mut pg_sys::SnapshotData) -> Result<(), Option<pg_sys::TransactionId>> {
    let slot = slot as *mut pg_sys::BufferHeapTupleTableSlot;
    let buffer = (*slot).buffer;
    dirty.xmin = pg_sys::InvalidTransactionId;
    dirty.xmax = pg_sys::InvalidTransactionId;
    // Visibility reads (and may set) the tuple's hint bits: under the buffer's share lock, as a scan does.
    pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
    let visible = pg_sys::HeapTupleSatisfiesVisibility((*slot).base.tuple, dirty, buffer);
    let raw_xmax = (*(*(*slot).base.tuple).t_data).t_choice.t_heap.t_xmax;
    pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_UNLOCK as i32);
    if dirty.xmax != pg_sys::InvalidTransactionId {
        return Err(Some(dirty.xmax));
    }
    if !visible && !pg_sys::TransactionIdIsCurrentTransactionId(raw_xmax) {
        return Err(None);
    }
    Ok(())
}

/// Opens a partition, its lookup index and a scan of it under `snapshot`.
///
/// # Safety
/// Inside a transaction that holds a lock on the record table; `relid` is one of its leaves.
unsafe fn open_partition(relid: pg_sys::Oid, snapshot: pg_sys::Snapshot) -> Partition {
    let heap = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
    let layout = layout(heap);
    let index = pg_sys::index_open(layout.index, pg_sys::AccessShareLock as i32);
    let scan = super::compat::index_beginscan(heap, index, snapshot, 2, 0);
    let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
    Partition {
        heap,
        index,
        scan,
        dirty_scan: std::ptr::null_mut(),
        slot,
        columns: layout.columns,
        key_first: layout.key_first,
    }
}

/// Partitions premade for later than this past the current time are not searched: rows get
/// `created_at = now()`, the start of their transaction, which began before the lookup (that
/// waited for the key's lock). The margin absorbs a system clock stepped backwards.
const FUTURE_MARGIN_US: i64 = 3600 * 1_000_000;

/// The leaf partitions under `relid`, oldest range first (partition descriptors list partitions
/// in bound order); when `horizon` is given, without the partitions whose range starts after it.
/// Partitioned tables on the way are opened and locked (the locks stay until the transaction
/// ends); the leaves are not opened.
///
/// # Safety
/// Inside a transaction; `relid` is the record table or one of its partitions.
unsafe fn collect_leaves(
    relid: pg_sys::Oid,
    horizon: Option<pg_sys::TimestampTz>,
    out: &mut Vec<pg_sys::Oid>,
) {
    if relid != catalog::records_oid()
        && pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_PARTITIONED_TABLE
    {
        out.push(relid);
        return;
    }
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
    // Copied before opening the children: opening them may process invalidations.
    let desc = pg_sys::RelationGetPartitionDesc(rel, true);
    // (A table without partitions may have no array at all: from_raw_parts needs a pointer.)
    let children: Vec<pg_sys::Oid> = if (*desc).nparts == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts((*desc).oids, (*desc).nparts as usize).to_vec()
    };
    let starts = horizon.map(|_| range_starts(desc)).unwrap_or_default();
    pg_sys::table_close(rel, pg_sys::NoLock as i32);
    for (i, child) in children.into_iter().enumerate() {
        let later = matches!((starts.get(i), horizon), (Some(Some(start)), Some(h)) if *start > h);
        if !later {
            collect_leaves(child, None, out);
        }
    }
}

/// The lower bound of each partition of a range-partitioned table on one timestamptz column,
/// by position in the partition descriptor; None where unknown (a default partition, MINVALUE).
///
/// # Safety
/// `desc` is the partition descriptor of an open partitioned table, valid while it stays open.
unsafe fn range_starts(desc: pg_sys::PartitionDesc) -> Vec<Option<pg_sys::TimestampTz>> {
    let mut starts = vec![None; (*desc).nparts as usize];
    let bounds = (*desc).boundinfo;
    if bounds.is_null() || (*bounds).strategy as u8 != super::compat::PARTITION_STRATEGY_RANGE {
        return starts;
    }
    // Range bounds are sorted; indexes[i] is the partition whose range ends at bound i, and so
    // starts at bound i - 1 (or -1 when no partition ends there).
    for i in 1..(*bounds).ndatums as usize {
        let part = *(*bounds).indexes.add(i);
        if part < 0 || part as usize >= starts.len() {
            continue;
        }
        if **(*bounds).kind.add(i - 1) == pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE {
            starts[part as usize] = Some((**(*bounds).datums.add(i - 1)).value() as i64);
        }
    }
    starts
}

impl Drop for Prober {
    fn drop(&mut self) {
        // On an ERROR the transaction's abort releases scans, pins and relations itself.
        if std::thread::panicking() {
            return;
        }
        // SAFETY: releases exactly what `open` acquired, once: slots, scans, relations (their locks stay
        // to the end of the transaction, as a query's would) and the registered snapshot.
        unsafe {
            for part in self.parts.iter().filter_map(|p| p.open.as_ref()) {
                pg_sys::ExecDropSingleTupleTableSlot(part.slot);
                pg_sys::index_endscan(part.scan);
                if !part.dirty_scan.is_null() {
                    pg_sys::index_endscan(part.dirty_scan);
                }
                pg_sys::index_close(part.index, pg_sys::NoLock as i32);
                pg_sys::table_close(part.heap, pg_sys::NoLock as i32);
            }
            self.chunks.close();
            pg_sys::UnregisterSnapshot(self.snapshot);
        }
    }
}

/// A record found by [`Prober::find`], readable while it is pinned.
pub struct Tuple<'a> {
    slot: *mut pg_sys::TupleTableSlot,
    columns: &'a [i32; 7],
    relid: pg_sys::Oid,
}

impl Tuple<'_> {
    fn raw(&self, col: Col) -> Option<pg_sys::Datum> {
        let mut isnull = false;
        // SAFETY: the slot holds a pinned tuple of this partition (see `find`) and the column number
        // comes from the partition's own tuple descriptor.
        let datum = unsafe { pg_sys::slot_getattr(self.slot, self.columns[col as usize], &mut isnull) };
        (!isnull).then_some(datum)
    }

    /// A column copied into `T`.
    pub fn get<T: FromDatum>(&self, col: Col) -> Option<T> {
        // SAFETY: a non-NULL datum of the column's own type, read from the pinned tuple.
        self.raw(col).and_then(|d| unsafe { T::from_datum(d, false) })
    }

    /// A timestamptz column as PostgreSQL's microseconds since 2000-01-01.
    pub fn get_ts(&self, col: Col) -> Option<pg_sys::TimestampTz> {
        self.raw(col).map(|d| d.value() as i64)
    }

    /// A jsonb column, detoasted and copied out of the buffer and of SPI's memory.
    pub fn get_document(&self, col: Col) -> Option<super::document::Document> {
        self.raw(col).map(super::document::Document::copy_out)
    }

    /// The partition that holds this row.
    pub fn partition(&self) -> pg_sys::Oid {
        self.relid
    }

    /// This row version's ctid.
    pub fn tid(&self) -> pg_sys::ItemPointerData {
        // SAFETY: the slot is valid while the tuple is pinned (see `find`).
        unsafe { (*self.slot).tts_tid }
    }

    /// The inserting transaction of this row version.
    pub fn xmin(&self) -> pg_sys::TransactionId {
        let mut isnull = false;
        // SAFETY: xmin is a system attribute every heap tuple has; the slot holds a pinned heap tuple.
        let datum = unsafe {
            pg_sys::slot_getsysattr(self.slot, pg_sys::MinTransactionIdAttributeNumber, &mut isnull)
        };
        pg_sys::TransactionId::from(datum.value() as u32)
    }
}
