//! Reads under the latest snapshot that take no SERIALIZABLE predicate (SIRead) locks.
//!
//! PostgreSQL takes predicate locks, and checks for rw-conflicts out, on every read made under an MVCC
//! snapshot by a SERIALIZABLE transaction: an index scan locks the leaf pages it reads, a heap scan the
//! whole relation. Its own uniqueness checks (`_bt_check_unique`) read under a dirty snapshot instead,
//! so `INSERT ... ON CONFLICT DO NOTHING` leaves none. The storage's reads that need none are made the
//! same way: the scan runs under a snapshot that is not MVCC (so the access methods skip predicate
//! locking, see `SerializationNeededForRead`) and each row version it returns is then tested against a
//! registered MVCC snapshot taken with `GetLatestSnapshot`, which makes the answer exactly what a scan
//! under that snapshot would have returned.
//!
//! Who uses it: the lookups of a key whose lock the caller holds (see `probe`), and the backend's caches
//! of the storage's own catalog (sealed partitions, grants), read inside the caller's transaction. A
//! lookup whose answer the caller only reads takes a lock on the one row version it read
//! ([`lock_row`]), as a plan's heap fetch would.
use pgrx::pg_sys;

extern "C" {
    // `storage/predicate.h`, which pgrx's bindings leave out; the same signature in 15 to 18.
    fn PredicateLockTID(
        relation: pg_sys::Relation,
        tid: pg_sys::ItemPointer,
        snapshot: pg_sys::Snapshot,
        tuple_xid: pg_sys::TransactionId,
    );
}

/// The latest snapshot (registered while this lives) and a non-MVCC snapshot to scan under.
pub struct Latest {
    mvcc: pg_sys::Snapshot,
    /// Sees every row version that is not dead to every transaction (`SNAPSHOT_NON_VACUUMABLE`), so a
    /// version the MVCC snapshot sees is always among those returned; boxed, for the scans that point at it.
    scan: Box<pg_sys::SnapshotData>,
}

impl Latest {
    /// Takes the latest snapshot.
    ///
    /// # Safety
    /// Inside a transaction.
    pub unsafe fn take() -> Latest {
        let mvcc = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = Box::new(pg_sys::SnapshotData {
            snapshot_type: pg_sys::SnapshotType::SNAPSHOT_NON_VACUUMABLE,
            ..Default::default()
        });
        Latest { mvcc, scan }
    }

    /// The MVCC snapshot whose answers the scans give.
    pub fn mvcc(&self) -> pg_sys::Snapshot {
        self.mvcc
    }

    /// The snapshot to begin scans of `rel` under (valid as long as this value). The tables of the storage
    /// are all plain tables, whose dead row versions PostgreSQL tells by one horizon.
    ///
    /// # Safety
    /// `rel` is an open table of the storage.
    pub unsafe fn scan_snapshot(&mut self, rel: pg_sys::Relation) -> pg_sys::Snapshot {
        if self.scan.vistest.is_null() {
            self.scan.vistest = pg_sys::GlobalVisTestFor(rel);
        }
        &mut *self.scan
    }

    /// Whether the MVCC snapshot sees the heap tuple in `slot`.
    ///
    /// # Safety
    /// `slot` is a buffer heap tuple slot holding a pinned tuple.
    pub unsafe fn sees(&self, slot: *mut pg_sys::TupleTableSlot) -> bool {
        let slot = slot as *mut pg_sys::BufferHeapTupleTableSlot;
        self.sees_tuple((*slot).base.tuple, (*slot).buffer)
    }

    /// # Safety
    /// `tuple` lies in `buffer`, which this backend has pinned.
    unsafe fn sees_tuple(&self, tuple: pg_sys::HeapTuple, buffer: pg_sys::Buffer) -> bool {
        // Visibility reads (and may set) the tuple's hint bits: under the buffer's share lock, as a scan does.
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
        let visible = pg_sys::HeapTupleSatisfiesVisibility(tuple, self.mvcc, buffer);
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_UNLOCK as i32);
        visible
    }
}

impl Drop for Latest {
    fn drop(&mut self) {
        // On an ERROR the transaction's abort releases the registration itself.
        if std::thread::panicking() {
            return;
        }
        // SAFETY: unregisters the snapshot `take` registered, once.
        unsafe { pg_sys::UnregisterSnapshot(self.mvcc) };
    }
}

/// A predicate lock on the row version at `tid` of `heap`, which `latest` saw, written by `xmin`: what
/// a SERIALIZABLE plan's heap fetch of it takes (nothing outside SERIALIZABLE, or for a version this
/// transaction wrote).
///
/// # Safety
/// Inside a transaction; `heap` is open.
pub unsafe fn lock_row(heap: pg_sys::Relation, tid: pg_sys::ItemPointerData, latest: &Latest, xmin: pg_sys::TransactionId) {
    let mut tid = tid;
    PredicateLockTID(heap, &mut tid, latest.mvcc, xmin);
}

/// Calls `row` with the values of `columns` (None for NULL) of every row of table `relid` that the latest
/// snapshot sees, scanning the whole table without predicate locks. Values of types passed by reference
/// point into the buffer: copy them out inside `row`. The table is locked AccessShareLock to the end of
/// the transaction, as a query leaves it.
///
/// # Safety
/// Inside a transaction; `relid` is a plain heap table with every column of `columns`.
pub unsafe fn each_row(relid: pg_sys::Oid, columns: &[&std::ffi::CStr], mut row: impl FnMut(&[Option<pg_sys::Datum>])) {
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
    let desc = (*rel).rd_att;
    let numbers: Vec<usize> = columns
        .iter()
        .map(|name| {
            let n = pg_sys::SPI_fnumber(desc, name.as_ptr());
            assert!(n > 0, "{} has no column {name:?}", super::layout::name_of(rel));
            n as usize - 1
        })
        .collect();
    let natts = (*desc).natts as usize;
    let mut latest = Latest::take();
    let flags = pg_sys::ScanOptions::SO_TYPE_SEQSCAN | pg_sys::ScanOptions::SO_ALLOW_STRAT;
    let scan = pg_sys::heap_beginscan(rel, latest.scan_snapshot(rel), 0, std::ptr::null_mut(), std::ptr::null_mut(), flags);
    let (mut values, mut nulls) = (vec![pg_sys::Datum::from(0usize); natts], vec![true; natts]);
    let mut picked = Vec::with_capacity(numbers.len());
    loop {
        let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
        if tuple.is_null() {
            break;
        }
        // Outside page mode the scan keeps the tuple's buffer pinned until the next tuple.
        if !latest.sees_tuple(tuple, (*(scan as pg_sys::HeapScanDesc)).rs_cbuf) {
            continue;
        }
        pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        picked.clear();
        picked.extend(numbers.iter().map(|&i| (!nulls[i]).then_some(values[i])));
        row(&picked);
    }
    pg_sys::heap_endscan(scan);
    drop(latest);
    pg_sys::table_close(rel, pg_sys::NoLock as i32);
}
