//! `idem_claim`: take a key, or answer what its record says.
use super::call::Call;
use super::decide::{self, Answer, ClaimDecision, Lease, State};
use super::deferred;
use super::lifecycle::partitions;
use super::pg::catalog;
use super::pg::document::Document;
use super::pg::keylock::KeyLock;
use super::pg::spi::{arg, Snap, Stmt};
use super::pg::xact;
use super::record::{expect_one, Key, Record};
use crate::gucs;
use crate::stats::Counter;
use pgrx::fcinfo::{direct_function_call, direct_function_call_as_datum};
use pgrx::pg_sys;
use pgrx::prelude::*;

const T_TEXT: pg_sys::Oid = pg_sys::TEXTOID;
const T_TID: pg_sys::Oid = pg_sys::TIDOID;
const T_IVL: pg_sys::Oid = pg_sys::INTERVALOID;

// The updates go straight to the row version the lookup found: its partition (`{partition}`,
// see `Conn::run_on`) and its ctid. Through the parent, every call would open and lock every
// partition again. The version is still the latest: its key's lock is held since the lookup.
static TAKE_OVER: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET status = 'pending', token = nextval('idempotency.token_seq'), attempts = attempts + 1,
                 fingerprint = coalesce(fingerprint, $4), updated_at = clock_timestamp(),
                 expires_at = clock_timestamp() + $5
           WHERE ctid = $3 AND scope = $1 AND key = $2
          RETURNING token, attempts, expires_at",
    args: &[T_TEXT, T_TEXT, T_TID, T_TEXT, T_IVL],
};
// A key whose consumer died `max_attempts` times: terminal, with the last error kept inside.
static MARK_POISON: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET status = 'failed', updated_at = clock_timestamp(), expires_at = NULL,
                 error = jsonb_build_object('error', 'max_attempts_exceeded', 'attempts', attempts,
                                            'last_error', error)
           WHERE ctid = $3 AND scope = $1 AND key = $2
          RETURNING error",
    args: &[T_TEXT, T_TEXT, T_TID],
};
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Claimed,
    Completed,
    InProgress,
    Failed,
    Mismatch,
}

impl Outcome {
    /// The counter of a claim answered without taking the key (none for `claimed`, whose counter
    /// says how the key was taken).
    fn counter(self) -> Option<Counter> {
        match self {
            Outcome::Claimed => None,
            Outcome::Completed => Some(Counter::AnsweredCompleted),
            Outcome::InProgress => Some(Counter::AnsweredInProgress),
            Outcome::Failed => Some(Counter::AnsweredFailed),
            Outcome::Mismatch => Some(Counter::AnsweredMismatch),
        }
    }

    /// The outcome `idem_once` reports as `false` for a key with this record's status.
    pub fn of_status(status: &str) -> Outcome {
        match status {
            "completed" => Outcome::Completed,
            "failed" => Outcome::Failed,
            _ => Outcome::InProgress,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Claimed => "claimed",
            Outcome::Completed => "completed",
            Outcome::InProgress => "in_progress",
            Outcome::Failed => "failed",
            Outcome::Mismatch => "mismatch",
        }
    }
}

pub struct Claim {
    pub outcome: Outcome,
    pub token: Option<i64>,
    pub attempts: Option<i32>,
    pub payload: Option<Document>,
    pub expires_at: Option<pg_sys::TimestampTz>,
}

impl Claim {
    /// The caller owns the key now.
    pub fn claimed(token: Option<i64>, attempts: Option<i32>, expires_at: Option<pg_sys::TimestampTz>) -> Claim {
        Claim { outcome: Outcome::Claimed, token, attempts, payload: None, expires_at }
    }

    /// Another open transaction holds a key that has no committed record.
    fn busy() -> Claim {
        Claim { outcome: Outcome::InProgress, token: None, attempts: None, payload: None, expires_at: None }
    }

    /// An answer read from the record: the token only for a completed key (its replay), the lease's
    /// end only for a key in progress, the stored payload or error.
    fn answer(answer: Answer, rec: Record) -> Claim {
        let attempts = Some(rec.attempts);
        match answer {
            Answer::Mismatch => {
                Claim { outcome: Outcome::Mismatch, token: None, attempts, payload: None, expires_at: None }
            }
            Answer::Completed => Claim {
                outcome: Outcome::Completed,
                token: rec.state.token(),
                attempts,
                payload: rec.document,
                expires_at: None,
            },
            Answer::Failed => Claim {
                outcome: Outcome::Failed,
                token: None,
                attempts,
                payload: rec.document,
                expires_at: None,
            },
            Answer::InProgress => Claim {
                outcome: Outcome::InProgress,
                token: None,
                attempts,
                payload: rec.document,
                expires_at: rec.state.expires_at(),
            },
        }
    }

    /// A copy of this answer; for a repeated occurrence of a key in one batch, the same answer
    /// except that only the first occurrence owns the claim.
    pub fn copy(&self, repeated: bool) -> Claim {
        let (outcome, token) = match self.outcome {
            Outcome::Claimed if repeated => (Outcome::InProgress, None),
            other => (other, self.token),
        };
        Claim { outcome, token, attempts: self.attempts, payload: self.payload, expires_at: self.expires_at }
    }
}

/// Counts an answer given without taking the key.
pub fn count_answer(call: &mut Call, outcome: Outcome) {
    if let Some(counter) = outcome.counter() {
        call.count(counter);
    }
}

pub fn claim(k: Key, ttl: Interval, fingerprint: Option<&str>, wait: bool) -> Claim {
    Call::run(k.scope, |call| {
        let claim = claim_one(call, k, ttl, fingerprint, wait);
        // Counted once answered (a claim that raised an ERROR answered nothing).
        call.count(Counter::Claims);
        claim
    })
}

fn claim_one(call: &mut Call, k: Key, ttl: Interval, fingerprint: Option<&str>, wait: bool) -> Claim {
    partitions::ensure_covered(call.conn(), xact::start_time());
    let Some((lock, found)) = call.lock_and_lookup(k, wait) else {
        // Another open transaction holds the key: report what is settled, never write.
        return match call.lookup(k) {
            Some(rec) => claim_existing(call, k, rec, ttl, fingerprint, None),
            None => {
                call.count(Counter::AnsweredInProgress);
                Claim::busy()
            }
        };
    };
    if let Some(rec) = found {
        return claim_existing(call, k, rec, ttl, fingerprint, Some(lock));
    }
    // A new key: its row is written once its fate is known (see `deferred`), where it would go now.
    let (partition, created_at) = partitions::insert_target(call.conn(), xact::start_time());
    let (token, claimed_at, expires_at) = new_lease(ttl);
    let remember = lock.may_defer();
    deferred::claim_new(call.conn(), k, remember, token, fingerprint, partition, created_at, claimed_at, expires_at);
    lock.written();
    call.count(Counter::ClaimedNew);
    Claim::claimed(Some(token), Some(1), Some(expires_at))
}

/// The token and lease of a new key's claim, whose row is written later (see `deferred`): what
/// `SELECT nextval('idempotency.token_seq'), clock_timestamp(), clock_timestamp() + ttl` would
/// answer, by the same functions, without an SPI statement and its executor.
pub fn new_lease(ttl: Interval) -> (i64, pg_sys::TimestampTz, pg_sys::TimestampTz) {
    let seq = catalog::token_seq_oid();
    let claimed_at = xact::clock();
    // SAFETY: PostgreSQL's own SQL-callable functions, called with arguments of their types; their
    // ERRORs (permission denied, sequence exhausted, timestamp out of range) propagate as raised.
    let (token, end) = unsafe {
        (
            direct_function_call::<i64>(|f| pg_sys::nextval_oid(f), &[seq.into_datum()]),
            direct_function_call_as_datum(
                |f| pg_sys::timestamptz_pl_interval(f),
                &[Some(pg_sys::Datum::from(claimed_at)), ttl.into_datum()],
            ),
        )
    };
    let end = end.expect("lease end").value() as pg_sys::TimestampTz;
    (token.expect("token"), claimed_at, end)
}

/// The claim of a key that has a record: does what [`decide::claim`] says, counted in the call.
/// `lock` is the key's lock when the caller holds it; a call that only read gives it back (see
/// [`KeyLock`]).
pub fn claim_existing(
    call: &mut Call,
    k: Key,
    rec: Record,
    ttl: Interval,
    fingerprint: Option<&str>,
    lock: Option<KeyLock>,
) -> Claim {
    let decision = decide::claim(
        rec.state,
        rec.attempts,
        rec.fingerprint.as_deref(),
        fingerprint,
        lock.is_some(),
        xact::clock(),
        gucs::max_attempts(),
    );
    match decision {
        ClaimDecision::Answer(answer) => {
            if let Some(lock) = lock {
                lock.release_if_only_read();
            }
            let claim = Claim::answer(answer, rec);
            count_answer(call, claim.outcome);
            claim
        }
        ClaimDecision::MarkPoison => {
            let rows = call.conn().run_on(&MARK_POISON, rec.partition, &rec.row_args(k), Snap::Statement);
            expect_one(&rows, "mark failed");
            let error = rows.get_document(0, 1);
            if let Some(lock) = lock {
                lock.written();
            }
            for counter in [Counter::Poisoned, Counter::DeadLettered, Counter::AnsweredFailed] {
                call.count(counter);
            }
            Claim { payload: error, ..Claim::answer(Answer::Failed, rec) }
        }
        ClaimDecision::TakeOver => {
            let how = match rec.state {
                State::Pending(Lease::Released { .. }) => Counter::Retries,
                _ => Counter::Takeovers,
            };
            let [scope, key, tid] = rec.row_args(k);
            let rows = call.conn().run_on(
                &TAKE_OVER,
                rec.partition,
                &[scope, key, tid, arg(fingerprint), arg(ttl)],
                Snap::Statement,
            );
            expect_one(&rows, "take over");
            let claim = Claim::claimed(rows.get(0, 1), rows.get(0, 2), rows.get_ts(0, 3));
            if let Some(lock) = lock {
                lock.written();
            }
            // Counted once done: an update that raised (a serialization failure) answered nothing.
            call.count(how);
            claim
        }
    }
}

