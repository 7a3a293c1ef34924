//! A key and its record: what a lookup finds and what every operation decides on.
//!
//! Every writer of a key first locks it (see `keylock`), then reads its record under the latest
//! snapshot, so the read sees what the previous lock holder committed. Under REPEATABLE READ and
//! SERIALIZABLE a record the transaction's own snapshot cannot see means a concurrent transaction
//! got there first: that is a serialization failure, never a second claim.
use super::decide::State;
use super::pg::document::Document;
use super::pg::probe::{Col, Tuple};
use super::pg::spi::{arg, tid_arg, Rows};
use super::pg::xact;
use crate::errors;
use pgrx::pg_sys;

/// Identifies one key.
#[derive(Clone, Copy)]
pub struct Key<'a> {
    pub scope: &'a str,
    pub key: &'a str,
}

impl Key<'_> {
    /// `$1` and `$2` of the statements on one key: scope, key.
    pub fn args(&self) -> [Option<pg_sys::Datum>; 2] {
        [arg(self.scope), arg(self.key)]
    }
}

/// One key's record as the latest snapshot sees it.
pub struct Record {
    pub state: State,
    pub attempts: i32,
    pub fingerprint: Option<String>,
    pub xmin: pg_sys::TransactionId,
    /// Where it is: its partition and its ctid there.
    pub partition: pg_sys::Oid,
    tid: pg_sys::ItemPointerData,
    /// The stored payload for `completed`, the stored error otherwise (read only when needed).
    pub document: Option<Document>,
}

/// A record written by a transaction this transaction's snapshot cannot see (REPEATABLE READ,
/// SERIALIZABLE) was written concurrently: raise 40001 (counted by the call, as PostgreSQL's own).
pub fn check_visible(k: Key, xmin: pg_sys::TransactionId) {
    if xact::snapshot_misses(xmin) {
        errors::serialization_failure(k.scope, k.key);
    }
}

impl Record {
    /// Reads a record found by a probe, checking that this transaction may see it.
    pub fn from_tuple(t: &Tuple, k: Key) -> Record {
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

    /// This row version's ctid as text, `(block,offset)`.
    pub fn ctid_text(&self) -> String {
        let block = (u32::from(self.tid.ip_blkid.bi_hi) << 16) | u32::from(self.tid.ip_blkid.bi_lo);
        format!("({block},{})", self.tid.ip_posid)
    }

    /// `$1` to `$3` of the statements that update this row version: scope, key, ctid.
    pub fn row_args(&self, k: Key) -> [Option<pg_sys::Datum>; 3] {
        [arg(k.scope), arg(k.key), tid_arg(self.tid)]
    }
}

/// An update or delete of one found row version touched exactly that row.
pub fn expect_one(rows: &Rows, what: &str) {
    expect_rows(rows, 1, what);
}

/// An update or delete of `n` found row versions touched exactly those rows.
pub fn expect_rows(rows: &Rows, n: usize, what: &str) {
    if rows.len() != n {
        panic!("idempotency: {what} touched {} rows instead of {n}", rows.len());
    }
}
