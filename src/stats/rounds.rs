//! What the maintenance rounds of each database did lately: when the last one ran and how long it
//! took, how many ran and failed, and the last error. Kept in the statistics' shared memory (so only
//! with the library preloaded), written by the round itself, worker or `idem_maintenance()` alike.
//! The state's layout and its spin lock are with the rest of the region's ([`super::region`]).
use super::backend::{database, now};
use super::names::floor_char_boundary;
use super::region::{attached, header, Round, ERROR_BYTES};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgTryBuilder;

pub use super::region::RoundState;

/// The maintenance state of database `db`, or None when all places are taken by other databases.
fn round_of(db: u32, create: bool) -> Option<&'static Round> {
    if !attached() {
        return None;
    }
    header().rounds.iter().find(|r| r.belongs_to(db, create))
}

/// Runs one maintenance round `f` of the current database and records how it went (an ERROR it
/// raises is recorded, then raised on; so is the error `failed_step` finds in its result, a step that
/// failed alone). A round `f` skips (None: another round holds the lock) is not a round: nothing of it
/// is recorded.
pub fn observe<T>(f: impl FnOnce() -> Option<T>, failed_step: impl Fn(&T) -> Option<String>) -> Option<T> {
    let Some(round) = round_of(database(), true) else {
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

/// The maintenance state of the current database; None without the library preloaded or before its
/// first round since the server started.
pub fn current() -> Option<RoundState> {
    round_of(database(), false).map(|r| r.with(|s| *s))
}
