//! What a DBA does to keys by hand: redrive terminal failures, forget a key. Each takes the key's
//! lock first, as every writer does, so it never races a claim: a claim waiting for the key then
//! reads what the DBA left.
use super::call::Call;
use super::decide::State;
use super::pg::spi::{arg, ts_arg, Snap, Stmt};
use super::record::{expect_one, Key};
use crate::errors;
use pgrx::pg_sys;

const T_TEXT: pg_sys::Oid = pg_sys::TEXTOID;
const T_TID: pg_sys::Oid = pg_sys::TIDOID;
const T_TS: pg_sys::Oid = pg_sys::TIMESTAMPTZOID;
const T_INT: pg_sys::Oid = pg_sys::INT4OID;

// Released, as a retryable failure leaves a key, with its attempts counted from zero again: the next
// claim takes it at once as attempt 1. The error stays, for the record.
static REDRIVE: Stmt = Stmt {
    sql: "UPDATE {partition}
             SET status = 'pending', token = NULL, attempts = 0, updated_at = clock_timestamp(),
                 expires_at = clock_timestamp()
           WHERE ctid = $3 AND scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT, T_TID],
};
static FORGET: Stmt = Stmt {
    sql: "DELETE FROM {partition} WHERE ctid = $3 AND scope = $1 AND key = $2",
    args: &[T_TEXT, T_TEXT, T_TID],
};
// Candidates only: each is checked again under its lock.
static FAILED_KEYS: Stmt = Stmt {
    sql: "SELECT key FROM idempotency.records
           WHERE scope = $1 AND status = 'failed' AND ($2::timestamptz IS NULL OR updated_at >= $2)
           ORDER BY key LIMIT $3",
    args: &[T_TEXT, T_TS, T_INT],
};

/// Makes a failed key claimable again; false when it is not failed. P0002 when it has no record.
pub fn redrive(k: Key) -> bool {
    Call::run(k.scope, |call| redrive_in(call, k))
}

fn redrive_in(call: &Call, k: Key) -> bool {
    let (lock, rec) = call.lock_and_lookup(k, true).expect("waited for the key");
    let Some(rec) = rec else {
        call.lock_absence(k);
        errors::unknown_key(k.scope, k.key, errors::HINT_REDRIVE_FAILED)
    };
    if !matches!(rec.state, State::Failed { .. }) {
        lock.release_if_only_read();
        return false;
    }
    let rows = call.conn().run_on(&REDRIVE, rec.partition, &rec.row_args(k), Snap::Statement);
    expect_one(&rows, "redrive");
    lock.written();
    true
}

/// Redrives up to `max_keys` failed keys of a scope (those failed since `since`, when given), in key
/// order; returns how many. Each key's lock is held until the transaction ends, hence the bound.
pub fn redrive_scope(scope: &str, since: Option<pg_sys::TimestampTz>, max_keys: i32) -> i64 {
    Call::run(scope, |call| {
        let rows =
            call.conn().run(&FAILED_KEYS, &[arg(scope), since.and_then(ts_arg), arg(max_keys)], Snap::Statement);
        let keys: Vec<String> = (0..rows.len()).filter_map(|i| rows.get(i, 1)).collect();
        drop(rows);
        keys.iter().filter(|key| redrive_in(call, Key { scope, key: key.as_str() })).count() as i64
    })
}

/// Removes a key's record, whatever its state; false when it has none.
pub fn forget(k: Key) -> bool {
    Call::run(k.scope, |call| {
        let (lock, rec) = call.lock_and_lookup(k, true).expect("waited for the key");
        let Some(rec) = rec else {
            call.lock_absence(k);
            lock.release_if_only_read();
            return false;
        };
        let rows = call.conn().run_on(&FORGET, rec.partition, &rec.row_args(k), Snap::Statement);
        expect_one(&rows, "forget");
        lock.written();
        true
    })
}
