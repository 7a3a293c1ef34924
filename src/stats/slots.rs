//! The table of counter slots in shared memory, one per (database, scope): finding a scope's slot,
//! adding to it, reading the rows of a database, resetting them.
//!
//! The table is an open-addressing hash table without locks: a slot is taken once, by a
//! compare-and-swap of its key, and never moves or goes away (a reset zeroes its counters), so a
//! backend remembers its slots for life and publishes with atomic additions. It has twice as many
//! slots as scopes may be counted, so probes stay short; scopes beyond `stats_max_scopes` share one
//! slot per database (scope NULL). A restart is the only way a slot is ever freed (see
//! [`super::persist`]).
use super::backend::now;
use super::counters::COUNTERS;
use super::hash::hash_of;
use super::names::{read_name, shown_name, write_name};
use super::region::{attached, header, slot};
use std::sync::atomic::Ordering;

/// Finds the slot of `key`, taking a free one for it when `take` allows. None when the table has no
/// free slot left (or `take` refused one).
fn find_or_take(key: u64, db: u32, scope: &str, shared: bool, take: &dyn Fn() -> bool) -> Option<usize> {
    let h = header();
    let n = h.slots as usize;
    let start = (key % n as u64) as usize;
    for probe in 0..n {
        let i = (start + probe) % n;
        let s = slot(i);
        let mut current = s.key.load(Ordering::Acquire);
        if current == 0 {
            if !take() {
                return None;
            }
            match s.key.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    s.db.store(db, Ordering::Relaxed);
                    s.shared.store(shared as u32, Ordering::Relaxed);
                    write_name(s, shown_name(scope).as_bytes());
                    s.reset_at.store(now(), Ordering::Relaxed);
                    s.ready.store(1, Ordering::Release);
                    return Some(i);
                }
                Err(winner) => {
                    if !shared {
                        h.scopes.fetch_sub(1, Ordering::Relaxed);
                    }
                    current = winner;
                }
            }
        }
        if current == key {
            // Taken by another backend for the same key an instant ago: its fields come next.
            while s.ready.load(Ordering::Acquire) == 0 {
                std::hint::spin_loop();
            }
            if s.db.load(Ordering::Relaxed) == db && (s.shared.load(Ordering::Relaxed) == 1) == shared {
                return Some(i);
            }
        }
    }
    None
}

/// The slot that counts `scope` of database `db`: its own, or the shared one of the database once
/// `max_scopes` scopes have one. The shared slots always find room (the table has `MAX_DATABASES`
/// slots beyond twice `max_scopes`); past that, the last slot (never reached in practice).
pub fn slot_of(db: u32, scope: &str) -> usize {
    own_slot(hash_of(db, scope, false), db, scope)
        .or_else(|| shared_slot(db))
        .unwrap_or(header().slots as usize - 1)
}

/// The slot of the scope whose key is `key`, taken (named `scope`) while fewer than `max_scopes` are.
pub(super) fn own_slot(key: u64, db: u32, scope: &str) -> Option<usize> {
    let h = header();
    find_or_take(key, db, scope, false, &|| {
        if h.scopes.fetch_add(1, Ordering::Relaxed) < h.max_scopes {
            return true;
        }
        h.scopes.fetch_sub(1, Ordering::Relaxed);
        false
    })
}

/// The slot shared by the scopes of `db` beyond `max_scopes`.
pub(super) fn shared_slot(db: u32) -> Option<usize> {
    find_or_take(hash_of(db, "", true), db, "", true, &|| true)
}

/// Adds a backend's counts to a slot.
pub fn add_all(i: usize, counts: &[u64; COUNTERS]) {
    let s = slot(i);
    for (total, &n) in s.counts.iter().zip(counts) {
        if n != 0 {
            total.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// One row of `idempotency.stats`.
pub struct ScopeRow {
    /// None for the slot shared by the scopes beyond `idempotency.stats_max_scopes`.
    pub scope: Option<String>,
    pub counts: [u64; COUNTERS],
    pub reset_at: i64,
}

/// The rows of database `db`, when attached.
pub fn rows(db: u32) -> Option<Vec<ScopeRow>> {
    if !attached() {
        return None;
    }
    let mut rows = Vec::new();
    for i in 0..header().slots as usize {
        let s = slot(i);
        if s.ready.load(Ordering::Acquire) == 0 || s.db.load(Ordering::Relaxed) != db {
            continue;
        }
        let shared = s.shared.load(Ordering::Relaxed) == 1;
        rows.push(ScopeRow {
            scope: (!shared).then(|| read_name(s)),
            counts: std::array::from_fn(|c| s.counts[c].load(Ordering::Relaxed)),
            reset_at: s.reset_at.load(Ordering::Relaxed),
        });
    }
    Some(rows)
}

/// Zeroes the counters of database `db` (one scope, or all of them with `scope` None, the shared row
/// included). Returns the time of the reset.
pub fn reset(db: u32, scope: Option<&str>) -> i64 {
    let at = now();
    if !attached() {
        return at;
    }
    // A scope's slot is found by its key, the hash of its full name (the slot keeps a cut name only);
    // the name a row shows is accepted too.
    let wanted = scope.map(|name| (hash_of(db, name, false), name));
    for i in 0..header().slots as usize {
        let s = slot(i);
        if s.ready.load(Ordering::Acquire) == 0 || s.db.load(Ordering::Relaxed) != db {
            continue;
        }
        let shared = s.shared.load(Ordering::Relaxed) == 1;
        if wanted.is_some_and(|(key, name)| {
            shared || (s.key.load(Ordering::Relaxed) != key && read_name(s) != name)
        }) {
            continue;
        }
        for c in &s.counts {
            c.store(0, Ordering::Relaxed);
        }
        s.reset_at.store(at, Ordering::Relaxed);
    }
    at
}
