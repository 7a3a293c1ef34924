//! Whether some transaction of the cluster has uncommitted rows whose keys it no longer locks.
//!
//! A transaction keeps each key's lock until it ends only up to a budget (`keylock::budget`): past it (a
//! batch of 1,000 keys, a long loop of claims in one transaction) the locks would fill the shared lock
//! table, and then every session of the cluster fails with "out of shared memory". Past the budget a
//! transaction holds its keys in the extension's own table (`holds`); when that table is full (or off, or
//! the library not preloaded), it writes each key's row at once and gives the key's lock back at the end
//! of the call, and from then on its uncommitted row keeps other writers of the key out, because a locked
//! lookup waits for a transaction with an unfinished write of the key (see `probe::Prober::find_settled`).
//!
//! Looking for unfinished writes costs a second index probe when a key is not found, so lookups look only
//! while some transaction is in that mode: a counter in shared memory, raised before the transaction gives
//! its first such lock back and lowered once it has ended (PostgreSQL runs the end-of-transaction callbacks
//! after the commit or abort is visible to everyone). Without the counter (the library not preloaded)
//! lookups always look, and so they do when prepared transactions are allowed (a prepared transaction's
//! rows outlive the backend that counted it).
use pgrx::{pg_guard, pg_shmem_init, pg_sys, PgAtomic};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

// SAFETY: the name is ours alone (every shared-memory name of this extension starts with "idempotency").
static UNLOCKED_WRITERS: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"idempotency unlocked writers") };

/// The counter exists: the library was preloaded (set in the postmaster, inherited by every backend).
static COUNTED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This transaction is counted.
    static ENTERED: Cell<bool> = const { Cell::new(false) };
}

// PostgreSQL's `max_prepared_transactions` (access/twophase.h, which pgrx's bindings leave out).
extern "C" {
    static max_prepared_xacts: std::ffi::c_int;
}

/// `_PG_init`: the counter in shared memory when preloading, and the callback that lowers it.
// (pgrx's macro names the features of PostgreSQL versions this crate does not build for.)
#[allow(unexpected_cfgs)]
pub fn init() {
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(UNLOCKED_WRITERS);
        COUNTED.store(true, Ordering::Relaxed);
    }
    // SAFETY: registers a static function once per process.
    unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
}

/// Counts this transaction as one that gives key locks back, before it gives back the first one.
pub fn enter() {
    if !ENTERED.get() {
        if COUNTED.load(Ordering::Relaxed) {
            UNLOCKED_WRITERS.get().fetch_add(1, Ordering::SeqCst);
        }
        ENTERED.set(true);
    }
}

/// Whether another transaction may have an uncommitted row of a key whose lock it gave back. Read after
/// taking the key's lock: a transaction that gave it back was counted before it did.
pub fn others_may_have() -> bool {
    // SAFETY: reads a setting fixed at server start.
    if !COUNTED.load(Ordering::Relaxed) || unsafe { max_prepared_xacts } > 0 {
        return true;
    }
    UNLOCKED_WRITERS.get().load(Ordering::SeqCst) > ENTERED.get() as u64
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    let ended = matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE);
    if ended && ENTERED.replace(false) && COUNTED.load(Ordering::Relaxed) {
        UNLOCKED_WRITERS.get().fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether the version a snapshot found is still the key's settled record: Err(Some(xid)) when another
/// transaction is updating or deleting it, Err(None) when a transaction that committed after the
/// snapshot did.
///
/// # Safety
/// `slot` is a buffer heap tuple slot holding a pinned tuple.
pub unsafe fn settled(slot: *mut pg_sys::TupleTableSlot, dirty: &mut pg_sys::SnapshotData) -> Result<(), Option<pg_sys::TransactionId>> {
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
