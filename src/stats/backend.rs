//! What the statistics read of the backend they run in: its database (counters and rounds are kept
//! per database) and the clock (reset times, the rounds' times).
use pgrx::pg_sys;

/// The current database's oid: statistics and rounds are kept per database.
pub fn database() -> u32 {
    // SAFETY: reads the backend's database oid, set once at connection start.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The clock now, as a timestamptz (microseconds since 2000-01-01).
pub(super) fn now() -> i64 {
    // SAFETY: reads the system clock; no side effects.
    unsafe { pg_sys::GetCurrentTimestamp() }
}
