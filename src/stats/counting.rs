//! Counting in a backend: a call only adds to counters of its own backend ([`count`], [`Tally`]), so
//! that counting does not show in its cost; they are published to the slot table in shared memory
//! ([`super::slots`]) once per transaction, when it ends (committed, aborted or prepared: a consumer
//! saw those answers either way). Also whether counting is on at all.
use super::backend::database;
use super::counters::{Counter, COUNTERS};
use super::region::attached;
use super::slots;
use crate::gucs;
use pgrx::{pg_sys, PgSqlErrorCode, PgTryBuilder};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// A backend's counts not published yet, per scope.
#[derive(Default)]
struct Pending {
    counts: [u64; COUNTERS],
    /// The scope's slot in shared memory, once looked up (slots never move).
    slot: Option<usize>,
}

thread_local! {
    static PENDING: RefCell<HashMap<String, Pending>> = RefCell::new(HashMap::new());
    static DIRTY: Cell<bool> = const { Cell::new(false) };
}

/// Adds `n` to a counter of `scope`, published when the transaction ends.
pub fn add(scope: &str, counter: Counter, n: u64) {
    if n != 0 {
        add_to(scope, |counts| counts[counter as usize] += n);
    }
}

fn add_to(scope: &str, f: impl FnOnce(&mut [u64; COUNTERS])) {
    if !enabled() {
        return;
    }
    PENDING.with_borrow_mut(|pending| {
        if let Some(p) = pending.get_mut(scope) {
            f(&mut p.counts);
        } else {
            let mut p = Pending::default();
            f(&mut p.counts);
            pending.insert(scope.to_owned(), p);
        }
    });
    DIRTY.set(true);
}

/// Adds 1 to a counter of `scope`.
pub fn count(scope: &str, counter: Counter) {
    add(scope, counter, 1);
}

/// The counts of one call, added to its scope's only when it is done ([`Tally::publish`]): a call
/// that raised an ERROR answered nothing, so none of what it counted on the way must show (the
/// claims of a batch whose last key raised, say).
#[derive(Default)]
pub struct Tally([u64; COUNTERS]);

impl Tally {
    pub fn count(&mut self, counter: Counter) {
        self.0[counter as usize] += 1;
    }

    pub fn add(&mut self, counter: Counter, n: u64) {
        self.0[counter as usize] += n;
    }

    pub fn publish(self, scope: &str) {
        if self.0.iter().any(|&n| n != 0) {
            add_to(scope, |counts| counts.iter_mut().zip(self.0).for_each(|(c, n)| *c += n));
        }
    }
}

thread_local! {
    /// Inside [`count_serialization_failures`]: a nested one leaves the counting to the outer one.
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a call or a write of `scope`, and counts a serialization failure (40001) it raises, the
/// extension's own or PostgreSQL's (an SSI conflict of an UPDATE or INSERT, say), then raises it on
/// unchanged. PostgreSQL raises 40001 only under REPEATABLE READ and SERIALIZABLE, so READ COMMITTED
/// (and counting switched off) runs `f` without a catch.
pub fn count_serialization_failures<T>(scope: &str, f: impl FnOnce() -> T) -> T {
    // SAFETY: reads the isolation level, a backend global set at transaction start.
    let snapshot_isolation = unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32;
    if !snapshot_isolation || !enabled() || WATCHING.get() {
        return f();
    }
    WATCHING.set(true);
    PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
        .catch_when(PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE, |e| {
            count(scope, Counter::SerializationFailures);
            e.rethrow()
        })
        .finally(|| WATCHING.set(false))
        .execute()
}

/// A wait for a key lock of `scope` that lasted `micros`.
pub fn lock_wait(scope: &str, micros: u64) {
    count(scope, Counter::LockWaits);
    add(scope, Counter::LockWaitMicros, micros);
}

/// Whether counting is on: the library was preloaded and `idempotency.stats` is on.
pub fn enabled() -> bool {
    preloaded() && gucs::stats()
}

/// Whether the statistics' shared memory exists: the library was preloaded.
pub fn preloaded() -> bool {
    attached()
}

/// Publishes the pending counts. Never raises an ERROR: it runs in the transaction-end callback.
fn publish() {
    if !DIRTY.replace(false) {
        return;
    }
    let db = database();
    PENDING.with_borrow_mut(|pending| {
        for (scope, p) in pending.iter_mut() {
            if p.counts.iter().all(|&n| n == 0) {
                continue;
            }
            let slot = *p.slot.get_or_insert_with(|| slots::slot_of(db, scope));
            slots::add_all(slot, &p.counts);
            p.counts = [0; COUNTERS];
        }
        // A backend that served very many scopes (one per tenant, say) forgets their slots.
        if pending.len() > 10_000 {
            pending.clear();
        }
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE) {
        publish();
    }
}

/// Process start: publishes the counts at each transaction's end (every backend, preloaded or not;
/// the callback returns at once when nothing was counted).
pub fn register_callback() {
    // SAFETY: registers a static function once per process; it lives as long as the process.
    unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
}
