//! What the storage needs to know about the current transaction, as safe functions.
use pgrx::pg_sys;

/// When the current transaction started: `now()` in SQL, the `created_at` of the rows it inserts.
pub fn start_time() -> pg_sys::TimestampTz {
    // SAFETY: reads a timestamp PostgreSQL set at transaction start; no side effects, no ERROR (unguarded).
    unsafe { super::unguarded::GetCurrentTransactionStartTimestamp() }
}

/// The clock now (`clock_timestamp()`), which lease ends are compared with.
pub fn clock() -> pg_sys::TimestampTz {
    // SAFETY: reads the system clock; no side effects, no ERROR (unguarded).
    unsafe { super::unguarded::GetCurrentTimestamp() }
}

/// Whether the current transaction (or one of its live subtransactions) wrote a row version with
/// this `xmin`.
pub fn wrote(xmin: pg_sys::TransactionId) -> bool {
    // SAFETY: a lookup in the backend's own transaction state; no side effects, no ERROR (unguarded).
    unsafe { super::unguarded::TransactionIdIsCurrentTransactionId(xmin) }
}

/// The current subtransaction's id (the top transaction's when there is none).
pub fn subtransaction() -> pg_sys::SubTransactionId {
    // SAFETY: reads the backend's transaction state; no side effects, no ERROR (unguarded).
    unsafe { super::unguarded::GetCurrentSubTransactionId() }
}

/// The current (sub)transaction's xid, assigned now if it has none yet, as its first write would.
pub fn xid() -> pg_sys::TransactionId {
    // SAFETY: reads the backend's transaction state; no side effects, no ERROR (unguarded).
    let xid = unsafe { super::unguarded::GetCurrentTransactionIdIfAny() };
    if xid != pg_sys::InvalidTransactionId {
        return xid;
    }
    // SAFETY: inside a transaction; assigns its xid (and its parents') as a write does, and may raise an
    // ERROR (in recovery, near wraparound), guarded.
    unsafe { pg_sys::GetCurrentTransactionId() }
}

/// Under REPEATABLE READ and SERIALIZABLE, whether a row version written by `xmin` was written by
/// a transaction this transaction's snapshot cannot see: a concurrent one, which got there first.
/// Always false under READ COMMITTED, where each statement sees what was committed before it.
pub fn snapshot_misses(xmin: pg_sys::TransactionId) -> bool {
    // SAFETY: reads the isolation level, a backend global set at transaction start.
    if unsafe { pg_sys::XactIsoLevel } < pg_sys::XACT_REPEATABLE_READ as i32 || wrote(xmin) {
        return false;
    }
    // SAFETY: the transaction snapshot is valid during a transaction (the call is made from a SQL
    // function), and XidInMVCCSnapshot only reads it.
    unsafe { pg_sys::XidInMVCCSnapshot(xmin, pg_sys::GetTransactionSnapshot()) }
}

/// Whether the current transaction is SERIALIZABLE (and so takes predicate locks).
pub fn serializable() -> bool {
    // SAFETY: reads the isolation level, a backend global set at transaction start.
    unsafe { pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as i32 }
}

/// Runs `f` in a subtransaction of its own: its effects are kept when it returns, and undone when it
/// raises an ERROR, which is then returned as its message instead of aborting the transaction (what a
/// PL/pgSQL exception block does).
pub fn in_subtransaction<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    // SAFETY: begins a subtransaction inside the current transaction and returns to the caller's memory
    // context and resource owner, as PL/pgSQL does before the block's statements.
    let (context, owner) = unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        (context, owner)
    };
    let back = move || {
        // SAFETY: the caller's memory context and resource owner outlive the subtransaction.
        unsafe {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::CurrentResourceOwner = owner;
        }
    };
    pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        let value = f();
        // SAFETY: commits the subtransaction begun above, which is the current one.
        unsafe { pg_sys::ReleaseCurrentSubTransaction() };
        back();
        Ok(value)
    }))
    .catch_others(|e| {
        use pgrx::pg_sys::panic::CaughtError;
        let report = match &e {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r,
            CaughtError::RustPanic { ereport, .. } => ereport,
        };
        let message = report.message().to_owned();
        let canceled = report.sql_error_code() == pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED;
        back();
        // SAFETY: the error was caught (its state flushed by pgrx); rolling back the subtransaction
        // begun above releases its locks, buffers and memory, as after a PL/pgSQL exception.
        unsafe { pg_sys::RollbackAndReleaseCurrentSubTransaction() };
        back();
        // A cancel (pg_cancel_backend, statement_timeout) stops the caller too.
        if canceled {
            e.rethrow()
        }
        Err(message)
    })
    .execute()
}
