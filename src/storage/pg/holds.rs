//! Keys held past the key-lock budget without lock-table entries.
//!
//! A transaction keeps at most `keylock::budget` key locks, because each one is an entry of PostgreSQL's
//! shared lock table, which has room for about `max_locks_per_transaction` of them per connection. Past the
//! budget, a call records each key it wrote or claimed here, under the key's lock, and then gives the lock
//! back: a fixed table in shared memory, 16-byte entries (room for `idempotency.held_keys` keys), mapping the key
//! lock's hash to the transaction id that holds it (its subtransaction's, when it has one). Every call that takes a key's lock looks here
//! next ([`holder`]), before its snapshot: another running transaction's entry makes it give its lock back,
//! wait for that transaction (`XactLockTableWait`, as a lock wait), and look again. So an entry keeps other
//! writers out exactly as the lock did, and a claim recorded here may stay unwritten until its fate is known
//! (one row for a claim completed in its own transaction, see `deferred`).
//!
//! Entries go when their transaction commits or aborts (PostgreSQL runs those callbacks after the end is
//! visible to new snapshots), or with the subtransaction that made them; a prepared transaction keeps them
//! until COMMIT or ROLLBACK PREPARED. An entry whose transaction is no longer running counts for nothing (a
//! full shard drops it), so one left by a backend that died is harmless; the postmaster resets shared
//! memory after a crash anyway. When the table is full, or the library was not preloaded, a
//! call falls back to writing its rows at once and letting them keep other writers out (see `unlocked`).
use super::heldtable::{self, Shard, Slot};
use pgrx::pg_sys;
use std::cell::RefCell;

/// A key this transaction holds here.
#[derive(Clone, Copy)]
struct Mine {
    hash: u64,
    /// The subtransaction that took it.
    sub: pg_sys::SubTransactionId,
    /// The xid its entry names.
    xid: pg_sys::TransactionId,
}

thread_local! {
    /// The keys this transaction holds here, each once ([`hold`] adds a key only when the table has no entry
    /// of this transaction for it). A list, sorted in place when the entries go, so that the end of a
    /// transaction allocates nothing.
    static MINE: RefCell<Vec<Mine>> = const { RefCell::new(Vec::new()) };
}

/// `_PG_init`: the table's memory and locks when preloading (and `idempotency.held_keys` is not 0), and
/// the callbacks that drop a transaction's entries.
pub fn init() {
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries; chains our hooks in
    // front of the previous ones, once, in the postmaster; registers static functions once per process.
    unsafe {
        if pg_sys::process_shared_preload_libraries_in_progress && crate::gucs::held_keys() > 0 {
            heldtable::request();
        }
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
    }
}

fn database() -> u32 {
    // SAFETY: reads the backend's database oid, set once at connection start.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// Records that this transaction holds the key of lock hash `hash` until it ends (or the subtransaction
/// that calls rolls back), or finds that it does already. False when there is no room (the table is full,
/// or there is no table). The caller holds the key's lock. The entry names the xid of the current
/// subtransaction, so that a transaction waiting for the key wakes when that subtransaction rolls back
/// (`XactLockTableWait` follows a committed subtransaction up to its parent).
pub fn hold(hash: u64) -> bool {
    let db = database();
    // (Inside a transaction that writes: it holds a key's lock to write it.)
    let xid = super::xact::xid();
    let Some(mut shard) = Shard::lock(hash, db, pg_sys::LWLockMode::LW_EXCLUSIVE) else {
        return false;
    };
    let table = &mut shard.table;
    let found = table.find(hash, db);
    if let Ok(i) = found {
        let other = pg_sys::TransactionId::from(table.slots[i].xid);
        // SAFETY: reads the backend's transaction state.
        if unsafe { pg_sys::TransactionIdIsCurrentTransactionId(other) } {
            return true;
        }
    }
    let running = |xid: u32| {
        // SAFETY: reads the proc array (its own LWLock, never held while taking a shard's).
        unsafe { pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(xid)) }
    };
    match found {
        // Left by a transaction that has ended (its end callback is yet to run, or it was prepared and
        // has been committed since): ours now. (A running holder cannot be here: the caller looked for one
        // after taking the key's lock. Should one be, the caller writes its row at once instead.)
        Ok(i) => {
            if running(table.slots[i].xid) {
                return false;
            }
            table.slots[i].xid = xid.into_inner();
        }
        Err(mut free) => {
            if table.full() {
                // Make room by dropping entries of transactions that have ended, if any.
                table.evict(running);
                free = table.find(hash, db).expect_err("the key is not held");
            }
            if !table.insert(free, Slot { hash, db, xid: xid.into_inner() }) {
                return false;
            }
        }
    }
    drop(shard);
    let sub = super::xact::subtransaction();
    MINE.with_borrow_mut(|keys| keys.push(Mine { hash, sub, xid }));
    true
}

/// Drops the entries of `gone` (of database `db`, sorted by shard) that still name their xid, taking each
/// shard's lock once for all of its entries (a batch of 1,000 keys leaves about 15 in each of the 64 shards).
fn drop_entries(db: u32, gone: &[Mine]) {
    for run in gone.chunk_by(|a, b| heldtable::shard_of(a.hash, db) == heldtable::shard_of(b.hash, db)) {
        let Some(mut shard) = Shard::lock(run[0].hash, db, pg_sys::LWLockMode::LW_EXCLUSIVE) else {
            return;
        };
        for mine in run {
            if let Ok(i) = shard.table.find(mine.hash, db) {
                if shard.table.slots[i].xid == mine.xid.into_inner() {
                    shard.table.remove(i);
                }
            }
        }
    }
}

/// Another running transaction that holds the key of lock hash `hash`. Called with the key's lock held,
/// before the snapshot of the lookup: an entry gone by then belongs to a transaction whose end the snapshot
/// sees.
pub fn holder(hash: u64) -> Option<pg_sys::TransactionId> {
    let db = database();
    if heldtable::shard_empty(hash, db) {
        return None;
    }
    let xid = {
        let shard = Shard::lock(hash, db, pg_sys::LWLockMode::LW_SHARED)?;
        let i = shard.table.find(hash, db).ok()?;
        pg_sys::TransactionId::from(shard.table.slots[i].xid)
    };
    // SAFETY: reads the backend's transaction state and the proc array.
    let running = unsafe {
        !pg_sys::TransactionIdIsCurrentTransactionId(xid) && pg_sys::TransactionIdIsInProgress(xid)
    };
    running.then_some(xid)
}

/// Drops this transaction's entries that `keep` refuses.
fn release_all(keep: impl Fn(pg_sys::SubTransactionId) -> bool) {
    MINE.with_borrow_mut(|keys| {
        let db = database();
        // Those that go first, by shard (sort_unstable and drain work in place: nothing is allocated here).
        keys.sort_unstable_by_key(|m| (keep(m.sub), heldtable::shard_of(m.hash, db)));
        let gone = keys.iter().take_while(|m| !keep(m.sub)).count();
        drop_entries(db, &keys[..gone]);
        keys.drain(..gone);
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT => release_all(|_| false),
        // The prepared transaction keeps its keys: its entries name its xid, which stays in progress until
        // COMMIT or ROLLBACK PREPARED; then they count for nothing, and a full shard drops them.
        XACT_EVENT_PREPARE => MINE.with_borrow_mut(|keys| keys.clear()),
        _ => {}
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    sub: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    if MINE.with_borrow(|keys| keys.is_empty()) {
        return;
    }
    match event {
        // Its keys go with it, as its key locks do.
        SUBXACT_EVENT_ABORT_SUB => release_all(|made_in| made_in != sub),
        SUBXACT_EVENT_COMMIT_SUB => MINE.with_borrow_mut(|keys| {
            for mine in keys.iter_mut().filter(|m| m.sub == sub) {
                mine.sub = parent;
            }
        }),
        _ => {}
    }
}

