//! PostgreSQL functions called without pgrx's guard of each call, for the hot paths that make many
//! calls in a row (a lookup's scans, a row's insert): [`section`] guards a whole sequence of them once.
//!
//! pgrx guards every `pg_sys` call: it saves the signal mask and the error handler's jump buffer
//! (`sigsetjmp`), checks the thread, and turns an ERROR raised inside into a Rust panic. That costs
//! about 180 instructions a call, which is 6,000 to 7,000 instructions of an `idem_once`
//! (`benches/instructions-diff --self`). One guard around a sequence gives the same protection: an
//! ERROR raised by any call of the sequence jumps back to the section's guard, which raises it as the
//! guarded call would have.
//!
//! The rules that make that sound, kept by every caller of [`section`]:
//! - the section's body calls only the functions declared here, never a guarded `pg_sys` function or
//!   pgrx code that calls one (a panic inside a guard is undefined behaviour);
//! - between the section and those calls, no frame owns a value with a destructor (an ERROR skips the
//!   frames in between, as C code's `longjmp` does), and no Rust code that can panic runs there (no
//!   indexing, arithmetic that could overflow, `expect`): a panic would leave PostgreSQL's jump buffer
//!   pointing into the section;
//! - no thread-local `RefCell` is borrowed across a section: a call inside one may process invalidations,
//!   whose callbacks (`catalog`'s, `#[pg_guard]`ed) borrow them.
//!
//! Seven of them raise no ERROR in any major (15 to 18): each only reads or sets backend variables.
//! They alone are called outside a section, with no guard at all: `GetCurrentTransactionStartTimestamp`,
//! `GetCurrentTimestamp`, `GetUserIdAndSecContext`, `SetUserIdAndSecContext`,
//! `TransactionIdIsCurrentTransactionId`, `GetCurrentSubTransactionId` and `GetCurrentTransactionIdIfAny`.
//!
//! Each declaration here is checked at compile time against the signature pgrx's bindings give the
//! PostgreSQL major being built, so a change of a function's arguments in a later major does not
//! compile instead of calling it wrongly.
use pgrx::pg_sys;
use std::ffi::c_int;

/// Declares each function as a C symbol, and checks that its arguments and result are those of the
/// `pg_sys` function of the same name.
macro_rules! unguarded {
    ($( $(#[cfg($cfg:meta)])? $(#[link_name = $link:literal])?
        pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?; )*) => {
        mod raw {
            use super::*;
            extern "C-unwind" {
                $( $(#[cfg($cfg)])? $(#[link_name = $link])? pub fn $name($($arg: $ty),*) $(-> $ret)?; )*
            }
        }
        $(
            $(#[cfg($cfg)])?
            pub use raw::$name;
            $(#[cfg($cfg)])?
            const _: unsafe fn($($ty),*) $(-> $ret)? = pg_sys::$name;
        )*
    };
}

unguarded! {
    pub fn table_close(relation: pg_sys::Relation, lockmode: c_int);
    pub fn index_open(relation: pg_sys::Oid, lockmode: c_int) -> pg_sys::Relation;
    pub fn index_close(relation: pg_sys::Relation, lockmode: c_int);
    pub fn index_rescan(
        scan: pg_sys::IndexScanDesc,
        keys: pg_sys::ScanKey,
        nkeys: c_int,
        orderbys: pg_sys::ScanKey,
        norderbys: c_int,
    );
    pub fn index_getnext_slot(
        scan: pg_sys::IndexScanDesc,
        direction: pg_sys::ScanDirection::Type,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool;
    pub fn index_endscan(scan: pg_sys::IndexScanDesc);
    pub fn ScanKeyEntryInitialize(
        entry: pg_sys::ScanKey,
        flags: c_int,
        attribute: pg_sys::AttrNumber,
        strategy: pg_sys::StrategyNumber,
        subtype: pg_sys::Oid,
        collation: pg_sys::Oid,
        procedure: pg_sys::RegProcedure,
        argument: pg_sys::Datum,
    );
    pub fn table_slot_create(relation: pg_sys::Relation, reglist: *mut *mut pg_sys::List) -> *mut pg_sys::TupleTableSlot;
    pub fn table_slot_callbacks(relation: pg_sys::Relation) -> *const pg_sys::TupleTableSlotOps;
    pub fn CreateTupleDescCopy(tupdesc: pg_sys::TupleDesc) -> pg_sys::TupleDesc;
    pub fn FreeTupleDesc(tupdesc: pg_sys::TupleDesc);
    pub fn MakeSingleTupleTableSlot(
        tupdesc: pg_sys::TupleDesc,
        tts_ops: *const pg_sys::TupleTableSlotOps,
    ) -> *mut pg_sys::TupleTableSlot;
    pub fn ExecStoreVirtualTuple(slot: *mut pg_sys::TupleTableSlot) -> *mut pg_sys::TupleTableSlot;
    pub fn ExecDropSingleTupleTableSlot(slot: *mut pg_sys::TupleTableSlot);
    pub fn CreateExecutorState() -> *mut pg_sys::EState;
    pub fn FreeExecutorState(estate: *mut pg_sys::EState);
    pub fn InitResultRelInfo(
        result: *mut pg_sys::ResultRelInfo,
        relation: pg_sys::Relation,
        index: pg_sys::Index,
        root: *mut pg_sys::ResultRelInfo,
        instrument: c_int,
    );
    pub fn ExecCloseIndices(result: *mut pg_sys::ResultRelInfo);
    pub fn simple_table_tuple_insert(relation: pg_sys::Relation, slot: *mut pg_sys::TupleTableSlot);
    pub fn MemoryContextReset(context: pg_sys::MemoryContext);
    pub fn CommandCounterIncrement();
    pub fn palloc0(size: pg_sys::Size) -> *mut std::ffi::c_void;
    pub fn cstring_to_text_with_len(s: *const std::ffi::c_char, len: c_int) -> *mut pg_sys::text;
    pub fn GetCurrentCommandId(used: bool) -> pg_sys::CommandId;
    pub fn GetCurrentTransactionStartTimestamp() -> pg_sys::TimestampTz;
    pub fn GetCurrentTimestamp() -> pg_sys::TimestampTz;
    pub fn GetUserIdAndSecContext(userid: *mut pg_sys::Oid, sec_context: *mut c_int);
    pub fn SetUserIdAndSecContext(userid: pg_sys::Oid, sec_context: c_int);
    pub fn TransactionIdIsCurrentTransactionId(xid: pg_sys::TransactionId) -> bool;
    pub fn GetCurrentSubTransactionId() -> pg_sys::SubTransactionId;
    pub fn GetCurrentTransactionIdIfAny() -> pg_sys::TransactionId;
    pub fn LockRelationOid(relation: pg_sys::Oid, lockmode: c_int);
    pub fn AcceptInvalidationMessages();
    #[cfg(feature = "pg15")]
    pub fn ExecInsertIndexTuples(
        result: *mut pg_sys::ResultRelInfo,
        slot: *mut pg_sys::TupleTableSlot,
        estate: *mut pg_sys::EState,
        update: bool,
        no_dup_err: bool,
        spec_conflict: *mut bool,
        arbiter_indexes: *mut pg_sys::List,
    ) -> *mut pg_sys::List;
    #[cfg(not(feature = "pg15"))]
    pub fn ExecInsertIndexTuples(
        result: *mut pg_sys::ResultRelInfo,
        slot: *mut pg_sys::TupleTableSlot,
        estate: *mut pg_sys::EState,
        update: bool,
        no_dup_err: bool,
        spec_conflict: *mut bool,
        arbiter_indexes: *mut pg_sys::List,
        only_summarizing: bool,
    ) -> *mut pg_sys::List;
}

/// `s` as a `text` datum, palloc'd in the current memory context; for a section (pgrx's conversion of a `&str`
/// makes the same value under a guard of its own). Its callers pass keys, scopes, statuses and fingerprints,
/// bounded by `idempotency.max_key_bytes` or by the code: far below a varlena's 1 GB bound (and `c_int`'s).
///
/// # Safety
/// Inside a [`section`].
#[inline(always)]
pub unsafe fn text_datum(s: &str) -> pg_sys::Datum {
    // SAFETY: the caller's contract; the pointer and length describe `s`, which the call copies.
    unsafe { pg_sys::Datum::from(cstring_to_text_with_len(s.as_ptr().cast(), s.len() as c_int)) }
}

/// Runs `body`, a sequence of calls of the functions above, under one guard: an ERROR raised by any of
/// them is raised here, as a guarded `pg_sys` call raises it.
///
/// # Safety
/// `body` keeps the rules of the module's comment: it calls no guarded function, panics nowhere, and
/// owns no value with a destructor while it calls into PostgreSQL; it is called from the backend's
/// thread, inside the caller's transaction.
#[inline(always)]
pub unsafe fn section<T>(body: impl FnOnce() -> T) -> T {
    // SAFETY: the caller's contract is what the guard asks of its closure.
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(body) }
}
