//! The batch calls: `idem_claim_batch`, `idem_complete_batch` and `idem_once_batch`, one call per
//! broker poll. A batch locks its keys in sorted order (so two batches never deadlock on each other),
//! reads them with one prober, and writes its new keys' rows with the row writer.
use super::call::Call;
use super::claim::{claim_existing, count_answer, new_lease, Claim, Outcome};
use super::deferred;
use super::lifecycle::partitions;
use super::once::{once_answer, once_row};
use super::pg::document::Documents;
use super::pg::keylock::{self, KeyLock};
use super::pg::spi::{arg, Snap, Stmt};
use super::pg::writer;
use super::pg::xact;
use super::record::{check_visible, Key};
use super::settle::check_held;
use crate::stats::Counter;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};

static COMPLETE_MANY: Stmt = Stmt {
    sql: "UPDATE idempotency.records r
             SET status = 'completed', payload = u.p, updated_at = clock_timestamp(), expires_at = NULL
            FROM unnest($2::text[], $3::jsonb[]) AS u(k, p)
           WHERE r.scope = $1 AND r.key = u.k",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTARRAYOID, pg_sys::JSONBARRAYOID],
};

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

/// Claims several keys of one scope in one go. Returns one claim per input key, in input
/// order; a key repeated in the batch gets its first occurrence's answer, except that only the
/// first occurrence can be `claimed` (the repeats are `in_progress`).
pub fn claim_batch(scope: &str, keys: &[&str], ttl: Interval) -> Vec<Claim> {
    Call::run(scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let locks = lock_all(scope, keys);
        let distinct: Vec<&str> = locks.iter().map(|(key, _)| *key).collect();
        let mut found = call.lookup_many(scope, &distinct);
        let mut answers: HashMap<&str, Claim> = HashMap::with_capacity(distinct.len());
        let missing: Vec<&str> = distinct.iter().copied().filter(|key| !found.contains_key(*key)).collect();
        if !missing.is_empty() {
            // As a single claim: each new key's row is written once its fate is known (see `deferred`).
            let (partition, created_at) = partitions::insert_target(call.conn(), xact::start_time());
            for key in &missing {
                let (token, claimed_at, expires_at) = new_lease(ttl);
                deferred::defer(Key { scope, key }, token, None, partition, created_at, claimed_at, expires_at);
                answers.insert(key, Claim::claimed(Some(token), Some(1), Some(expires_at)));
            }
            call.add(Counter::ClaimedNew, missing.len() as u64);
        }
        for (key, lock) in locks {
            if let Some(rec) = found.remove(key) {
                answers.insert(key, claim_existing(call, Key { scope, key }, rec, ttl, None, Some(lock)));
            }
        }
        call.add(Counter::Claims, keys.len() as u64);
        let mut seen = HashSet::with_capacity(distinct.len());
        keys.iter()
            .map(|key| {
                let first = answers.get(key).expect("every key answered");
                let repeated = !seen.insert(*key);
                let claim = first.copy(repeated);
                if repeated {
                    count_answer(call, claim.outcome);
                }
                claim
            })
            .collect()
    })
}

/// Completes several claimed keys of one scope; every key must be held by the caller (see
/// [`check_held`]) or nothing is written. Returns how many were completed.
pub fn complete_batch(scope: &str, keys: &[&str], payloads: Option<&Documents>, tokens: &[Option<i64>]) -> i64 {
    Call::run(scope, |call| {
        // The batch this transaction claimed and has not written (the one-transaction loop): each key
        // written once, completed, as `idem_complete` does for a single claim.
        if keys.iter().zip(tokens).all(|(key, token)| deferred::unwritten(Key { scope, key }, *token)) {
            let payloads = payloads.map(|p| p.elements());
            for (i, key) in keys.iter().enumerate() {
                let payload = payloads.as_ref().and_then(|p| p[i].as_ref());
                let done = deferred::complete(call.conn(), Key { scope, key }, payload, tokens[i]);
                assert!(done, "an unwritten claim is completed");
            }
            call.add(Counter::Completes, keys.len() as u64);
            return keys.len() as i64;
        }
        lock_all(scope, keys);
        let mut found = call.lookup_many(scope, keys);
        for (key, token) in keys.iter().zip(tokens) {
            check_held(Key { scope, key }, found.remove(*key), *token);
        }
        let payloads = payloads.map(|p| p.datum());
        let done = call.conn().run(&COMPLETE_MANY, &[arg(scope), arg(keys.to_vec()), payloads], Snap::Statement).len();
        call.add(Counter::Completes, done as u64);
        done as i64
    })
}

/// The keys of a batch that no committed transaction has seen before, in input order, each once;
/// they are recorded as completed in the caller's transaction.
pub fn once_batch(scope: &str, keys: &[&str]) -> Vec<String> {
    Call::run(scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let locks = lock_all(scope, keys);
        // Opened after the locks: its snapshot must see what their previous holders committed.
        let mut prober = call.prober(scope);
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
            let (partition, created_at) = partitions::insert_target(call.conn(), xact::start_time());
            for key in &fresh {
                writer::insert(call.conn(), partition, &once_row(scope, key, created_at));
            }
        }
        if crate::stats::enabled() {
            count_once_answers(call, keys, &seen, fresh.len());
        }
        let fresh: HashSet<&str> = fresh.into_iter().collect();
        let mut emitted = HashSet::with_capacity(fresh.len());
        keys.iter().filter(|k| fresh.contains(*k) && emitted.insert(**k)).map(|k| k.to_string()).collect()
    })
}

fn count_once_answers(call: &mut Call, keys: &[&str], seen: &HashMap<&str, Outcome>, fresh: usize) {
    call.add(Counter::Claims, keys.len() as u64);
    // Each occurrence of a known key gets its record's answer; a new key is claimed by its first
        // occurrence, and its repeats in the batch are its duplicates.
    let mut firsts = HashSet::with_capacity(fresh);
    for key in keys {
        match seen.get(key) {
            Some(&answer) => count_answer(call, answer),
            None if firsts.insert(*key) => call.count(Counter::ClaimedNew),
            None => call.count(Counter::AnsweredCompleted),
        }
    }
}
