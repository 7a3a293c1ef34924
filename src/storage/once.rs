//! `idem_once`: true exactly once per key over all committed transactions, with one row write.
use super::call::Call;
use super::claim::{count_answer, Outcome};
use super::lifecycle::partitions;
use super::pg::probe::{Col, Tuple};
use super::pg::writer::{self, Row};
use super::pg::xact;
use super::record::{check_visible, Key};
use crate::stats::{self, Counter};
use pgrx::pg_sys;

/// What `idem_once` read of a key it answers `false` for: the record's `xmin`, and which answer that
/// is (read only when counted).
pub fn once_answer(t: &Tuple) -> (pg_sys::TransactionId, Outcome) {
    let seen = match stats::enabled() {
        true => Outcome::of_status(&t.get::<String>(Col::Status).unwrap_or_default()),
        false => Outcome::Completed,
    };
    (t.xmin(), seen)
}

/// The row `idem_once` writes for a new key: completed, created by this transaction.
pub fn once_row<'a>(scope: &'a str, key: &'a str, created_at: pg_sys::TimestampTz) -> Row<'a> {
    Row {
        scope,
        key,
        status: "completed",
        token: None,
        attempts: 1,
        fingerprint: None,
        payload: None,
        created_at,
        updated_at: xact::start_time(),
        expires_at: None,
    }
}

pub fn once(k: Key) -> bool {
    Call::run(k.scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let (lock, found) = call.lock_and_find(k, true, once_answer).expect("waited for the key");
        call.count(Counter::Claims);
        if let Some((xmin, seen)) = found {
            check_visible(k, xmin);
            count_answer(call, seen);
            lock.release_if_only_read();
            return false;
        }
        let (partition, created_at) = partitions::insert_target(call.conn(), xact::start_time());
        writer::insert(call.conn(), partition, &once_row(k.scope, k.key, created_at));
        lock.written();
        call.count(Counter::ClaimedNew);
        true
    })
}
