//! One maintenance round: premake partitions, drop expired ones, seal past ones (see `sealing`),
//! reclaim stuck leases.
//! Run by the background worker and by `idem_maintenance()`.
use super::sealing;
use crate::storage::pg::keylock;
use crate::storage::pg::probe::{Probe, Prober};
use super::partitions;
use crate::storage::pg::settings::Pinned;
use crate::storage::pg::xact;
use crate::storage::pg::spi::{arg, ts_arg, Conn, Snap, Stmt};
use crate::gucs::{self, PartitionManager};
use pgrx::pg_sys;

/// At most this many stuck leases are reclaimed per round (a round's transaction keeps at most
/// `keylock::budget` of their locks; see `KeyLock::written`). The worker runs more rounds of reclaim while
/// a round reclaims this many.
pub const RECLAIM_PER_ROUND: i64 = 1_000;

static STUCK_LEASES: Stmt = Stmt {
    sql: "SELECT scope, key, created_at FROM idempotency.records
           WHERE status = 'pending' AND expires_at < $1 ORDER BY expires_at LIMIT $2",
    args: &[pg_sys::TIMESTAMPTZOID, pg_sys::INT8OID],
};
// Checked again under the key's lock: a claim may have taken the lease over meanwhile.
static RECLAIM: Stmt = Stmt {
    sql: "DELETE FROM idempotency.records
           WHERE scope = $1 AND key = $2 AND created_at = $3 AND status = 'pending' AND expires_at < $4",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TIMESTAMPTZOID],
};

#[derive(Default, Debug)]
pub struct Round {
    pub created: i32,
    pub dropped: i32,
    pub deferred: i32,
    pub reclaimed: i64,
    pub sealed: i32,
    pub seal_deferred: i32,
    /// The steps that failed (and were undone), as "step: message".
    pub errors: Vec<String>,
}

impl Round {
    pub fn did_something(&self) -> bool {
        self.created + self.dropped + self.deferred + self.sealed + self.seal_deferred > 0
            || self.reclaimed > 0
    }
}

/// Runs one round as of `as_of`. Returns None when `wait` is false and another round holds
/// this database's maintenance lock.
pub fn round(as_of: pg_sys::TimestampTz, wait: bool) -> Option<Round> {
    partitions::check_finite("as_of", as_of);
    if !keylock::lock_maintenance(wait) {
        return None;
    }
    let _pinned = Pinned::enter();
    let conn = Conn::open();
    let mut round = Round::default();
    // Each step in a subtransaction of its own: a step that fails (a seal over its budget, a drop
    // refused) is undone alone and reported, and the others still keep retention going.
    let manager = gucs::partition_manager();
    if manager == PartitionManager::Builtin {
        round.created = round.step("premake", || partitions::create_missing(&conn, as_of));
        let dropped = round.step("drop", || partitions::drop_expired(&conn, as_of));
        round.dropped = dropped.dropped;
        round.deferred = dropped.deferred;
        for message in dropped.failed {
            pgrx::warning!("idempotency maintenance: dropping {message}");
            round.errors.push(format!("drop {message}"));
        }
    }
    if manager == PartitionManager::PgPartman {
        round.step("index", || partitions::index_missing(&conn));
    }
    // With `none` nobody premakes the partition that rows of a sealed one would move to.
    if manager != PartitionManager::None {
        let sealing = round.step("seal", || sealing::seal_past(&conn, as_of));
        round.sealed = sealing.sealed;
        round.seal_deferred = sealing.deferred;
    }
    round.reclaimed = round.step("reclaim", || reclaim(&conn, as_of - gucs::reclaim_after().as_micros() as i64));
    Some(round)
}

impl Round {
    /// Runs one step of the round in a subtransaction of its own; a step that raised an ERROR was undone,
    /// counts as nothing done, and its message is kept in `errors` (and logged).
    fn step<T: Default>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        match xact::in_subtransaction(f) {
            Ok(done) => done,
            Err(message) => {
                pgrx::warning!("idempotency maintenance: the {name} step failed and was undone: {message}");
                self.errors.push(format!("{name}: {message}"));
                T::default()
            }
        }
    }

    /// The first failed step's error, for the round's record.
    pub fn error(&self) -> Option<String> {
        self.errors.first().cloned()
    }
}

/// One more batch of reclaim as of `as_of`, in the current transaction, for the worker while a round
/// reclaimed [`RECLAIM_PER_ROUND`] keys. None when another round holds the maintenance lock.
pub fn reclaim_more(as_of: pg_sys::TimestampTz) -> Option<i64> {
    if !keylock::lock_maintenance(false) {
        return None;
    }
    let _pinned = Pinned::enter();
    let conn = Conn::open();
    Some(reclaim(&conn, as_of - gucs::reclaim_after().as_micros() as i64))
}

/// Deletes keys whose lease expired before `cutoff` and that nobody took over. A key whose lock
/// is busy is being claimed right now: it is left alone.
fn reclaim(conn: &Conn, cutoff: pg_sys::TimestampTz) -> i64 {
    let cutoff = ts_arg(cutoff);
    let stuck: Vec<(String, String, pg_sys::TimestampTz)> = {
        let rows = conn.run(&STUCK_LEASES, &[cutoff, arg(RECLAIM_PER_ROUND)], Snap::Statement);
        (0..rows.len())
            .map(|i| {
                (
                    rows.get(i, 1).expect("scope"),
                    rows.get(i, 2).expect("key"),
                    rows.get_ts(i, 3).expect("created_at"),
                )
            })
            .collect()
    };
    let mut reclaimed = 0;
    for (scope, key, created_at) in &stuck {
        let Some(lock) = keylock::lock_key(scope, key, false) else {
            continue;
        };
        // A claim that took the lease over and gave the key's lock back (see `pg::holds`, `pg::unlocked`) is
        // writing the row: left alone too (the DELETE would wait for it, holding the key's lock that claim may want).
        let held = lock.held_elsewhere().is_some();
        if held || matches!(Prober::open(scope).find_settled(key, &lock, |_| ()), Probe::Busy(_)) {
            lock.give_back();
            continue;
        }
        let rows = conn.run(
            &RECLAIM,
            &[arg(scope.as_str()), arg(key.as_str()), ts_arg(*created_at), cutoff],
            Snap::Statement,
        );
        match rows.len() {
            0 => lock.release_if_only_read(),
            n => {
                reclaimed += n as i64;
                lock.written();
            }
        }
    }
    reclaimed
}
