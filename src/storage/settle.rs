//! Settling a held key: `idem_complete`, `idem_fail` and `idem_heartbeat`. Each acts only for the
//! key's holder: its lease's token, or the transaction that claimed it.
use super::call::Call;
use super::decide::{self, FailDecision, NotHeld};
use super::deferred;
use super::pg::document::Document;
use super::pg::keylock::KeyLock;
use super::pg::spi::{arg, Snap, Stmt};
use super::pg::xact;
use super::record::{expect_one, Key, Record};
use crate::errors;
use crate::gucs;
use crate::stats::{self, Counter};
use pgrx::pg_sys;
use pgrx::prelude::*;

const T_TEXT: pg_sys::Oid = pg_sys::TEXTOID;
const T_TID: pg_sys::Oid = pg_sys::TIDOID;
const T_IVL: pg_sys::Oid = pg_sys::INTERVALOID;
const T_JSONB: pg_sys::Oid = pg_sys::JSONBOID;

static MARK_FAILED: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET status = 'failed', error = $4, updated_at = clock_timestamp(), expires_at = NULL
           WHERE ctid = $3 AND scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT, T_TID, T_JSONB],
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

/// Locks the key and returns its lock and record if the caller holds its lease.
fn held(call: &Call, k: Key, token: Option<i64>) -> (KeyLock, Record) {
    let (lock, rec) = call.lock_and_lookup(k, true).expect("waited for the key");
    if rec.is_none() {
        // Answered P0002, which a caller may catch and act on.
        call.lock_absence(k);
    }
    (lock, check_held(k, rec, token))
}

/// The record, when the caller holds the key's lease (see [`decide::holds`]); an ERROR otherwise.
pub fn check_held(k: Key, rec: Option<Record>, token: Option<i64>) -> Record {
    let claimed_here = rec.as_ref().is_some_and(|r| xact::wrote(r.xmin));
    match decide::holds(rec.as_ref().map(|r| r.state), token, claimed_here) {
        Ok(()) => rec.expect("a held key has a record"),
        Err(NotHeld::Unknown) => errors::unknown_key(k.scope, k.key, errors::HINT_CLAIM_FIRST),
        Err(NotHeld::Settled(status)) => errors::already_terminal(k.scope, k.key, status),
        Err(NotHeld::LeaseLost(why)) => {
            // Counted now: the call raises, and what it tallied never shows.
            stats::count(k.scope, Counter::StaleRefused);
            errors::lease_lost(k.scope, k.key, &why)
        }
    }
}

pub fn complete(k: Key, payload: Option<Document>, token: Option<i64>) {
    Call::run(k.scope, |call| {
        // Claimed by this transaction and not written yet: written once, completed.
        if !deferred::complete(call.conn(), k, payload.as_ref(), token) {
            let (lock, rec) = held(call, k, token);
            let [scope, key, tid] = rec.row_args(k);
            let payload = payload.map(|d| d.datum());
            let rows = call.conn().run_on(&COMPLETE, rec.partition, &[scope, key, tid, payload], Snap::Statement);
            expect_one(&rows, "complete");
            lock.written();
        }
        call.count(Counter::Completes);
    })
}

/// Records a failure; returns the status the key is left in: "released" or "failed".
pub fn fail(k: Key, error: Option<Document>, retryable: bool, token: Option<i64>) -> &'static str {
    Call::run(k.scope, |call| {
        let (lock, rec) = held(call, k, token);
        let decision = decide::fail(retryable, rec.attempts, gucs::max_attempts());
        let (stmt, left) = match decision {
            FailDecision::Release => (&RELEASE, "released"),
            FailDecision::MarkFailed => (&MARK_FAILED, "failed"),
        };
        let [scope, key, tid] = rec.row_args(k);
        let error = error.map(|d| d.datum());
        let rows = call.conn().run_on(stmt, rec.partition, &[scope, key, tid, error], Snap::Statement);
        expect_one(&rows, "fail");
        lock.written();
        call.count(Counter::Fails);
        if decision == FailDecision::MarkFailed {
            call.count(Counter::DeadLettered);
            if retryable {
                call.count(Counter::Poisoned);
            }
        }
        left
    })
}

pub fn heartbeat(k: Key, ttl: Interval, token: Option<i64>) -> pg_sys::TimestampTz {
    Call::run(k.scope, |call| {
        let (lock, rec) = held(call, k, token);
        let [scope, key, tid] = rec.row_args(k);
        let rows = call.conn().run_on(&HEARTBEAT, rec.partition, &[scope, key, tid, arg(ttl)], Snap::Statement);
        expect_one(&rows, "heartbeat");
        lock.written();
        let expires_at = rows.get_ts(0, 1).expect("expires_at");
        call.count(Counter::Heartbeats);
        expires_at
    })
}
