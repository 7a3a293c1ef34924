//! The batch calls: `idem_claim_batch`, `idem_complete_batch` and `idem_once_batch`, one call per
//! broker poll. A batch locks its keys in sorted order (so two batches never deadlock on each other),
//! reads them with one prober, and writes its new keys' rows with the row writer; a batch larger than the
//! key locks its transaction may keep does so a group at a time (see `groups`).
use super::call::Call;
use super::claim::{claim_existing, count_answer, new_lease, Claim, Outcome};
use super::deferred;
use super::lifecycle::partitions;
use super::once::{once_answer, once_row};
use super::pg::document::Documents;
use super::pg::keylock;
use super::pg::spi::{arg, Snap, Stmt};
use super::pg::writer;
use super::pg::xact;
use super::record::{check_visible, Key, Record};
use super::settle::check_held;
use crate::stats::Counter;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};

// Rows this transaction wrote and still holds, by ctid (see `complete_own`), in their partition.
static COMPLETE_BY_CTID: Stmt = Stmt {
    sql: "/* planned per call */ UPDATE {partition} r
             SET status = 'completed', payload = u.p, updated_at = clock_timestamp(), expires_at = NULL
            FROM unnest($1::text[]::tid[], $2::jsonb[]) AS u(t, p)
           WHERE r.ctid = u.t",
    args: &[pg_sys::TEXTARRAYOID, pg_sys::JSONBARRAYOID],
};
static COMPLETE_MANY: Stmt = Stmt {
    sql: "/* planned per call */ UPDATE idempotency.records r
             SET status = 'completed', payload = u.p, updated_at = clock_timestamp(), expires_at = NULL
            FROM unnest($2::text[], $3::jsonb[]) AS u(k, p)
           WHERE r.scope = $1 AND r.key = u.k AND ($4::text[] IS NULL OR u.k = ANY ($4))",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTARRAYOID, pg_sys::JSONBARRAYOID, pg_sys::TEXTARRAYOID],
};

/// The distinct keys of a batch, sorted, in the groups it takes at a time, and whether each group's locks
/// are given back once its rows are written: one group kept until the transaction ends when the
/// transaction may keep that many key locks (see `keylock::budget`); else groups of what is left of the budget, so that a
/// batch of any size holds a bounded number of lock-table entries.
fn groups<'a>(keys: &[&'a str]) -> (Vec<Vec<&'a str>>, bool) {
    let mut distinct = keys.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if keylock::may_keep(distinct.len()) {
        return (vec![distinct], false);
    }
    let size = keylock::room();
    keylock::give_back_from_now_on();
    (distinct.chunks(size).map(<[&str]>::to_vec).collect(), true)
}

/// Claims several keys of one scope in one go. Returns one claim per input key, in input
/// order; a key repeated in the batch gets its first occurrence's answer, except that only the
/// first occurrence can be `claimed` (the repeats are `in_progress`).
pub fn claim_batch(scope: &str, keys: &[&str], ttl: Interval) -> Vec<Claim> {
    Call::run(scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let (groups, _) = groups(keys);
        let mut answers: HashMap<&str, Claim> = HashMap::with_capacity(keys.len());
        for group in &groups {
            let (locks, mut found) =
                call.lock_and_find_all(scope, group, |key, t| Record::from_tuple(t, Key { scope, key }));
            let missing = group.iter().filter(|key| !found.contains_key(*key)).count();
            // As a single claim: each new key's row is written once its fate is known (see `deferred`),
            // while the transaction keeps the locks.
            let target = (missing > 0).then(|| partitions::insert_target(call.conn(), xact::start_time()));
            for (key, lock) in locks {
                let k = Key { scope, key };
                let claim = match found.remove(key) {
                    Some(rec) => claim_existing(call, k, rec, ttl, None, Some(lock)),
                    None => {
                        let (partition, created_at) = target.expect("an insert target");
                        let (token, claimed_at, expires_at) = new_lease(ttl);
                        let remember = lock.may_defer();
                        deferred::claim_new(call.conn(), k, remember, token, None, partition, created_at, claimed_at, expires_at);
                        lock.written();
                        Claim::claimed(Some(token), Some(1), Some(expires_at))
                    }
                };
                answers.insert(key, claim);
            }
            call.add(Counter::ClaimedNew, missing as u64);
        }
        call.add(Counter::Claims, keys.len() as u64);
        let mut seen = HashSet::with_capacity(answers.len());
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
            deferred::complete_all(call.conn(), scope, keys, payloads.as_deref());
            call.add(Counter::Completes, keys.len() as u64);
            return keys.len() as i64;
        }
        let payloads = payloads.map(|p| p.datum());
        if keylock::giving_back() {
            if let Some(done) = complete_own(call, scope, keys, payloads, tokens) {
                return done;
            }
        }
        let (groups, give_back) = groups(keys);
        let mut done = 0;
        for group in &groups {
            let (locks, mut found) =
                call.lock_and_find_all(scope, group, |key, t| Record::from_tuple(t, Key { scope, key }));
            for (key, token) in keys.iter().zip(tokens).filter(|(key, _)| group.binary_search(key).is_ok()) {
                let rec = found.remove(*key);
                if rec.is_none() {
                    call.lock_absence(Key { scope, key });
                }
                check_held(Key { scope, key }, rec, *token);
            }
            // (An ERROR of a later group undoes what the earlier ones wrote, with the statement.)
            let only = give_back.then(|| arg(group.clone()));
            let args = [arg(scope), arg(keys.to_vec()), payloads, only.flatten()];
            done += call.conn().run(&COMPLETE_MANY, &args, Snap::Statement).len();
            for (_, lock) in locks {
                lock.written();
            }
        }
        call.add(Counter::Completes, done as u64);
        done as i64
    })
}

/// [`complete_batch`] of keys whose rows this transaction wrote (claims written at once, past the key locks
/// it may keep): no other transaction writes them until this one ends (see `pg::unlocked`), so they need
/// no lock. None (nothing done) when some key's row is not this transaction's.
fn complete_own(
    call: &mut Call,
    scope: &str,
    keys: &[&str],
    payloads: Option<pg_sys::Datum>,
    tokens: &[Option<i64>],
) -> Option<i64> {
    let mut prober = call.prober(scope);
    let mut found = Vec::with_capacity(keys.len());
    for key in keys {
        let rec = prober.find(key, |t| Record::from_tuple(t, Key { scope, key }))?;
        if !xact::wrote(rec.xmin) {
            return None;
        }
        found.push(rec);
    }
    drop(prober);
    let partition = found.first()?.partition;
    let same_partition = found.iter().all(|rec| rec.partition == partition);
    let ctids: Vec<String> = found.iter().map(Record::ctid_text).collect();
    for ((key, token), rec) in keys.iter().zip(tokens).zip(found) {
        check_held(Key { scope, key }, Some(rec), *token);
    }
    // The rows found, by ctid, in their one partition (a batch claimed now went to one); else by key.
    let done = match same_partition {
        true => call.conn().run_on(&COMPLETE_BY_CTID, partition, &[arg(ctids), payloads], Snap::Statement).len(),
        false => {
            let args = [arg(scope), arg(keys.to_vec()), payloads, None];
            call.conn().run(&COMPLETE_MANY, &args, Snap::Statement).len()
        }
    };
    call.add(Counter::Completes, done as u64);
    Some(done as i64)
}

/// The keys of a batch that no committed transaction has seen before, in input order, each once;
/// they are recorded as completed in the caller's transaction.
pub fn once_batch(scope: &str, keys: &[&str]) -> Vec<String> {
    Call::run(scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let (groups, _) = groups(keys);
        let mut fresh = HashSet::new();
        let mut seen = HashMap::new();
        for group in &groups {
            let (locks, found) = call.lock_and_find_all(scope, group, |_, t| once_answer(t));
            let mut new = Vec::new();
            for (key, lock) in locks {
                match found.get(key) {
                    Some(&(xmin, answer)) => {
                        check_visible(Key { scope, key }, xmin);
                        seen.insert(key, answer);
                        lock.release_if_only_read();
                    }
                    None => new.push((key, lock)),
                }
            }
            if !new.is_empty() {
                let (partition, created_at) = partitions::insert_target(call.conn(), xact::start_time());
                let rows: Vec<_> = new.iter().map(|(key, _)| once_row(scope, key, created_at)).collect();
                writer::insert_all(call.conn(), partition, &rows);
                for (key, lock) in new {
                    lock.written();
                    fresh.insert(key);
                }
            }
        }
        if crate::stats::enabled() {
            count_once_answers(call, keys, &seen, fresh.len());
        }
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
