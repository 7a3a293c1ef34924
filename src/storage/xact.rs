//! What the storage needs to know about the current transaction, as safe functions.
use super::decide::Micros;
use pgrx::pg_sys;

/// When the current transaction started: `now()` in SQL, the `created_at` of the rows it inserts.
pub fn start_time() -> Micros {
    // SAFETY: reads a timestamp PostgreSQL set at transaction start; no side effects.
    unsafe { pg_sys::GetCurrentTransactionStartTimestamp() }
}

/// The clock now (`clock_timestamp()`), which lease ends are compared with.
pub fn clock() -> Micros {
    // SAFETY: reads the system clock; no side effects.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Whether the current transaction (or one of its live subtransactions) wrote a row version with
/// this `xmin`.
pub fn wrote(xmin: pg_sys::TransactionId) -> bool {
    // SAFETY: a lookup in the backend's own transaction state; no side effects.
    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin) }
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
