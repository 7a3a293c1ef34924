//! One call of the API on the storage, and what every operation does around its own work.
//!
//! [`Call::run`] opens the connection (as the storage's owner), counts a serialization failure the
//! call raises, and publishes what the call tallied once it answered (a call that raised an ERROR
//! answered nothing, so nothing it counted on the way shows). The call's reads of records go through
//! it, and they write first the claims this transaction remembers for what they read (see
//! `deferred`): no operation writes remembered claims itself.
use super::deferred;
use super::pg::probe::Prober;
use super::pg::spi::Conn;
use super::record::{Key, Record};
use crate::stats::{self, Counter, Tally};
use std::collections::HashMap;

pub struct Call {
    conn: Conn,
    tally: Tally,
}

impl Call {
    /// Runs `op`, one operation on `scope`, in a call.
    pub fn run<T>(scope: &str, op: impl FnOnce(&mut Call) -> T) -> T {
        stats::count_serialization_failures(scope, || {
            let mut call = Call { conn: Conn::open(), tally: Tally::default() };
            let answer = op(&mut call);
            call.tally.publish(scope);
            answer
        })
    }

    /// The connection, for the statements on the rows this call found or writes.
    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Counts one event of the call's scope, shown once the call answered.
    pub fn count(&mut self, counter: Counter) {
        self.tally.count(counter);
    }

    pub fn add(&mut self, counter: Counter, n: u64) {
        self.tally.add(counter, n);
    }

    /// The record of `k` under the latest snapshot.
    pub fn lookup(&self, k: Key) -> Option<Record> {
        self.prober_for(k).find(k.key, |t| Record::from_tuple(t, k))
    }

    /// The records of several keys of one scope, by key.
    pub fn lookup_many(&self, scope: &str, keys: &[&str]) -> HashMap<String, Record> {
        let mut prober = self.prober(scope);
        keys.iter()
            .filter_map(|&key| prober.find(key, |t| (key.to_string(), Record::from_tuple(t, Key { scope, key }))))
            .collect()
    }

    /// A prober of `k`'s scope, for a read of `k` only (opened after the key's lock: its snapshot
    /// sees what the lock's previous holder committed).
    pub fn prober_for(&self, k: Key) -> Prober {
        deferred::write_key(&self.conn, k);
        Prober::open(k.scope)
    }

    /// A prober of `scope`, for reads of any of its keys.
    pub fn prober(&self, scope: &str) -> Prober {
        deferred::write_all(&self.conn, Some(scope));
        Prober::open(scope)
    }

    /// The connection, for an SQL read of `k`'s record.
    pub fn conn_reading(&self, k: Key) -> &Conn {
        deferred::write_key(&self.conn, k);
        &self.conn
    }
}

/// Runs `op`, which reads every key of the storage (a seal), with every remembered claim written first.
pub fn with_all_claims_written<T>(op: impl FnOnce() -> T) -> T {
    deferred::write_all(&Conn::open(), None);
    op()
}
