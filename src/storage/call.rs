//! One call of the API on the storage, and what every operation does around its own work.
//!
//! [`Call::run`] opens the connection (as the storage's owner), counts a serialization failure the
//! call raises, and publishes what the call tallied once it answered (a call that raised an ERROR
//! answered nothing, so nothing it counted on the way shows). The call's reads of records go through
//! it, and they write first the claims this transaction remembers for what they read (see
//! `deferred`): no operation writes remembered claims itself.
use super::deferred;
use super::pg::keylock::{self, KeyLock};
use super::pg::probe::{Probe, Prober, Tuple};
use super::pg::spi::Conn;
use super::pg::xact;
use super::record::{Key, Record};
use crate::errors;
use crate::stats::{self, Counter, Tally};

/// Looks at a key at most this many times when each look finds a write of it that has just committed
/// (the next look sees it); then 40001. A guard, never reached in the tests.
const LOOKS: usize = 1_000;
/// A batch's lookups ask for the filter blocks of the key this many places on (see `Prober::prefetch`):
/// two keys' blocks in flight, one per sealed partition each, stay within what a core loads at once.
const PREFETCH_AHEAD: usize = 2;

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

    /// The committed record of `k` under the latest snapshot, for a call that does not hold its lock.
    pub fn lookup(&self, k: Key) -> Option<Record> {
        self.prober_for(k).find(k.key, |t| Record::from_tuple(t, k))
    }

    /// Takes `k`'s lock and reads its record, for a call that may write it. Another transaction may
    /// hold the key without its lock (see `pg::holds`), or have an unfinished write of it and no longer
    /// hold its lock (see `pg::unlocked`): then the lock is given back, that transaction waited for, and
    /// the key looked at again. None when `wait` is false and the key is busy (its lock taken, or another
    /// transaction holding or writing it).
    pub fn lock_and_find<T>(&self, k: Key, wait: bool, read: impl Fn(&Tuple) -> T) -> Option<(KeyLock, Option<T>)> {
        for _ in 0..LOOKS {
            let lock = keylock::lock_key(k.scope, k.key, wait)?;
            // (The prober ends here: it must not keep its pins and snapshot while this call waits.)
            let probe = match lock.held_elsewhere() {
                Some(holder) => Probe::Busy(Some(holder)),
                None => self.prober_for(k).find_settled(k.key, &lock, &read),
            };
            match probe {
                Probe::Found(found) => return Some((lock, Some(found))),
                Probe::Missing => return Some((lock, None)),
                Probe::Busy(writer) => {
                    lock.give_back();
                    if !wait {
                        return None;
                    }
                    if let Some(xid) = writer {
                        keylock::wait_for_writer(k.scope, xid);
                    }
                }
            }
        }
        errors::serialization_failure(k.scope, k.key)
    }

    /// The predicate locks of a SERIALIZABLE read that found `k` missing, for a caller that answers from that
    /// without writing the key: the lookups under the key's lock take none (see `pg::probe`), which is only
    /// right for a key the caller then writes.
    pub fn lock_absence(&self, k: Key) {
        if xact::serializable() {
            self.prober_for(k).find(k.key, |_| ());
        }
    }

    /// [`Call::lock_and_find`] of the key's record.
    pub fn lock_and_lookup(&self, k: Key, wait: bool) -> Option<(KeyLock, Option<Record>)> {
        self.lock_and_find(k, wait, |t| Record::from_tuple(t, k))
    }

    /// [`Call::lock_and_find`] of several distinct keys of one scope, sorted (so that two batches never
    /// deadlock on each other): their locks, in that order, and what `read` made of each key's record, in the same
    /// order (None: missing).
    pub fn lock_and_find_all<'a, T>(
        &self,
        scope: &str,
        sorted: &[&'a str],
        read: impl Fn(&'a str, &Tuple) -> T,
    ) -> (Vec<(&'a str, KeyLock)>, Vec<Option<T>>) {
        for _ in 0..LOOKS {
            let locks: Vec<(&str, KeyLock)> = sorted
                .iter()
                .map(|&key| (key, keylock::lock_key(scope, key, true).expect("waited for the lock")))
                .collect();
            let mut found = Vec::with_capacity(sorted.len());
            // Another transaction holding one of the keys without its lock counts as writing it.
            let mut busy = locks.iter().find_map(|(_, lock)| lock.held_elsewhere()).map(Some);
            if busy.is_none() {
                // Only these keys' remembered claims are written: the batch's earlier groups stay unwritten.
                for &key in sorted {
                    deferred::write_key(&self.conn, Key { scope, key });
                }
                let mut prober = Prober::open(scope);
                for (i, (key, lock)) in locks.iter().enumerate() {
                    // The filter blocks of a key a few places on are loaded while this one is looked up.
                    if let Some((_, later)) = locks.get(i + PREFETCH_AHEAD) {
                        prober.prefetch(later.hash());
                    }
                    let key = *key;
                    match prober.find_settled(key, lock, |t| read(key, t)) {
                        Probe::Found(value) => found.push(Some(value)),
                        Probe::Missing => found.push(None),
                        Probe::Busy(writer) => {
                            busy = Some(writer);
                            break;
                        }
                    }
                }
            }
            let Some(writer) = busy else {
                return (locks, found);
            };
            for (_, lock) in locks {
                lock.give_back();
            }
            if let Some(xid) = writer {
                keylock::wait_for_writer(scope, xid);
            }
        }
        errors::serialization_failure(scope, sorted.first().copied().unwrap_or_default())
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
