//! Catalog facts each backend caches: the record table's oid and owner, and when to forget them.
//!
//! One relcache callback, registered once from `_PG_init` (as pg_cron registers its own), forgets
//! them whenever the record table's relcache entry is invalidated (any partition created, dropped,
//! attached or detached, the table altered or dropped), and tells the caches built on the catalog
//! (registered with [`init`]) what was invalidated.
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

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
    /// How many relcache invalidations this backend has processed (see [`read_for_cache`]).
    static EPOCH: Cell<u64> = const { Cell::new(0) };
}

/// How many times [`read_for_cache`] reads before it gives up keeping what it read.
const READS: usize = 5;

/// Reads what a cache will keep until the next invalidation, so that it is not kept stale.
///
/// A read under a snapshot taken before a concurrent commit still sees what that commit dropped or
/// changed, and the commit's invalidation can be processed while the read runs (any lock it takes
/// for the first time in the transaction processes the queue): kept after that, the result would
/// be stale and nothing would ever tell the cache. So `read` runs again while an invalidation
/// arrived during it. Returns the result and whether it may be kept: false after [`READS`] reads
/// that each saw one (the result is then as good as any concurrent read, for this call only).
pub fn read_for_cache<T>(mut read: impl FnMut() -> T) -> (T, bool) {
    for _ in 1..READS {
        let before = EPOCH.with(|e| e.get());
        let result = read();
        if EPOCH.with(|e| e.get()) == before {
            return (result, true);
        }
    }
    (read(), false)
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
    EPOCH.with(|e| e.set(e.get().wrapping_add(1)));
    let records = RECORDS_OID.with(|r| r.get());
    let what = if relid == pg_sys::InvalidOid || records == pg_sys::InvalidOid || relid == records {
        RECORDS_OID.with(|r| r.set(pg_sys::InvalidOid));
        RECORDS_OWNER.with(|r| r.set(pg_sys::InvalidOid));
        TOKEN_SEQ_OID.with(|r| r.set(pg_sys::InvalidOid));
        Invalidated::RecordTable
    } else {
        Invalidated::Relation(relid)
    };
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
