//! The record table: reads a key's record, lets [`decide`] say what to do, and does it.
//!
//! Every writer of a key first locks it (see [`keylock`]), then reads its record under the
//! latest snapshot, so the read sees what the previous lock holder committed. Under REPEATABLE
//! READ and SERIALIZABLE a record the transaction's own snapshot cannot see means a concurrent
//! transaction got there first: that is a serialization failure, never a second claim.
use super::catalog;
use super::deferred;
use super::direct;
use super::decide::{self, Answer, ClaimDecision, FailDecision, Lease, NotHeld, State};
use super::document::{Document, Documents};
use super::keylock::{self, KeyLock};
use super::partitions;
use super::probe::{Col, Prober, Tuple};
use super::spi::{arg, tid_arg, ts_arg, Conn, Rows, Snap, Stmt};
use super::xact;
use crate::errors;
use crate::gucs;
use crate::stats::{self, Counter, Tally};
use pgrx::pg_sys;
use pgrx::fcinfo::{direct_function_call, direct_function_call_as_datum};
use pgrx::prelude::*;
use std::collections::HashMap;

const T_TEXT: pg_sys::Oid = pg_sys::TEXTOID;
const T_TID: pg_sys::Oid = pg_sys::TIDOID;
const T_IVL: pg_sys::Oid = pg_sys::INTERVALOID;
const T_TEXT_ARRAY: pg_sys::Oid = pg_sys::TEXTARRAYOID;
const T_JSONB: pg_sys::Oid = pg_sys::JSONBOID;
const T_JSONB_ARRAY: pg_sys::Oid = pg_sys::JSONBARRAYOID;
const T_TS: pg_sys::Oid = pg_sys::TIMESTAMPTZOID;

static INSERT_ONCE: Stmt = Stmt {
    sql: "INSERT INTO {partition} (scope, key, status, attempts, created_at, updated_at)
          VALUES ($1, $2, 'completed', 1, $3, now())",
    args: &[T_TEXT, T_TEXT, T_TS],
};
static INSERT_CLAIMS: Stmt = Stmt {
    sql: "INSERT INTO {partition}
                 (scope, key, status, token, attempts, created_at, updated_at, expires_at)
          SELECT $1, k, 'pending', nextval('idempotency.token_seq'), 1, $4, clock_timestamp(),
                 clock_timestamp() + $3
            FROM unnest($2::text[]) AS k
          RETURNING key, token, expires_at",
    args: &[T_TEXT, T_TEXT_ARRAY, T_IVL, T_TS],
};
static INSERT_ONCES: Stmt = Stmt {
    sql: "INSERT INTO {partition} (scope, key, status, attempts, created_at, updated_at)
          SELECT $1, k, 'completed', 1, $3, now() FROM unnest($2::text[]) AS k",
    args: &[T_TEXT, T_TEXT_ARRAY, T_TS],
};
static COMPLETE_MANY: Stmt = Stmt {
    sql: "UPDATE idempotency.records r
             SET status = 'completed', payload = u.p, updated_at = clock_timestamp(), expires_at = NULL
            FROM unnest($2::text[], $3::jsonb[]) AS u(k, p)
           WHERE r.scope = $1 AND r.key = u.k",
    args: &[T_TEXT, T_TEXT_ARRAY, T_JSONB_ARRAY],
};
static STATUS: Stmt = Stmt {
    sql: "SELECT status, attempts, token, payload, error, created_at, updated_at, expires_at
            FROM idempotency.records WHERE scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT],
};
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
static MARK_FAILED: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET status = 'failed', error = $4, updated_at = clock_timestamp(), expires_at = NULL
           WHERE ctid = $3 AND scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT, T_TID, T_JSONB],
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
static RELEASE: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET token = NULL, error = $4, updated_at = clock_timestamp(), expires_at = clock_timestamp()
           WHERE ctid = $3 AND scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT, T_TID, T_JSONB],
};
static COMPLETE: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET status = 'completed', payload = $4, updated_at = clock_timestamp(), expires_at = NULL
           WHERE ctid = $3 AND scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT, T_TID, T_JSONB],
};
static HEARTBEAT: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET expires_at = clock_timestamp() + $4, updated_at = clock_timestamp()
           WHERE ctid = $3 AND scope = $1 AND key = $2
          RETURNING expires_at",
    args: &[T_TEXT, T_TEXT, T_TID, T_IVL],
};

/// One key's record as the latest snapshot sees it.
pub(super) struct Record {
    pub(super) state: State,
    attempts: i32,
    fingerprint: Option<String>,
    xmin: pg_sys::TransactionId,
    /// Where it is: its partition and its ctid there.
    pub(super) partition: pg_sys::Oid,
    tid: pg_sys::ItemPointerData,
    /// The stored payload for `completed`, the stored error otherwise (read only when needed).
    document: Option<Document>,
}

/// Identifies one key.
#[derive(Clone, Copy)]
pub struct Key<'a> {
    pub scope: &'a str,
    pub key: &'a str,
}

impl Key<'_> {
    fn args(&self) -> [Option<pg_sys::Datum>; 2] {
        [arg(self.scope), arg(self.key)]
    }
}

/// A record written by a transaction this transaction's snapshot cannot see (REPEATABLE READ,
/// SERIALIZABLE) was written concurrently: raise 40001 (counted by the call's
/// `stats::count_serialization_failures`, as PostgreSQL's own).
fn check_visible(k: Key, xmin: pg_sys::TransactionId) {
    if xact::snapshot_misses(xmin) {
        errors::serialization_failure(k.scope, k.key);
    }
}

impl Record {
    /// Reads a record found by a probe, checking that this transaction may see it.
    fn from_tuple(t: &Tuple, k: Key) -> Record {
        let xmin = t.xmin();
        check_visible(k, xmin);
        let status = t.get::<String>(Col::Status).expect("status");
        let state = State::from_columns(&status, t.get(Col::Token), t.get_ts(Col::ExpiresAt))
            .unwrap_or_else(|| panic!("unexpected status {status:?} in idempotency.records"));
        let document = match state {
            State::Pending(_) => None,
            State::Completed { .. } => t.get_document(Col::Payload),
            State::Failed { .. } => t.get_document(Col::Error),
        };
        Record {
            state,
            attempts: t.get(Col::Attempts).expect("attempts"),
            fingerprint: t.get(Col::Fingerprint),
            xmin,
            partition: t.partition(),
            tid: t.tid(),
            document,
        }
    }

    /// `$1` to `$3` of the statements that update this row version: scope, key, ctid.
    pub(super) fn row_args(&self, k: Key) -> [Option<pg_sys::Datum>; 3] {
        [arg(k.scope), arg(k.key), tid_arg(self.tid)]
    }
}

/// A key's record under the latest snapshot. `_conn` is open: documents are copied out to the
/// caller's memory through SPI.
pub(super) fn lookup(conn: &Conn, k: Key) -> Option<Record> {
    deferred::write_key(conn, k);
    Prober::open(k.scope).find(k.key, |t| Record::from_tuple(t, k))
}

/// The records of several keys of one scope, by key.
fn lookup_many(conn: &Conn, scope: &str, keys: &[&str]) -> HashMap<String, Record> {
    deferred::write_all(conn, Some(scope));
    let mut prober = Prober::open(scope);
    keys.iter()
        .filter_map(|&key| prober.find(key, |t| (key.to_string(), Record::from_tuple(t, Key { scope, key }))))
        .collect()
}

/// Where this transaction's new records go, and their `created_at`: `now()`, the transaction's
/// start, unless that falls in a sealed partition (see `partitions::insert_target`).
fn new_rows_go(conn: &Conn) -> (pg_sys::Oid, Option<pg_sys::Datum>) {
    let (partition, created_at) = partitions::insert_target(conn, xact::start_time());
    (partition, ts_arg(created_at))
}

/// Locks several keys in a fixed (sorted) order, so two batches never deadlock on each other.
/// Returns the distinct keys, sorted, with their locks.
fn lock_all<'a>(scope: &str, keys: &[&'a str]) -> Vec<(&'a str, KeyLock)> {
    let mut distinct = keys.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    distinct
        .into_iter()
        .map(|key| (key, keylock::lock_key(scope, key, true).expect("waited for the lock")))
        .collect()
}

pub(super) fn expect_one(rows: &Rows, what: &str) {
    if rows.len() != 1 {
        panic!("idempotency: {what} touched {} rows instead of 1", rows.len());
    }
}

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
    fn of_status(status: &str) -> Outcome {
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
    fn claimed(token: Option<i64>, attempts: Option<i32>, expires_at: Option<pg_sys::TimestampTz>) -> Claim {
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
    fn copy(&self, repeated: bool) -> Claim {
        let (outcome, token) = match self.outcome {
            Outcome::Claimed if repeated => (Outcome::InProgress, None),
            other => (other, self.token),
        };
        Claim { outcome, token, attempts: self.attempts, payload: self.payload, expires_at: self.expires_at }
    }
}

/// Counts an answer given without taking the key.
fn count_answer(tally: &mut Tally, outcome: Outcome) {
    if let Some(counter) = outcome.counter() {
        tally.count(counter);
    }
}

pub fn claim(k: Key, ttl: Interval, fingerprint: Option<&str>, wait: bool) -> Claim {
    stats::count_serialization_failures(k.scope, || {
        let mut tally = Tally::default();
        let claim = claim_one(k, ttl, fingerprint, wait, &mut tally);
        // Counted once answered (a claim that raised an ERROR answered nothing).
        tally.count(Counter::Claims);
        tally.publish(k.scope);
        claim
    })
}

fn claim_one(k: Key, ttl: Interval, fingerprint: Option<&str>, wait: bool, tally: &mut Tally) -> Claim {
    let conn = Conn::open();
    partitions::ensure_covered(&conn, xact::start_time());
    let Some(lock) = keylock::lock_key(k.scope, k.key, wait) else {
        // Another open transaction holds the key: report what is settled, never write.
        return match lookup(&conn, k) {
            Some(rec) => claim_existing(&conn, k, rec, ttl, fingerprint, None, tally),
            None => {
                tally.count(Counter::AnsweredInProgress);
                Claim::busy()
            }
        };
    };
    if let Some(rec) = lookup(&conn, k) {
        return claim_existing(&conn, k, rec, ttl, fingerprint, Some(lock), tally);
    }
    // A new key: its row is written once its fate is known (see `deferred`), where it would go now.
    let (partition, created_at) = partitions::insert_target(&conn, xact::start_time());
    let (token, claimed_at, expires_at) = new_lease(ttl);
    deferred::defer(k, token, fingerprint, partition, created_at, claimed_at, expires_at);
    tally.count(Counter::ClaimedNew);
    Claim::claimed(Some(token), Some(1), Some(expires_at))
}

/// The token and lease of a new key's claim, whose row is written later (see `deferred`): what
/// `SELECT nextval('idempotency.token_seq'), clock_timestamp(), clock_timestamp() + ttl` would
/// answer, by the same functions, without an SPI statement and its executor.
fn new_lease(ttl: Interval) -> (i64, pg_sys::TimestampTz, pg_sys::TimestampTz) {
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

/// The claim of a key that has a record: does what [`decide::claim`] says, counted in `tally`.
/// `lock` is the key's lock when the caller holds it; a call that only read gives it back (see
/// [`KeyLock`]).
fn claim_existing(
    conn: &Conn,
    k: Key,
    rec: Record,
    ttl: Interval,
    fingerprint: Option<&str>,
    lock: Option<KeyLock>,
    tally: &mut Tally,
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
            count_answer(tally, claim.outcome);
            claim
        }
        ClaimDecision::MarkPoison => {
            let rows = conn.run_on(&MARK_POISON, rec.partition, &rec.row_args(k), Snap::Statement);
            expect_one(&rows, "mark failed");
            let error = rows.get_document(0, 1);
            for counter in [Counter::Poisoned, Counter::DeadLettered, Counter::AnsweredFailed] {
                tally.count(counter);
            }
            Claim { payload: error, ..Claim::answer(Answer::Failed, rec) }
        }
        ClaimDecision::TakeOver => {
            let how = match rec.state {
                State::Pending(Lease::Released { .. }) => Counter::Retries,
                _ => Counter::Takeovers,
            };
            let [scope, key, tid] = rec.row_args(k);
            let rows = conn.run_on(
                &TAKE_OVER,
                rec.partition,
                &[scope, key, tid, arg(fingerprint), arg(ttl)],
                Snap::Statement,
            );
            expect_one(&rows, "take over");
            // Counted once done: an update that raised (a serialization failure) answered nothing.
            tally.count(how);
            Claim::claimed(rows.get(0, 1), rows.get(0, 2), rows.get_ts(0, 3))
        }
    }
}

/// Claims several keys of one scope in one go. Returns one claim per input key, in input
/// order; a key repeated in the batch gets its first occurrence's answer, except that only the
/// first occurrence can be `claimed` (the repeats are `in_progress`).
pub fn claim_batch(scope: &str, keys: &[&str], ttl: Interval) -> Vec<Claim> {
    stats::count_serialization_failures(scope, || claim_batch_inner(scope, keys, ttl))
}

fn claim_batch_inner(scope: &str, keys: &[&str], ttl: Interval) -> Vec<Claim> {
    let conn = Conn::open();
    partitions::ensure_covered(&conn, xact::start_time());
    let locks = lock_all(scope, keys);
    let distinct: Vec<&str> = locks.iter().map(|(key, _)| *key).collect();
    let mut found = lookup_many(&conn, scope, &distinct);
    let missing: Vec<&str> = distinct.iter().copied().filter(|key| !found.contains_key(*key)).collect();
    let mut answers: HashMap<&str, Claim> = HashMap::with_capacity(distinct.len());
    // Published once every key is answered: a later key's takeover may still raise.
    let mut tally = Tally::default();
    if !missing.is_empty() {
        let (partition, created_at) = new_rows_go(&conn);
        let rows = conn.run_on(
            &INSERT_CLAIMS,
            partition,
            &[arg(scope), arg(missing.clone()), arg(ttl), created_at],
            Snap::Statement,
        );
        for i in 0..rows.len() {
            let key: String = rows.get(i, 1).expect("key");
            let slot = *missing.iter().find(|m| **m == key).expect("inserted key was asked for");
            answers.insert(slot, Claim::claimed(rows.get(i, 2), Some(1), rows.get_ts(i, 3)));
        }
        tally.add(Counter::ClaimedNew, rows.len() as u64);
    }
    for (key, lock) in locks {
        if let Some(rec) = found.remove(key) {
            let claim = claim_existing(&conn, Key { scope, key }, rec, ttl, None, Some(lock), &mut tally);
            answers.insert(key, claim);
        }
    }
    tally.add(Counter::Claims, keys.len() as u64);
    let mut seen = std::collections::HashSet::with_capacity(distinct.len());
    let claims = keys
        .iter()
        .map(|key| {
            let first = answers.get(key).expect("every key answered");
            let repeated = !seen.insert(*key);
            let claim = first.copy(repeated);
            if repeated {
                count_answer(&mut tally, claim.outcome);
            }
            claim
        })
        .collect();
    tally.publish(scope);
    claims
}

/// Locks the key and returns its record if the caller holds its lease.
fn held(conn: &Conn, k: Key, token: Option<i64>) -> Record {
    keylock::lock_key(k.scope, k.key, true);
    check_held(k, lookup(conn, k), token)
}

/// The record, when the caller holds the key's lease (see [`decide::holds`]); an ERROR otherwise.
fn check_held(k: Key, rec: Option<Record>, token: Option<i64>) -> Record {
    let claimed_here = rec.as_ref().is_some_and(|r| xact::wrote(r.xmin));
    match decide::holds(rec.as_ref().map(|r| r.state), token, claimed_here) {
        Ok(()) => rec.expect("a held key has a record"),
        Err(NotHeld::Unknown) => errors::unknown_key(k.scope, k.key, errors::HINT_CLAIM_FIRST),
        Err(NotHeld::Settled(status)) => errors::already_terminal(k.scope, k.key, status),
        Err(NotHeld::LeaseLost(why)) => {
            stats::count(k.scope, Counter::StaleRefused);
            errors::lease_lost(k.scope, k.key, &why)
        }
    }
}

pub fn complete(k: Key, payload: Option<Document>, token: Option<i64>) {
    stats::count_serialization_failures(k.scope, || complete_inner(k, payload, token))
}

fn complete_inner(k: Key, payload: Option<Document>, token: Option<i64>) {
    let conn = Conn::open();
    if deferred::complete(&conn, k, payload.as_ref(), token) {
        // Claimed by this transaction and not written yet: written once, completed.
        stats::count(k.scope, Counter::Completes);
        return;
    }
    let rec = held(&conn, k, token);
    let [scope, key, tid] = rec.row_args(k);
    let payload = payload.map(|d| d.datum());
    let rows = conn.run_on(&COMPLETE, rec.partition, &[scope, key, tid, payload], Snap::Statement);
    expect_one(&rows, "complete");
    stats::count(k.scope, Counter::Completes);
}

/// Records a failure; returns the status the key is left in: "released" or "failed".
pub fn fail(k: Key, error: Option<Document>, retryable: bool, token: Option<i64>) -> &'static str {
    stats::count_serialization_failures(k.scope, || fail_inner(k, error, retryable, token))
}

fn fail_inner(k: Key, error: Option<Document>, retryable: bool, token: Option<i64>) -> &'static str {
    let conn = Conn::open();
    let rec = held(&conn, k, token);
    let decision = decide::fail(retryable, rec.attempts, gucs::max_attempts());
    let (stmt, left) = match decision {
        FailDecision::Release => (&RELEASE, "released"),
        FailDecision::MarkFailed => (&MARK_FAILED, "failed"),
    };
    let [scope, key, tid] = rec.row_args(k);
    let error = error.map(|d| d.datum());
    let rows = conn.run_on(stmt, rec.partition, &[scope, key, tid, error], Snap::Statement);
    expect_one(&rows, "fail");
    // Counted once done, as every counter: a call that raised did nothing.
    stats::count(k.scope, Counter::Fails);
    if decision == FailDecision::MarkFailed {
        stats::count(k.scope, Counter::DeadLettered);
        if retryable {
            stats::count(k.scope, Counter::Poisoned);
        }
    }
    left
}

pub fn heartbeat(k: Key, ttl: Interval, token: Option<i64>) -> pg_sys::TimestampTz {
    stats::count_serialization_failures(k.scope, || heartbeat_inner(k, ttl, token))
}

fn heartbeat_inner(k: Key, ttl: Interval, token: Option<i64>) -> pg_sys::TimestampTz {
    let conn = Conn::open();
    let rec = held(&conn, k, token);
    let [scope, key, tid] = rec.row_args(k);
    let rows = conn.run_on(&HEARTBEAT, rec.partition, &[scope, key, tid, arg(ttl)], Snap::Statement);
    expect_one(&rows, "heartbeat");
    stats::count(k.scope, Counter::Heartbeats);
    rows.get_ts(0, 1).expect("expires_at")
}

/// What `idem_once` read of a key it answers `false` for: the record's `xmin`, and which answer that
/// is (read only when counted).
fn once_answer(t: &Tuple) -> (pg_sys::TransactionId, Outcome) {
    let seen = match stats::enabled() {
        true => Outcome::of_status(&t.get::<String>(Col::Status).unwrap_or_default()),
        false => Outcome::Completed,
    };
    (t.xmin(), seen)
}

/// True exactly once per key over all committed transactions.
pub fn once(k: Key) -> bool {
    stats::count_serialization_failures(k.scope, || once_inner(k))
}

fn once_inner(k: Key) -> bool {
    let conn = Conn::open();
    partitions::ensure_covered(&conn, xact::start_time());
    let lock = keylock::lock_key(k.scope, k.key, true).expect("waited for the lock");
    deferred::write_key(&conn, k);
    if let Some((xmin, seen)) = Prober::open(k.scope).find(k.key, once_answer) {
        check_visible(k, xmin);
        let mut tally = Tally::default();
        tally.count(Counter::Claims);
        count_answer(&mut tally, seen);
        tally.publish(k.scope);
        lock.release_if_only_read();
        return false;
    }
    let (partition, created_at) = partitions::insert_target(&conn, xact::start_time());
    let row = direct::Row {
        scope: k.scope,
        key: k.key,
        status: "completed",
        token: None,
        attempts: 1,
        fingerprint: None,
        payload: None,
        created_at,
        updated_at: xact::start_time(),
        expires_at: None,
    };
    if !direct::insert(partition, &row) {
        let [scope, key] = k.args();
        conn.run_on(&INSERT_ONCE, partition, &[scope, key, ts_arg(created_at)], Snap::Statement);
    }
    stats::count(k.scope, Counter::Claims);
    stats::count(k.scope, Counter::ClaimedNew);
    true
}

/// Completes several claimed keys of one scope; every key must be held by the caller (see
/// [`check_held`]) or nothing is written. Returns how many were completed.
pub fn complete_batch(
    scope: &str,
    keys: &[&str],
    payloads: Option<&Documents>,
    tokens: &[Option<i64>],
) -> i64 {
    stats::count_serialization_failures(scope, || complete_batch_inner(scope, keys, payloads, tokens))
}

fn complete_batch_inner(
    scope: &str,
    keys: &[&str],
    payloads: Option<&Documents>,
    tokens: &[Option<i64>],
) -> i64 {
    let conn = Conn::open();
    lock_all(scope, keys);
    let mut found = lookup_many(&conn, scope, keys);
    for (key, token) in keys.iter().zip(tokens) {
        check_held(Key { scope, key }, found.remove(*key), *token);
    }
    let payloads = payloads.map(|p| p.datum());
    let rows = conn.run(&COMPLETE_MANY, &[arg(scope), arg(keys.to_vec()), payloads], Snap::Statement);
    stats::add(scope, Counter::Completes, rows.len() as u64);
    rows.len() as i64
}

/// The keys of a batch that no committed transaction has seen before, in input order, each once;
/// they are recorded as completed in the caller's transaction.
pub fn once_batch(scope: &str, keys: &[&str]) -> Vec<String> {
    stats::count_serialization_failures(scope, || once_batch_inner(scope, keys))
}

fn once_batch_inner(scope: &str, keys: &[&str]) -> Vec<String> {
    let conn = Conn::open();
    partitions::ensure_covered(&conn, xact::start_time());
    let locks = lock_all(scope, keys);
    deferred::write_all(&conn, Some(scope));
    // Opened after the locks: its snapshot must see what their previous holders committed.
    let mut prober = Prober::open(scope);
    let mut fresh = Vec::new();
    let mut seen = HashMap::new();
    for (key, lock) in locks {
        match prober.find(key, once_answer) {
            Some((xmin, answer)) => {
                check_visible(Key { scope, key }, xmin);
                seen.insert(key, answer);
                lock.release_if_only_read();
            }
            None => fresh.push(key),
        }
    }
    drop(prober);
    if !fresh.is_empty() {
        let (partition, created_at) = new_rows_go(&conn);
        conn.run_on(&INSERT_ONCES, partition, &[arg(scope), arg(fresh.clone()), created_at], Snap::Statement);
    }
    if stats::enabled() {
        let mut tally = Tally::default();
        tally.add(Counter::Claims, keys.len() as u64);
        // Each occurrence of a known key gets its record's answer; a new key is claimed by its first
        // occurrence, and its repeats in the batch are its duplicates.
        let mut firsts = std::collections::HashSet::with_capacity(fresh.len());
        for key in keys {
            match seen.get(key) {
                Some(&answer) => count_answer(&mut tally, answer),
                None if firsts.insert(*key) => tally.count(Counter::ClaimedNew),
                None => tally.count(Counter::AnsweredCompleted),
            }
        }
        tally.publish(scope);
    }
    let fresh: std::collections::HashSet<&str> = fresh.into_iter().collect();
    let mut emitted = std::collections::HashSet::with_capacity(fresh.len());
    keys.iter().filter(|k| fresh.contains(*k) && emitted.insert(**k)).map(|k| k.to_string()).collect()
}

pub struct StatusRow {
    pub status: String,
    pub attempts: i32,
    pub token: Option<i64>,
    pub payload: Option<Document>,
    pub error: Option<Document>,
    pub created_at: pg_sys::TimestampTz,
    pub updated_at: pg_sys::TimestampTz,
    pub expires_at: Option<pg_sys::TimestampTz>,
}

pub fn status(k: Key) -> Option<StatusRow> {
    let conn = Conn::open();
    deferred::write_key(&conn, k);
    let rows = conn.run(&STATUS, &k.args(), Snap::Statement);
    if rows.len() == 0 {
        return None;
    }
    Some(StatusRow {
        status: rows.get(0, 1).expect("status"),
        attempts: rows.get(0, 2).expect("attempts"),
        token: rows.get(0, 3),
        payload: rows.get_document(0, 4),
        error: rows.get_document(0, 5),
        created_at: rows.get_ts(0, 6).expect("created_at"),
        updated_at: rows.get_ts(0, 7).expect("updated_at"),
        expires_at: rows.get_ts(0, 8),
    })
}
