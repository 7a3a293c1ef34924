//! Catalog facts each backend caches: the record table's oid and owner, and when to forget them.
//!
//! One relcache callback, registered once from `_PG_init` (as pg_cron registers its own), forgets
//! them whenever the record table's relcache entry is invalidated (any partition created, dropped,
//! attached or detached, the table altered or dropped), and tells the caches built on the catalog
//! (registered with [`init`]) what was invalidated.
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};

/// What a relcache invalidation covered.
#[derive(Clone, Copy)]
pub enum Invalidated {
    /// The record table itself, or every relation (a cache reset).
    RecordTable,
    /// Some other relation: maybe one of the partitions.
    Relation(pg_sys::Oid),
}

thread_local! {
    static RECORDS_OID: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static RECORDS_OWNER: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static TOKEN_SEQ_OID: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static LISTENERS: Cell<&'static [fn(Invalidated)]> = const { Cell::new(&[]) };
    /// The invalidations processed during each [`read_for_cache`] under way, innermost last (None for a
    /// read that saw more than [`SEEN_BOUND`]: all of them then count).
    static SEEN: RefCell<Vec<Option<Vec<Invalidated>>>> = const { RefCell::new(Vec::new()) };
}

/// How many times [`read_for_cache`] reads before it gives up keeping what it read.
const READS: usize = 5;

/// How many invalidations a read remembers before it counts itself stale whatever they were.
const SEEN_BOUND: usize = 64;

/// Reads what a cache will keep until the next invalidation that makes it stale, so that it is not kept
/// stale.
///
/// A read under a snapshot taken before a concurrent commit still sees what that commit dropped or
/// changed, and the commit's invalidation can be processed while the read runs (any lock it takes
/// for the first time in the transaction processes the queue): kept after that, the result would
/// be stale and nothing would ever tell the cache. So `read` runs again while an invalidation that
/// `stale` says concerns its result (the one that would make the cache's listener forget it) arrived
/// during it. Others do not count: statistics, a consumer's own tables, a vacuum's relation sizes send
/// invalidations all the time, and a read that counted them could miss every one of its chances on a
/// busy server (the clock layer's month did, with a 40001 from `partitions_changing`). Returns the
/// result and whether it may be kept: false after [`READS`] reads that each saw one (the result is then
/// as good as any concurrent read, for this call only).
pub fn read_for_cache<T>(mut read: impl FnMut() -> T, stale: impl Fn(&T, Invalidated) -> bool) -> (T, bool) {
    let mut attempt = 1;
    loop {
        let (result, seen) = {
            let frame = Frame::push();
            let result = read();
            (result, frame.pop())
        };
        let kept = seen.is_some_and(|seen| !seen.into_iter().any(|what| stale(&result, what)));
        if kept || attempt == READS {
            return (result, kept);
        }
        attempt += 1;
    }
}

/// A read's record of the invalidations processed during it; taken off [`SEEN`] when dropped (a read
/// that ends in an ERROR unwinds through it).
struct Frame {
    depth: usize,
}

impl Frame {
    fn push() -> Frame {
        SEEN.with_borrow_mut(|s| {
            s.push(Some(Vec::new()));
            Frame { depth: s.len() }
        })
    }

    /// What the read saw (None: too many to list).
    fn pop(self) -> Option<Vec<Invalidated>> {
        let seen = SEEN.with_borrow_mut(|s| s.get_mut(self.depth - 1).and_then(Option::take));
        drop(self);
        seen
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        SEEN.with_borrow_mut(|s| s.truncate(self.depth - 1));
    }
}

/// Adds `what` to every read under way.
fn record(what: Invalidated) {
    SEEN.with_borrow_mut(|s| {
        for frame in s.iter_mut() {
            if frame.as_ref().is_some_and(|seen| seen.len() >= SEEN_BOUND) {
                *frame = None;
            }
            if let Some(seen) = frame {
                seen.push(what);
            }
        }
    });
}

/// Registers the relcache callback, which also calls `listeners`. Called once per process, from
/// `_PG_init` (the postmaster's registration is inherited by the backends it forks).
pub fn init(listeners: &'static [fn(Invalidated)]) {
    LISTENERS.with(|l| l.set(listeners));
    // SAFETY: registers a function pointer with PostgreSQL's callback table of this process; the
    // function is a `#[pg_guard]`ed `extern "C-unwind"` fn that lives as long as the library.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0usize)) };
}

/// # Safety
/// Called by PostgreSQL's invalidation processing only, with a relation oid (or InvalidOid for a
/// reset of every relation).
#[pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    // Without the record table's oid at hand, any relation may be it: forget everything rather
    // than keep a partition that is gone (the oid is cached again at the next lookup).
    let records = RECORDS_OID.with(|r| r.get());
    let what = if relid == pg_sys::InvalidOid || records == pg_sys::InvalidOid || relid == records {
        RECORDS_OID.with(|r| r.set(pg_sys::InvalidOid));
        RECORDS_OWNER.with(|r| r.set(pg_sys::InvalidOid));
        TOKEN_SEQ_OID.with(|r| r.set(pg_sys::InvalidOid));
        Invalidated::RecordTable
    } else {
        Invalidated::Relation(relid)
    };
    record(what);
    for listener in LISTENERS.with(|l| l.get()) {
        listener(what);
    }
}

/// The oid of `idempotency.records`, remembered until its relcache entry is invalidated.
pub fn records_oid() -> pg_sys::Oid {
    remembered(&RECORDS_OID, c"records")
}

/// The oid of `idempotency.token_seq`, forgotten with the record table's (they come and go together
/// with the extension).
pub fn token_seq_oid() -> pg_sys::Oid {
    remembered(&TOKEN_SEQ_OID, c"token_seq")
}

/// The oid of the relation `idempotency.<name>`, from `cache` or looked up (and kept there).
fn remembered(cache: &'static std::thread::LocalKey<Cell<pg_sys::Oid>>, name: &std::ffi::CStr) -> pg_sys::Oid {
    let cached = cache.with(|r| r.get());
    if cached != pg_sys::InvalidOid {
        return cached;
    }
    // SAFETY: catalog lookups by name with C strings alive across the calls; `missing_ok = false`
    // makes a missing schema an ERROR, which pgrx turns into an unwind.
    let oid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), false);
        pg_sys::get_relname_relid(name.as_ptr(), schema)
    };
    if oid == pg_sys::InvalidOid {
        panic!("idempotency.{} does not exist", name.to_string_lossy());
    }
    cache.with(|r| r.set(oid));
    oid
}

/// The role that owns the record table: the extension's owner, as whom the storage is written.
pub fn records_owner() -> pg_sys::Oid {
    let oid = records_oid();
    let cached = RECORDS_OWNER.with(|r| r.get());
    if cached != pg_sys::InvalidOid {
        return cached;
    }
    // From the syscache: no lock on the table, so an offsets-only call never queues behind DDL.
    // SAFETY: the tuple is checked for NULL before it is read, read as the pg_class row it is,
    // and released before returning.
    let owner = unsafe {
        let tuple =
            pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(oid));
        if tuple.is_null() {
            panic!("idempotency.records does not exist");
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple)).relowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    };
    RECORDS_OWNER.with(|r| r.set(owner));
    owner
}
