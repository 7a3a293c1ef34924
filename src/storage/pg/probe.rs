//! Finds keys' records by probing each partition's lookup index on `(key, scope)` directly.
//!
//! A key can be in any partition, so every lookup searches them all. Through SPI that is an
//! executor plan with one index scan per partition, and starting that executor cost most of
//! `idem_once`'s CPU (measured with perf: `ExecutorStart` plus the CTE's subplans, 60-70%).
//! Here the same access method calls (`index_beginscan`, `index_getnext_slot`) run without the
//! executor, answering what the latest snapshot sees and taking the same `AccessShareLock`s the plan
//! would, so visibility and HOT chains behave exactly as they did.
//!
//! SERIALIZABLE's predicate locks: a lookup of a key whose lock the caller holds ([`Prober::find_settled`])
//! takes none on the index (see `latest`): nobody else writes the key meanwhile, a key it finds missing is
//! one it writes, and a record written after its snapshot raises 40001 (`record::check_visible`), as an
//! `INSERT ... ON CONFLICT` finding an invisible conflict does. A record it finds gets a predicate lock on
//! its row version alone, which a later writer of that version meets. A lookup without the key's lock
//! ([`Prober::find`]) reads as a plan would, predicate locks included.
use super::catalog;
use super::keylock::{self, KeyLock};
use super::latest::{self, Latest};
use super::leaves::{collect_leaves, FUTURE_MARGIN_US};
use super::partition::{self, fetch, KeyArg, Partition};
use super::sealed::{self, Chunks, Filter};
pub use super::layout::Col;
pub use super::tuple::Tuple;
use super::unguarded;
use super::unlocked;
use super::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::rc::Rc;

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
    latest: Latest,
    parts: Vec<Part>,
    /// `idempotency.filter_chunks`, opened at the first read of a filter that has no copy.
    chunks: Chunks,
    /// A dirty snapshot (it sees uncommitted rows), when another transaction may have unfinished writes
    /// of keys it no longer locks (see `unlocked`); boxed, for the scans that point at it.
    dirty: Option<Box<pg_sys::SnapshotData>>,
}

impl Prober {
    pub fn open(scope: &str) -> Prober {
        // What the backend knows of the sealed partitions must be no older than the writes of the keys looked
        // up that committed before the caller took their locks: a row moved past a partition sealed since
        // lies beyond the clock, where only the newest seal's end (`sealed_to`) takes the search. A seal's
        // invalidation is processed when the backend takes a lock it did not hold, which a lookup may not do
        // (a key's lock is an advisory one, the record table is locked since an earlier call of the
        // transaction): so the record table is locked and the queue read here, before `sealed()`.
        let records = catalog::records_oid();
        // SAFETY: inside a transaction; locks the record table, which `collect_leaves` below needs locked (the
        // lock stays until the transaction ends), then processes pending invalidations as a lock taken would;
        // the section calls only `unguarded`'s functions.
        unsafe {
            unguarded::section(|| {
                unguarded::LockRelationOid(records, pg_sys::AccessShareLock as i32);
                unguarded::AcceptInvalidationMessages();
            })
        }
        let known = sealed::sealed();
        // SAFETY: called inside a transaction (from a SQL function): the snapshot is registered here and
        // unregistered when `latest` drops (or released by the abort); the record table is opened and locked by
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
            collect_leaves(horizon, &mut leaves);
            // Newest first: a duplicate is most likely a recent key.
            leaves.reverse();
            let parts: Vec<Part> = leaves
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
            Prober {
                scope: scope.into_datum().expect("text datum"),
                scope_text: scope.to_string(),
                latest: Latest::take(),
                parts,
                chunks: Chunks::new(known.chunks_rel),
                dirty,
            }
        }
    }

    /// Finds `key`'s record and hands it to `read` while it is pinned; None when no partition
    /// has it. What the latest snapshot sees, committed: for reads that take no key lock.
    pub fn find<T>(&mut self, key: &str, read: impl FnOnce(&Tuple) -> T) -> Option<T> {
        let i = self.locate(&mut KeyArg::new(key), false, None)?;
        let part = self.parts[i].open.as_ref().expect("located in an open partition");
        Some(Self::read_found(part, read))
    }

    /// As [`Prober::find`], for a caller that holds the key's lock and may write the key: the record
    /// only when no other transaction has an unfinished write of the key, which a transaction that
    /// gave the key's lock back may have (see `unlocked`): then `Busy` with that transaction (None when
    /// the write has just committed, and a new prober will see it), and the caller gives its lock back,
    /// waits for that transaction and looks again. The index reads take no predicate locks; a record found
    /// gets one on its row version (see the module comment).
    pub fn find_settled<T>(&mut self, key: &str, lock: &KeyLock, read: impl FnOnce(&Tuple) -> T) -> Probe<T> {
        // (One text datum of the key for both searches.)
        let mut key_arg = KeyArg::new(key);
        match self.locate(&mut key_arg, true, Some(lock.hash())) {
            Some(i) => {
                let part = self.parts[i].open.as_ref().expect("located in an open partition");
                if let Some(dirty) = self.dirty.as_deref_mut() {
                    // SAFETY: the slot holds the pinned tuple `locate` found.
                    if let Err(writer) = unsafe { unlocked::settled(part.slot, dirty) } {
                        // SAFETY: the slot is this partition's, holding a tuple.
                        unsafe { pg_sys::ExecClearTuple(part.slot) };
                        return Probe::Busy(writer);
                    }
                }
                // SAFETY: the slot holds the pinned tuple `locate` found, a version the latest snapshot sees.
                unsafe {
                    let tuple = Tuple { slot: part.slot, columns: &part.columns, relid: (*part.heap).rd_id };
                    latest::lock_row(part.heap, tuple.tid(), &self.latest, tuple.xmin());
                }
                Probe::Found(Self::read_found(part, read))
            }
            None if self.dirty.is_some() => match self.unfinished_insert(&mut key_arg) {
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

    /// Asks the CPU to start loading the filter blocks that a lookup of the key of lock hash `hash` will
    /// test (one per sealed partition, each a likely cache miss at a week of keys), so that their loads
    /// overlap each other and whatever runs meanwhile: a batch asks for a later key's while it looks up
    /// the current one. Reads and changes nothing.
    pub fn prefetch(&self, hash: u64) {
        for filter in self.parts.iter().filter_map(|p| p.filter.as_deref()) {
            filter.prefetch(hash);
        }
    }

    /// The partition whose slot now holds `key`'s record under the latest snapshot, if any; found by
    /// scans that take no predicate locks when `quiet`.
    fn locate(&mut self, key_arg: &mut KeyArg, quiet: bool, hash: Option<u64>) -> Option<usize> {
        let key = key_arg.key();
        let scope = self.scope;
        debug_assert!(hash.is_none_or(|h| h == keylock::hash_key(&self.scope_text, key)), "the key's own hash");
        // A hash given (the key lock's) starts every filter's block loading at once; otherwise the key is
        // hashed at the first filtered partition, so a key found before it costs no hash.
        let mut hash = hash;
        if let Some(h) = hash {
            self.prefetch(h);
        }
        for i in 0..self.parts.len() {
            if let Some(filter) = self.parts[i].filter.clone() {
                let h = match hash {
                    Some(h) => h,
                    None => {
                        let h = keylock::hash_key(&self.scope_text, key);
                        self.prefetch(h);
                        *hash.insert(h)
                    }
                };
                // SAFETY: inside the caller's transaction; `chunks` is closed in `drop`.
                let maybe = unsafe { filter.may_hold(&mut self.chunks, h) };
                if !maybe {
                    continue;
                }
            }
            let latest = &mut self.latest;
            let part = self.parts[i].open();
            // SAFETY: the scans and slot are this partition's, made under the prober's snapshots (which
            // live as long as the prober) and ended in `drop`.
            let found = unsafe {
                if quiet {
                    if part.quiet_scan.is_null() {
                        let snapshot = latest.scan_snapshot(part.heap);
                        part.quiet_scan = super::compat::index_beginscan(part.heap, part.index, snapshot, 2, 0);
                    }
                    // A non-MVCC scan returns every version that is not dead: the one the snapshot sees, if any.
                    let mut found = fetch(part, part.quiet_scan, scope, key_arg);
                    while found && !latest.sees(part.slot) {
                        found = pg_sys::index_getnext_slot(
                            part.quiet_scan,
                            pg_sys::ScanDirection::ForwardScanDirection,
                            part.slot,
                        );
                    }
                    found
                } else {
                    if part.mvcc_scan.is_null() {
                        part.mvcc_scan = super::compat::index_beginscan(part.heap, part.index, latest.mvcc(), 2, 0);
                    }
                    fetch(part, part.mvcc_scan, scope, key_arg)
                }
            };
            if found {
                return Some(i);
            }
        }
        None
    }

    /// Another transaction's uncommitted insert of the key, or an insert committed after the snapshot,
    /// in a partition that takes inserts (a sealed one takes none). Some(its transaction, or None
    /// when committed); None when there is none.
    fn unfinished_insert(&mut self, key_arg: &mut KeyArg) -> Option<Option<pg_sys::TransactionId>> {
        let dirty: *mut pg_sys::SnapshotData = self.dirty.as_deref_mut().expect("a dirty snapshot");
        let scope = self.scope;
        for i in 0..self.parts.len() {
            if self.parts[i].sealed {
                continue;
            }
            let part = self.parts[i].open();
            // SAFETY: the dirty scan is made once per partition under the prober's own dirty snapshot
            // (which lives in a Box as long as the prober) and ended in `drop`; the slot is reused,
            // cleared after each tuple.
            unsafe {
                if part.dirty_scan.is_null() {
                    part.dirty_scan = super::compat::index_beginscan(part.heap, part.index, dirty, 2, 0);
                }
                (*dirty).xmin = pg_sys::InvalidTransactionId;
                (*dirty).xmax = pg_sys::InvalidTransactionId;
                let mut found = fetch(part, part.dirty_scan, scope, key_arg);
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

impl Part {
    /// The partition, opened on first use (its scans are made when first used).
    fn open(&mut self) -> &mut Partition {
        let relid = self.relid;
        // SAFETY: opens a leaf of the record table, which the lock on the record table keeps in place.
        self.open.get_or_insert_with(|| unsafe { partition::open(relid) })
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        // On an ERROR the transaction's abort releases scans, pins and relations itself.
        if std::thread::panicking() {
            return;
        }
        // SAFETY: releases exactly what `open` acquired, once: slots, scans, relations (their locks stay
        // to the end of the transaction, as a query's would); `latest` unregisters its snapshot after.
        // The section calls only `unguarded`'s functions, on the partitions' raw pointers.
        unsafe {
            unguarded::section(|| {
                for part in self.parts.iter().filter_map(|p| p.open.as_ref()) {
                    part.close();
                }
            });
            self.chunks.close();
        }
    }
}

