//! What the maintenance rounds of each database did lately: when the last one ran and how long it
//! took, how many ran and failed, and the last error. Kept in the statistics' shared memory (so only
//! with the library preloaded), written by the round itself, worker or `idem_maintenance()` alike.
use super::{database, now, shared};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgTryBuilder;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

const ERROR_BYTES: usize = 256;

/// The maintenance state of one database, in shared memory.
#[repr(C)]
pub struct Round {
    /// The database's oid; 0 while the place is free.
    db: AtomicU32,
    /// A spin lock over `state` (rounds of one database never overlap, but readers may come any time).
    busy: AtomicU32,
    state: UnsafeCell<RoundState>,
}

/// A copy of a database's maintenance state.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RoundState {
    pub started_at: i64,
    /// 0 while the first round runs.
    pub finished_at: i64,
    pub duration_us: i64,
    pub rounds: u64,
    pub failed: u64,
    pub error_at: i64,
    error_len: u32,
    error: [u8; ERROR_BYTES],
}

impl RoundState {
    pub fn last_error(&self) -> Option<String> {
        (self.error_len > 0).then(|| String::from_utf8_lossy(&self.error[..self.error_len as usize]).into_owned())
    }
}

impl Round {
    /// Whether this place is `db`'s; with `create`, takes a free place for it.
    pub(super) fn belongs_to(&self, db: u32, create: bool) -> bool {
        let owner = self.db.load(Ordering::Acquire);
        owner == db || (create && owner == 0 && self.db.compare_exchange(0, db, Ordering::AcqRel, Ordering::Acquire).is_ok())
    }

    fn with<T>(&self, f: impl FnOnce(&mut RoundState) -> T) -> T {
        while self.busy.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock gives this process the only access to the state until released;
        // `f` neither raises an ERROR nor panics (it only copies plain values).
        let result = f(unsafe { &mut *self.state.get() });
        self.busy.store(0, Ordering::Release);
        result
    }
}

/// Runs one maintenance round `f` of the current database and records how it went (an ERROR it
/// raises is recorded, then raised on; so is the error `failed_step` finds in its result, a step that
/// failed alone). A round `f` skips (None: another round holds the lock) is not a round: nothing of it
/// is recorded.
pub fn observe<T>(f: impl FnOnce() -> Option<T>, failed_step: impl Fn(&T) -> Option<String>) -> Option<T> {
    let Some(round) = shared::round_of(database(), true) else {
        return f();
    };
    let started = now();
    let before = round.with(|s| std::mem::replace(&mut s.started_at, started));
    let during = std::panic::AssertUnwindSafe(round);
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
        .catch_others(move |e| {
            let message = match &e {
                CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r.message().to_owned(),
                CaughtError::RustPanic { ereport, .. } => ereport.message().to_owned(),
            };
            let during = &during; // the whole wrapper, not its field
            finish(during.0, started, Some(&message));
            e.rethrow()
        })
        .execute();
    match &result {
        Some(r) => finish(round, started, failed_step(r).as_deref()),
        None => round.with(|s| s.started_at = before),
    }
    result
}

fn finish(round: &Round, started: i64, error: Option<&str>) {
    let finished = now();
    round.with(|s| {
        s.finished_at = finished;
        s.duration_us = finished - started;
        s.rounds += 1;
        if let Some(message) = error {
            s.failed += 1;
            s.error_at = finished;
            let cut = floor_char_boundary(message, ERROR_BYTES);
            s.error[..cut].copy_from_slice(&message.as_bytes()[..cut]);
            s.error_len = cut as u32;
        }
    });
}

pub(super) fn floor_char_boundary(s: &str, max: usize) -> usize {
    (0..=max.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// The maintenance state of the current database; None without the library preloaded or before its
/// first round since the server started.
pub fn current() -> Option<RoundState> {
    shared::round_of(database(), false).map(|r| r.with(|s| *s))
}
