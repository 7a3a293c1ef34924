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
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// Shards of the table, each with its own LWLock, so that backends rarely wait for each other.
const SHARDS: usize = 64;
const TRANCHE: &std::ffi::CStr = c"idempotency held keys";
const REGION_NAME: &std::ffi::CStr = c"idempotency held keys";

/// One held key; free while `xid` is 0 (InvalidTransactionId).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Slot {
    hash: u64,
    db: u32,
    xid: u32,
}

/// The table in shared memory: `SHARDS` counts, then `SHARDS` runs of `cap` slots (an open-addressed
/// table per shard, linear probing), each holding at most `limit` keys (three quarters of `cap`).
#[repr(C)]
struct Header {
    cap: u32,
    limit: u32,
    counts: [u32; SHARDS],
}

static mut REGION: *mut Header = std::ptr::null_mut();
static mut LOCKS: *mut pg_sys::LWLockPadded = std::ptr::null_mut();
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

thread_local! {
    /// The keys this transaction holds here: the subtransaction that took each, and the xid its entry names.
    static MINE: RefCell<HashMap<u64, (pg_sys::SubTransactionId, pg_sys::TransactionId)>> =
        RefCell::new(HashMap::new());
}

/// The keys a shard holds at most, for `keys` in all (`idempotency.held_keys`).
fn shard_limit(keys: usize) -> usize {
    keys.div_ceil(SHARDS)
}

/// Slots per shard: a quarter more than it holds, so that searches stay short.
fn shard_capacity(keys: usize) -> usize {
    (shard_limit(keys) * 4).div_ceil(3) + 1
}

fn region_size(keys: usize) -> usize {
    std::mem::size_of::<Header>() + SHARDS * shard_capacity(keys) * std::mem::size_of::<Slot>()
}

/// `_PG_init`: the table's memory and locks when preloading (and `idempotency.held_keys` is not 0), and
/// the callbacks that drop a transaction's entries.
pub fn init() {
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries; chains our hooks in
    // front of the previous ones, once, in the postmaster; registers static functions once per process.
    unsafe {
        if pg_sys::process_shared_preload_libraries_in_progress && crate::gucs::held_keys() > 0 {
            PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(request_memory);
            PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
            pg_sys::shmem_startup_hook = Some(set_up_memory);
        }
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_memory() {
    if let Some(prev) = PREV_REQUEST_HOOK {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(region_size(crate::gucs::held_keys()));
    pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), SHARDS as i32);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn set_up_memory() {
    if let Some(prev) = PREV_STARTUP_HOOK {
        prev();
    }
    let keys = crate::gucs::held_keys();
    let size = region_size(keys);
    let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
    pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let region = pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found) as *mut Header;
    if !found {
        // All zeroes: no key held.
        std::ptr::write_bytes(region as *mut u8, 0, size);
        (*region).cap = shard_capacity(keys) as u32;
        (*region).limit = shard_limit(keys) as u32;
    }
    LOCKS = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
    REGION = region;
    pg_sys::LWLockRelease(init_lock);
}

/// One shard, locked while this lives.
struct Shard {
    index: usize,
    table: Slots<'static>,
}

impl Shard {
    /// The shard of `hash`, locked; None without the table.
    fn lock(hash: u64, db: u32, mode: pg_sys::LWLockMode::Type) -> Option<Shard> {
        // SAFETY: REGION and LOCKS are set once at startup (inherited by every backend) and never freed;
        // the shard's LWLock guards its slots and count, which only this value uses while it lives.
        unsafe {
            let region = REGION;
            if region.is_null() {
                return None;
            }
            let index = (mix(hash, db) % SHARDS as u64) as usize;
            pg_sys::LWLockAcquire(&raw mut (*LOCKS.add(index)).lock, mode);
            let cap = (*region).cap as usize;
            let first = (region.add(1) as *mut Slot).add(index * cap);
            let table = Slots {
                slots: std::slice::from_raw_parts_mut(first, cap),
                count: &mut (*region).counts[index],
                limit: (*region).limit,
            };
            Some(Shard { index, table })
        }
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        // SAFETY: releases the lock `Shard::lock` took.
        unsafe { pg_sys::LWLockRelease(&raw mut (*LOCKS.add(self.index)).lock) };
    }
}

/// A shard's open-addressed table (linear probing; a free slot ends every search).
struct Slots<'a> {
    slots: &'a mut [Slot],
    count: &'a mut u32,
    limit: u32,
}

impl Slots<'_> {
    fn home(&self, hash: u64, db: u32) -> usize {
        ((mix(hash, db) / SHARDS as u64) % self.slots.len() as u64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot of `(hash, db)`, or the free slot where the search for it ended.
    fn find(&self, hash: u64, db: u32) -> Result<usize, usize> {
        let mut i = self.home(hash, db);
        loop {
            let slot = self.slots[i];
            if slot.xid == 0 {
                return Err(i);
            }
            if slot.hash == hash && slot.db == db {
                return Ok(i);
            }
            i = self.next(i);
        }
    }

    /// Puts a new key into free slot `at` (where [`Slots::find`] ended); false when the shard is full.
    fn insert(&mut self, at: usize, slot: Slot) -> bool {
        if self.full() {
            return false;
        }
        self.slots[at] = slot;
        *self.count += 1;
        true
    }

    fn full(&self) -> bool {
        *self.count >= self.limit
    }

    /// Drops every entry whose transaction `running` says has ended (one pass; an entry that a removal
    /// moves into a slot already passed may stay until the next).
    fn evict(&mut self, running: impl Fn(u32) -> bool) {
        let (mut i, mut passed) = (0, 0);
        while passed < self.slots.len() {
            if self.slots[i].xid != 0 && !running(self.slots[i].xid) {
                // Slot i now holds the next entry of its run, if any: look at it again.
                self.remove(i);
            } else {
                i = self.next(i);
                passed += 1;
            }
        }
    }

    /// Frees slot `i` and moves later slots of its run back, so that every search still finds them.
    fn remove(&mut self, mut i: usize) {
        let mut j = i;
        loop {
            j = self.next(j);
            let slot = self.slots[j];
            if slot.xid == 0 {
                break;
            }
            let home = self.home(slot.hash, slot.db);
            // Whether `home` lies cyclically in (i, j]: then slot j stays where it is.
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.slots[i] = slot;
                i = j;
            }
        }
        self.slots[i] = Slot::default();
        *self.count -= 1;
    }
}

/// Spreads the key hash and the database over shards and slots.
fn mix(hash: u64, db: u32) -> u64 {
    (hash ^ (db as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd) >> 7
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
    // SAFETY: inside a transaction that writes (it holds a key's lock to write it): assigns its xid (and
    // its parents') if it has none yet, as its first write would.
    let xid = unsafe { pg_sys::GetCurrentTransactionId() };
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
    // SAFETY: reads the current subtransaction's id from the backend's transaction state.
    let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
    MINE.with_borrow_mut(|keys| keys.insert(hash, (sub, xid)));
    true
}

fn drop_entry(hash: u64, db: u32, xid: pg_sys::TransactionId) {
    if let Some(mut shard) = Shard::lock(hash, db, pg_sys::LWLockMode::LW_EXCLUSIVE) {
        if let Ok(i) = shard.table.find(hash, db) {
            if shard.table.slots[i].xid == xid.into_inner() {
                shard.table.remove(i);
            }
        }
    }
}

/// Another running transaction that holds the key of lock hash `hash`. Called with the key's lock held,
/// before the snapshot of the lookup: an entry gone by then belongs to a transaction whose end the snapshot
/// sees.
pub fn holder(hash: u64) -> Option<pg_sys::TransactionId> {
    let db = database();
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
        keys.retain(|&hash, &mut (sub, xid)| {
            if keep(sub) {
                return true;
            }
            drop_entry(hash, db, xid);
            false
        });
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
            for (made_in, _) in keys.values_mut().filter(|(made_in, _)| *made_in == sub) {
                *made_in = parent;
            }
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{Slot, Slots};

    /// Random inserts and removes against a map: every key present is found, every key removed is not,
    /// whatever runs and wrap-arounds the removals shift back, and the limit holds.
    #[test]
    fn the_table_finds_what_it_holds_after_any_removals() {
        let mut slots = vec![Slot::default(); 13];
        let mut count = 0;
        let mut table = Slots { slots: &mut slots, count: &mut count, limit: 9 };
        let mut held = std::collections::HashMap::new();
        let mut evictions = 0;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Few distinct keys, so that runs collide, wrap around the end and shift back often.
            let (hash, db) = (seed % 24, (seed >> 40) as u32 % 2);
            match table.find(hash, db) {
                Ok(i) => {
                    assert_eq!(held.remove(&(hash, db)), Some(table.slots[i].xid), "step {step}");
                    table.remove(i);
                }
                Err(free) => {
                    let fits = held.len() < 9;
                    assert_eq!(table.insert(free, Slot { hash, db, xid: step + 1 }), fits, "step {step}");
                    if fits {
                        held.insert((hash, db), step + 1);
                    }
                }
            }
            assert_eq!(*table.count as usize, held.len());
            for (&(h, d), &xid) in &held {
                let i = table.find(h, d).expect("a held key is found");
                assert_eq!(table.slots[i].xid, xid);
            }
            // Now and then, the transactions of odd xids end and a full table drops their entries.
            if step % 97 == 0 && table.full() {
                table.evict(|xid| xid % 2 == 0);
                evictions += 1;
                held.retain(|_, xid| *xid % 2 == 0);
                assert_eq!(*table.count as usize, held.len(), "step {step}");
                assert!(table.slots.iter().all(|s| s.xid % 2 == 0), "step {step}: an ended entry stayed");
            }
        }
        assert!(evictions > 10, "the table was full {evictions} times when checked");
    }
}
