//! The batch calls: `idem_claim_batch`, `idem_complete_batch` and `idem_once_batch`, one call per
//! broker poll. A batch locks its keys in sorted order (so two batches never deadlock on each other),
//! reads them with one prober, and writes its new keys' rows with the row writer; a batch larger than the
//! key locks its transaction may keep does so a group at a time (see `groups`).
use super::call::Call;
use super::claim::{claim_existing, count_answer, new_lease, Claim, Outcome};
use super::deferred;
use super::lifecycle::partitions;
use super::once::{once_answer, once_row};
use super::pg::document::{Document, Documents};
use super::pg::keylock;
use super::pg::spi::{arg, Snap, Stmt};
use super::pg::writer;
use super::pg::xact;
use super::record::{check_visible, expect_rows, Key, Record};
use super::settle::check_held;
use crate::stats::Counter;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ops::Range;

// Rows this transaction holds, by ctid, in their partition (see `complete_rows`).
static COMPLETE_BY_CTID: Stmt = Stmt {
    sql: "/* planned per call */ UPDATE {partition} r
             SET status = 'completed', payload = u.p, updated_at = clock_timestamp(), expires_at = NULL
            FROM unnest($1::text[]::tid[], $2::jsonb[]) AS u(t, p)
           WHERE r.ctid = u.t",
    args: &[pg_sys::TEXTARRAYOID, pg_sys::JSONBARRAYOID],
};

/// The keys of a batch: the distinct ones, sorted, and the place of each input key among them, by which a
/// batch keeps what it learns of each key (no key is hashed for that).
struct Distinct<'a> {
    keys: Vec<&'a str>,
    place: Vec<usize>,
}

fn distinct<'a>(keys: &[&'a str]) -> Distinct<'a> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_unstable_by_key(|&i| keys[i]);
    let mut distinct = Distinct { keys: Vec::with_capacity(keys.len()), place: vec![0; keys.len()] };
    for i in order {
        if distinct.keys.last() != Some(&keys[i]) {
            distinct.keys.push(keys[i]);
        }
        distinct.place[i] = distinct.keys.len() - 1;
    }
    distinct
}

/// The groups of a batch's distinct keys it takes at a time (ranges of `distinct`): one group, its locks kept
/// until the transaction ends, when the transaction may keep that many key locks (see `keylock::budget`); else
/// groups of what is left of the budget, each giving its locks back once its rows are written
/// (`keylock::give_back_from_now_on`), so that a batch of any size holds a bounded number of lock-table entries.
fn groups(distinct: &[&str]) -> Vec<Range<usize>> {
    if keylock::may_keep(distinct.len()) {
        return vec![Range { start: 0, end: distinct.len() }];
    }
    let size = keylock::room();
    keylock::give_back_from_now_on();
    (0..distinct.len()).step_by(size).map(|at| at..distinct.len().min(at + size)).collect()
}

/// Claims several keys of one scope in one go. Returns one claim per input key, in input
/// order; a key repeated in the batch gets its first occurrence's answer, except that only the
/// first occurrence can be `claimed` (the repeats are `in_progress`).
pub fn claim_batch(scope: &str, keys: &[&str], ttl: Interval) -> Vec<Claim> {
    Call::run(scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let batch = distinct(keys);
        let groups = groups(&batch.keys);
        // Each distinct key's answer, in their order.
        let mut answers: Vec<Claim> = Vec::with_capacity(batch.keys.len());
        for group in groups {
            let (locks, found) =
                call.lock_and_find_all(scope, &batch.keys[group], |key, t| Record::from_tuple(t, Key { scope, key }));
            let missing = found.iter().filter(|rec| rec.is_none()).count();
            // As a single claim: each new key's row is written once its fate is known (see `deferred`),
            // while the transaction keeps the locks.
            let target = (missing > 0).then(|| partitions::insert_target(call.conn(), xact::start_time()));
            for ((key, lock), rec) in locks.into_iter().zip(found) {
                let k = Key { scope, key };
                let claim = match rec {
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
                answers.push(claim);
            }
            call.add(Counter::ClaimedNew, missing as u64);
        }
        call.add(Counter::Claims, keys.len() as u64);
        let mut seen = vec![false; answers.len()];
        batch.place
            .iter()
            .map(|&at| {
                let first = &answers[at];
                let repeated = std::mem::replace(&mut seen[at], true);
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
        if keylock::giving_back() {
            if let Some(done) = complete_own(call, scope, keys, payloads, tokens) {
                return done;
            }
        }
        let batch = distinct(keys);
        let groups = groups(&batch.keys);
        // The input keys in the order of their places (one each: the call refuses repeats), so that each
        // group's keys are the next run of them: work linear in the batch, however many groups it takes.
        let mut by_place: Vec<usize> = (0..keys.len()).collect();
        by_place.sort_unstable_by_key(|&i| (batch.place[i], i));
        let mut payloads = Payloads { whole: payloads, elements: None };
        let mut done = 0;
        let mut next = 0;
        for group in groups {
            let (locks, mut found) =
                call.lock_and_find_all(scope, &batch.keys[group.clone()], |key, t| Record::from_tuple(t, Key { scope, key }));
            let run = by_place[next..].iter().take_while(|&&i| batch.place[i] < group.end).count();
            let mut rows = Vec::with_capacity(run);
            for &i in &by_place[next..next + run] {
                let key = keys[i];
                // (A key's second occurrence would find nothing left: its first took the record.)
                let rec = found[batch.place[i] - group.start].take();
                if rec.is_none() {
                    call.lock_absence(Key { scope, key });
                }
                let rec = check_held(Key { scope, key }, rec, tokens[i]);
                rows.push((rec.partition, rec.ctid_text(), i));
            }
            next += run;
            // (An ERROR of a later group undoes what the earlier ones wrote, with the statement.)
            done += complete_rows(call, rows, &mut payloads);
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
    payloads: Option<&Documents>,
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
    let mut rows = Vec::with_capacity(keys.len());
    for (i, rec) in found.into_iter().enumerate() {
        let rec = check_held(Key { scope, key: keys[i] }, Some(rec), tokens[i]);
        rows.push((rec.partition, rec.ctid_text(), i));
    }
    let done = complete_rows(call, rows, &mut Payloads { whole: payloads, elements: None });
    call.add(Counter::Completes, done as u64);
    Some(done as i64)
}

/// A batch's payloads: the argument as it came, and its elements once a part of it is needed (split once a call).
struct Payloads<'a> {
    whole: Option<&'a Documents>,
    elements: Option<Vec<Option<Document>>>,
}

impl Payloads<'_> {
    /// The payloads at input positions `at`: the argument itself when that is all of it, in order.
    fn at(&mut self, at: &[usize]) -> Option<pg_sys::Datum> {
        let whole = self.whole?;
        if at.len() == whole.len() && at.iter().enumerate().all(|(n, &i)| n == i) {
            return Some(whole.datum());
        }
        let elements = self.elements.get_or_insert_with(|| whole.elements());
        arg(at.iter().map(|&i| elements[i]).collect::<Vec<_>>())
    }
}

/// Completes held rows, each `(partition, ctid, input position)`, by their ctids, one statement per partition
/// (a batch's claims usually went to one), each row with the payload at its input position. Returns how many:
/// all of them, as `idem_complete` expects of its one row (the keys' locks keep every other writer out).
fn complete_rows(call: &mut Call, mut rows: Vec<(pg_sys::Oid, String, usize)>, payloads: &mut Payloads) -> usize {
    rows.sort_unstable_by_key(|&(partition, _, i)| (partition.to_u32(), i));
    let mut done = 0;
    for run in rows.chunk_by(|a, b| a.0 == b.0) {
        let ctids: Vec<&str> = run.iter().map(|(_, ctid, _)| ctid.as_str()).collect();
        let at: Vec<usize> = run.iter().map(|&(_, _, i)| i).collect();
        let args = [arg(ctids), payloads.at(&at)];
        let rows = call.conn().run_on(&COMPLETE_BY_CTID, run[0].0, &args, Snap::Statement);
        expect_rows(&rows, run.len(), "idem_complete_batch");
        done += run.len();
    }
    done
}

/// The keys of a batch that no committed transaction has seen before, in input order, each once;
/// they are recorded as completed in the caller's transaction.
pub fn once_batch(scope: &str, keys: &[&str]) -> Vec<String> {
    Call::run(scope, |call| {
        partitions::ensure_covered(call.conn(), xact::start_time());
        let batch = distinct(keys);
        let groups = groups(&batch.keys);
        // Each distinct key's answer when it was seen before, and whether it is new here.
        let mut seen: Vec<Option<Outcome>> = vec![None; batch.keys.len()];
        let mut fresh = vec![false; batch.keys.len()];
        for group in groups {
            let (locks, found) = call.lock_and_find_all(scope, &batch.keys[group.clone()], |_, t| once_answer(t));
            let mut new = Vec::new();
            for (((key, lock), found), at) in locks.into_iter().zip(found).zip(group) {
                match found {
                    Some((xmin, answer)) => {
                        check_visible(Key { scope, key }, xmin);
                        seen[at] = Some(answer);
                        lock.release_if_only_read();
                    }
                    None => new.push((at, key, lock)),
                }
            }
            if !new.is_empty() {
                let (partition, created_at) = partitions::insert_target(call.conn(), xact::start_time());
                let rows: Vec<_> = new.iter().map(|(_, key, _)| once_row(scope, key, created_at)).collect();
                writer::insert_all(call.conn(), partition, &rows);
                for (at, _, lock) in new {
                    lock.written();
                    fresh[at] = true;
                }
            }
        }
        if crate::stats::enabled() {
            count_once_answers(call, &batch.place, &seen);
        }
        // Each new key once, at its first occurrence.
        let input = keys.iter().zip(&batch.place);
        input.filter(|(_, &at)| std::mem::take(&mut fresh[at])).map(|(k, _)| k.to_string()).collect()
    })
}

/// Counts the answers of a batch's keys, by their places among its distinct keys, and what each distinct
/// key was seen as before (None: new).
fn count_once_answers(call: &mut Call, place: &[usize], seen: &[Option<Outcome>]) {
    call.add(Counter::Claims, place.len() as u64);
    // Each occurrence of a known key gets its record's answer; a new key is claimed by its first
    // occurrence, and its repeats in the batch are its duplicates.
    let mut first = vec![true; seen.len()];
    for &at in place {
        match seen[at] {
            Some(answer) => count_answer(call, answer),
            None if std::mem::take(&mut first[at]) => call.count(Counter::ClaimedNew),
            None => call.count(Counter::AnsweredCompleted),
        }
    }
}
