//! One maintenance round: premake partitions, drop expired ones, seal past ones (see `filters`),
//! reclaim stuck leases.
//! Run by the background worker and by `idem_maintenance()`.
use super::filters;
use super::keylock;
use super::partitions;
use super::spi::{arg, ts_arg, Conn, Snap, Stmt};
use crate::gucs::{self, PartitionManager};
use pgrx::pg_sys;

/// At most this many stuck leases are reclaimed per round, so one round stays short.
const RECLAIM_PER_ROUND: i64 = 10_000;

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
    let conn = Conn::open();
    // Claims this transaction remembers get their rows first: a seal must see every key.
    super::deferred::write_all(&conn, None);
    let mut round = Round::default();
    if gucs::partition_manager() == PartitionManager::Builtin {
        round.created = partitions::create_missing(&conn, as_of);
        let dropped = partitions::drop_expired(&conn, as_of);
        round.dropped = dropped.dropped;
        round.deferred = dropped.deferred;
    }
    if gucs::partition_manager() == PartitionManager::PgPartman {
        partitions::index_missing(&conn);
    }
    // With `none` nobody premakes the partition that rows of a sealed one would move to.
    if gucs::partition_manager() != PartitionManager::None {
        let sealing = filters::seal_past(&conn, as_of);
        round.sealed = sealing.sealed;
        round.seal_deferred = sealing.deferred;
    }
    round.reclaimed = reclaim(&conn, as_of - gucs::reclaim_after().as_micros() as i64);
    Some(round)
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
        if keylock::lock_key(scope, key, false).is_none() {
            continue;
        }
        let rows = conn.run(
            &RECLAIM,
            &[arg(scope.as_str()), arg(key.as_str()), ts_arg(*created_at), cutoff],
            Snap::Statement,
        );
        reclaimed += rows.len() as i64;
    }
    reclaimed
}
