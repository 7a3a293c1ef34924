//! One partition of the record table as a lookup uses it: opened (heap, lookup index, a slot), with index
//! scans made on first use and pointed at one key at a time, and closed by the prober that opened it
//! (see `probe`).
use super::layout;
use super::unguarded;
use pgrx::pg_sys;

/// One partition, open, with an index scan ready to be pointed at a key.
pub struct Partition {
    pub heap: pg_sys::Relation,
    pub index: pg_sys::Relation,
    /// A scan under the latest snapshot, as a plan reads (predicate locks included), made on first use.
    pub mvcc_scan: pg_sys::IndexScanDesc,
    /// A scan that takes no predicate locks, whose tuples are tested against the latest snapshot (see
    /// `latest`), made on first use.
    pub quiet_scan: pg_sys::IndexScanDesc,
    /// A scan under the prober's dirty snapshot, made on first use (see `unfinished_insert`).
    pub dirty_scan: pg_sys::IndexScanDesc,
    pub slot: *mut pg_sys::TupleTableSlot,
    pub columns: [i32; 7],
    pub key_first: bool,
}

/// Opens a partition and its lookup index.
///
/// # Safety
/// Inside a transaction that holds a lock on the record table; `relid` is one of its leaves.
pub unsafe fn open(relid: pg_sys::Oid) -> Partition {
    let heap = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
    let layout = layout::layout(heap);
    let (index, slot) = unguarded::section(|| {
        let index = unguarded::index_open(layout.index, pg_sys::AccessShareLock as i32);
        (index, unguarded::table_slot_create(heap, std::ptr::null_mut()))
    });
    Partition {
        heap,
        index,
        mvcc_scan: std::ptr::null_mut(),
        quiet_scan: std::ptr::null_mut(),
        dirty_scan: std::ptr::null_mut(),
        slot,
        columns: layout.columns,
        key_first: layout.key_first,
    }
}

impl Partition {
    /// Drops the slot, ends the scans made and closes the index and the heap (their locks stay to the end of
    /// the transaction, as a query's would).
    ///
    /// # Safety
    /// Inside an `unguarded::section`, once, for a partition [`open`] opened in this transaction.
    pub unsafe fn close(&self) {
        unguarded::ExecDropSingleTupleTableSlot(self.slot);
        for &scan in [self.mvcc_scan, self.quiet_scan, self.dirty_scan].iter() {
            if !scan.is_null() {
                unguarded::index_endscan(scan);
            }
        }
        unguarded::index_close(self.index, pg_sys::NoLock as i32);
        unguarded::table_close(self.heap, pg_sys::NoLock as i32);
    }
}

/// A key an index scan is pointed at: its `text` datum is made by the first scan that needs it, inside that
/// scan's section (palloc'd in the current memory context, without a guard of its own), and reused by the
/// lookup's other scans.
pub struct KeyArg<'a> {
    key: &'a str,
    datum: Option<pg_sys::Datum>,
}

impl<'a> KeyArg<'a> {
    pub fn new(key: &'a str) -> KeyArg<'a> {
        KeyArg { key, datum: None }
    }

    pub fn key(&self) -> &'a str {
        self.key
    }

    /// # Safety
    /// Inside an `unguarded::section`.
    #[inline(always)]
    unsafe fn datum(&mut self) -> pg_sys::Datum {
        let key = self.key;
        // SAFETY: the caller's contract.
        *self.datum.get_or_insert_with(|| unsafe { unguarded::text_datum(key) })
    }
}

/// Points `scan` (of `part`'s index) at `(scope, key)`; true when its first tuple is now in the slot.
///
/// # Safety
/// `scan` is an index scan of `part.index`, made by this module; `part.slot` is empty.
pub unsafe fn fetch(part: &Partition, scan: pg_sys::IndexScanDesc, scope: pg_sys::Datum, key: &mut KeyArg) -> bool {
    // SAFETY: the caller's contract; the section calls only `unguarded`'s functions, on plain values and
    // scan keys on its own stack frame, which the rescan copies.
    unsafe {
        unguarded::section(|| {
            let key = key.datum();
            let values = if part.key_first { [key, scope] } else { [scope, key] }; // in the index's column order
            let mut keys: [pg_sys::ScanKeyData; 2] = Default::default();
            // (Attribute numbers and collation slots written out: no arithmetic in the section.)
            let columns = [(1i16, 0usize), (2, 1)];
            for ((entry, &value), &(attno, at)) in keys.iter_mut().zip(values.iter()).zip(columns.iter()) {
                unguarded::ScanKeyEntryInitialize(
                    entry,
                    0,
                    attno,
                    pg_sys::BTEqualStrategyNumber as u16,
                    pg_sys::InvalidOid,
                    *(*part.index).rd_indcollation.add(at),
                    pg_sys::Oid::from(pg_sys::F_TEXTEQ),
                    value,
                );
            }
            unguarded::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
            unguarded::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, part.slot)
        })
    }
}
