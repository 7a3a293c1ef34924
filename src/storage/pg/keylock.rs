//! The per-key lock that makes `(scope, key)` unique across partitions.
//!
//! A partitioned table cannot have a unique index on `(scope, key)` unless it includes the
//! partition column, so two partitions could each get the same key. Every writer of a key
//! therefore first takes a transaction-scoped advisory lock on a 64-bit hash of it, in a lock
//! namespace of our own (`objsubid = 18756` in `pg_locks`) so that it never meets the
//! application's own advisory locks. A hash collision only makes two keys wait for each other.
//!
//! The hash is part of the on-disk contract: two builds running side by side (during an upgrade)
//! must take the same lock for the same key, or both could claim it. So it is PostgreSQL's
//! `hash_bytes_extended`, whose output PostgreSQL keeps stable (hash partitioning stores it), over
//! `scope || 0x1f || key` with a fixed seed: the same value as the SQL expression
//! `hashtextextended(scope || E'\x1f' || key, 18756)`. Keys and scopes cannot contain 0x1f (control
//! characters are rejected), so the separator keeps ("a", "bc") and ("ab", "c") apart.
//!
//! Each lock is one entry of the shared lock table, which has room for about `max_locks_per_transaction`
//! entries per connection. So a transaction keeps the locks it takes until it ends only up to
//! [`budget`]; past it, a call records the keys it claimed or wrote in a shared table of its own (`holds`)
//! and gives their locks back ([`KeyLock::written`]). When that table is full, their rows are written at once
//! and keep other writers out instead (see `unlocked`).
use super::holds;
use super::unlocked;
use crate::stats;
use pgrx::{pg_sys, PgTryBuilder};
use std::cell::Cell;

/// `locktag_field4` of our advisory locks ("ID").
pub const LOCK_NAMESPACE: u16 = 0x4944;
/// `locktag_field4` of the lock that serializes partition creation.
const PARTITION_LOCK_NAMESPACE: u16 = 0x4945;
/// `locktag_field4` of the lock held by a maintenance round.
const MAINTENANCE_LOCK_NAMESPACE: u16 = 0x4946;

// PostgreSQL's `common/hashfn.h`, which pgrx's bindings leave out. It never raises an ERROR.
extern "C" {
    fn hash_bytes_extended(k: *const u8, keylen: i32, seed: u64) -> u64;
}

/// Seed of the key hash; fixed forever (see the module comment).
const KEY_HASH_SEED: u64 = 18756;
/// Between scope and key in the hashed bytes.
const SEPARATOR: u8 = 0x1f;

pub fn hash_key(scope: &str, key: &str) -> u64 {
    let len = scope.len() + 1 + key.len();
    // (The usual key and scope fit on the stack: no allocation for them.)
    let mut stack = [0u8; 256];
    let mut heap = Vec::new();
    let bytes = match stack.get_mut(..len) {
        Some(bytes) => bytes,
        None => {
            heap.resize(len, 0);
            &mut heap[..]
        }
    };
    let (head, tail) = bytes.split_at_mut(scope.len());
    head.copy_from_slice(scope.as_bytes());
    tail[0] = SEPARATOR;
    tail[1..].copy_from_slice(key.as_bytes());
    // SAFETY: the pointer and length describe `bytes`, which lives across the call; the function
    // only reads them.
    unsafe { hash_bytes_extended(bytes.as_ptr(), len as i32, KEY_HASH_SEED) }
}

fn tag(hash: u64, namespace: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: reads the backend's database oid, set once at connection start.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: namespace,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

thread_local! {
    /// Key locks this transaction took and has not given back. (A rolled-back subtransaction's locks
    /// go with it and stay counted here: the count only errs high, which gives locks back sooner.)
    static HELD: Cell<usize> = const { Cell::new(0) };
    /// This transaction made a partition that takes its inserts: it keeps every key lock (see
    /// [`keep_all_from_now_on`]).
    static KEEP_ALL: Cell<bool> = const { Cell::new(false) };
    /// Past its budget: each call gives back the key locks it took (see [`KeyLock::written`]).
    static GIVING_BACK: Cell<bool> = const { Cell::new(false) };
}

/// The transaction made the partition its rows go to. Other transactions do not see that partition until
/// this one commits, so an uncommitted row there cannot stand in for its key's lock: from now on the
/// transaction keeps every key lock it takes until it ends, whatever the budget (it happens once per
/// partition interval, and only when maintenance did not premake the partition).
pub fn keep_all_from_now_on() {
    KEEP_ALL.set(true);
}

/// The key locks this transaction may still take and keep: what is left of its [`budget`], at least 1.
pub fn room() -> usize {
    budget().saturating_sub(HELD.get()).max(1)
}

/// The key locks a transaction keeps until it ends: `idempotency.key_locks_per_transaction`, by
/// default half of `max_locks_per_transaction` (PostgreSQL sizes the lock table by it), so that every
/// connection can hold as many and the cluster's other locks still find room.
pub fn budget() -> usize {
    match crate::gucs::key_locks_per_transaction() {
        // SAFETY: reads a setting fixed at server start.
        n if n < 0 => (unsafe { pg_sys::max_locks_per_xact } / 2).max(1) as usize,
        // 0 means 1: a batch needs at least one key's lock at a time.
        n => (n as usize).max(1),
    }
}

/// Whether this transaction may take `n` more key locks and keep them until it ends.
pub fn may_keep(n: usize) -> bool {
    KEEP_ALL.get() || (!GIVING_BACK.get() && HELD.get() + n <= budget())
}

/// From here on, this transaction gives back the key locks of each call once the call wrote its rows.
pub fn give_back_from_now_on() {
    GIVING_BACK.set(true);
}

/// Whether this transaction gives back its key locks after each call.
pub fn giving_back() -> bool {
    GIVING_BACK.get()
}

fn acquire(hash: u64, namespace: u16, wait: bool) -> pg_sys::LockAcquireResult::Type {
    // SAFETY: the lock tag is a local that outlives the call; an advisory lock of the user lock
    // method in ExclusiveLock mode, held until the transaction ends (sessionLock false).
    unsafe { pg_sys::LockAcquire(&tag(hash, namespace), pg_sys::ExclusiveLock as i32, false, !wait) }
}

/// A key's lock, held by this transaction.
pub struct KeyLock {
    hash: u64,
    /// Taken by this call, rather than held already by an earlier call of the transaction.
    fresh: bool,
}

impl KeyLock {
    /// Gives the lock back before the transaction ends when this call took it, for a call that
    /// only read the key: a settled key's answer cannot change under us, and other transactions
    /// asking about the same key then need not wait for this one to end. A call that wrote calls
    /// [`KeyLock::written`] instead; a lock the transaction held already is kept.
    pub fn release_if_only_read(self) {
        self.give_back();
    }

    /// Gives the lock back when this call took it, before waiting for another transaction's unfinished
    /// write of the key (that transaction may be waiting for this lock).
    pub fn give_back(self) {
        if self.fresh {
            // SAFETY: releases the lock this call acquired (`fresh`), with the same tag and mode; a lock
            // the transaction held before is never released here.
            unsafe {
                pg_sys::LockRelease(&tag(self.hash, LOCK_NAMESPACE), pg_sys::ExclusiveLock as i32, false)
            };
            HELD.set(HELD.get().saturating_sub(1));
        }
    }

    /// The key's hash ([`hash_key`]).
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Another running transaction that holds the key without its lock (see `holds`): the caller gives
    /// this lock back and waits for it. Asked before the caller's snapshot.
    pub fn held_elsewhere(&self) -> Option<pg_sys::TransactionId> {
        holds::holder(self.hash)
    }

    /// This call took the lock past the transaction's [`budget`].
    fn past_budget(&self) -> bool {
        self.fresh && (GIVING_BACK.get() || HELD.get() > budget())
    }

    /// The call wrote or claimed the key (or deleted its row): the lock is kept until the transaction ends
    /// while the transaction is within its [`budget`]. Past it, the key is held in the shared table
    /// (`holds`) and its lock given back; when the table has no room, the uncommitted row stands in for
    /// the lock (see `unlocked`). A transaction that made the partition of its rows keeps its locks.
    pub fn written(self) {
        if !self.past_budget() {
            return;
        }
        GIVING_BACK.set(true);
        // A transaction that made its partition keeps its locks: a held key becomes a row at PREPARE
        // TRANSACTION, in a partition other sessions cannot see until COMMIT PREPARED.
        if KEEP_ALL.get() {
            return;
        }
        if !holds::hold(self.hash) {
            unlocked::enter();
        }
        self.give_back();
    }

    /// Whether the key's claim may stay unwritten until the transaction ends (see `deferred`): something
    /// must keep other writers out until then, a lock kept or, past the budget, the key held in the shared
    /// table (taken here, given back with the transaction or its subtransaction).
    pub fn may_defer(&self) -> bool {
        !self.past_budget() || KEEP_ALL.get() || holds::hold(self.hash)
    }
}

/// Locks `(scope, key)` until the end of the transaction. With `wait = false` returns None at
/// once when another transaction holds it; with `wait = true` waits (subject to `lock_timeout`
/// and deadlock detection).
pub fn lock_key(scope: &str, key: &str, wait: bool) -> Option<KeyLock> {
    let hash = hash_key(scope, key);
    let mut got = acquire(hash, LOCK_NAMESPACE, false);
    if got == pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL && wait {
        got = counted_wait(scope, || acquire(hash, LOCK_NAMESPACE, true));
    }
    match got {
        pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL => None,
        pg_sys::LockAcquireResult::LOCKACQUIRE_OK => {
            HELD.set(HELD.get() + 1);
            Some(KeyLock { hash, fresh: true })
        }
        _ => Some(KeyLock { hash, fresh: false }),
    }
}

/// Waits until transaction `xid`, which has an unfinished write of a key of `scope`, ends; counted as a
/// wait for the key's lock (an ERROR on the way, lock_timeout or a cancel, counted with its time so far).
pub fn wait_for_writer(scope: &str, xid: pg_sys::TransactionId) {
    counted_wait(scope, || {
        // SAFETY: waits on the transaction's lock as PostgreSQL's own unique checks do; no relation or
        // tuple is named (they only label the wait in error contexts).
        unsafe {
            pg_sys::XactLockTableWait(xid, std::ptr::null_mut(), std::ptr::null_mut(), pg_sys::XLTW_Oper::XLTW_None)
        }
    });
}

/// Runs `wait`, a wait for a key of `scope`, and counts it (idempotency.stats), also one that ends in an
/// ERROR (lock_timeout, deadlock, cancel): it is counted with its time so far, then raised on unchanged.
/// Counts are published at the transaction's end, an abort included.
fn counted_wait<T>(scope: &str, wait: impl FnOnce() -> T + std::panic::UnwindSafe) -> T {
    let started = super::xact::clock();
    let waited = || (super::xact::clock() - started).max(0) as u64;
    let got = PgTryBuilder::new(wait)
        .catch_others(|e| {
            stats::lock_wait(scope, waited());
            e.rethrow()
        })
        .execute();
    stats::lock_wait(scope, waited());
    got
}

/// `_PG_init`: the callback that forgets the count of held locks when a transaction ends.
pub fn init() {
    // SAFETY: registers a static function once per process.
    unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE) {
        HELD.set(0);
        KEEP_ALL.set(false);
        GIVING_BACK.set(false);
    }
}

/// Serializes backends that create partitions, until the end of the transaction.
pub fn lock_partition_creation() {
    acquire(0, PARTITION_LOCK_NAMESPACE, true);
}

/// Makes maintenance rounds of one database take turns (worker and manual calls alike).
/// Returns false when `wait` is false and another round is running.
pub fn lock_maintenance(wait: bool) -> bool {
    acquire(0, MAINTENANCE_LOCK_NAMESPACE, wait) != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}
