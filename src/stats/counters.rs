//! The counters of `idempotency.stats`: which there are, and how many. Every counter array of the
//! statistics (a backend's pending counts, a slot in shared memory, a row of the file saved at
//! shutdown) is `[_; COUNTERS]` in this order, so this file comes first and imports nothing.

/// One counter of `idempotency.stats` (the column of the same name).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(usize)]
pub enum Counter {
    Claims,
    ClaimedNew,
    Takeovers,
    Retries,
    AnsweredCompleted,
    AnsweredInProgress,
    AnsweredFailed,
    AnsweredMismatch,
    Poisoned,
    DeadLettered,
    StaleRefused,
    SerializationFailures,
    LockWaits,
    /// Microseconds; shown as `lock_wait_ms`.
    LockWaitMicros,
    Completes,
    Fails,
    Heartbeats,
}

/// How many counters there are (the length of every counter array).
pub const COUNTERS: usize = Counter::Heartbeats as usize + 1;
