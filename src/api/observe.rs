//! Statistics and health from SQL: the counters behind `idempotency.stats` and `idem_stats()`, their
//! reset, and the maintenance state `idem_metrics()` reports (`sql/observe.sql` builds the views and
//! `idem_metrics()` on these).
use crate::stats::{self, database, COUNTERS};
use pgrx::prelude::*;

pgrx::extension_sql_file!(
    "../../sql/observe.sql",
    name = "observe",
    requires = ["bootstrap", "partitions", idempotency::scope_stats, idempotency::stats_totals, idempotency::maintenance_state]
);

type Ts = TimestampWithTimeZone;

fn ts(value: i64) -> Option<Ts> {
    (value != 0).then(|| Ts::try_from(value).expect("valid timestamp"))
}

fn counts(c: &[u64; COUNTERS]) -> Vec<i64> {
    c.iter().map(|&n| n.min(i64::MAX as u64) as i64).collect()
}

/// The counters of each scope of this database, in the order of [`stats::Counter`]; no row, and a
/// NOTICE, without the library preloaded.
fn scope_rows() -> Vec<stats::ScopeRow> {
    match stats::rows(database()) {
        Some(rows) => rows,
        None => {
            notice_not_preloaded();
            Vec::new()
        }
    }
}

fn notice_not_preloaded() {
    notice!(
        "idempotency statistics need the library preloaded: shared_preload_libraries = 'idempotency', then a restart"
    );
}

#[pg_schema]
mod idempotency {
    use super::*;

    pgrx::extension_sql_file!(
        "../../sql/surface/scope_stats.sql",
        name = "scope_stats_surface",
        requires = [scope_stats]
    );

    /// The counters of each scope of this database (see `idempotency.stats`).
    #[pg_extern(volatile, parallel_safe)]
    fn scope_stats() -> TableIterator<
        'static,
        (name!(scope, Option<String>), name!(counts, Vec<i64>), name!(stats_reset, Option<Ts>)),
    > {
        TableIterator::new(scope_rows().into_iter().map(|r| (r.scope, counts(&r.counts), ts(r.reset_at))))
    }

    pgrx::extension_sql_file!(
        "../../sql/surface/maintenance_state.sql",
        name = "maintenance_state_surface",
        requires = [maintenance_state]
    );

    /// The current database's maintenance rounds since the server started (none before the first,
    /// or without the library preloaded).
    #[pg_extern(volatile, parallel_safe)]
    fn maintenance_state() -> TableIterator<
        'static,
        (
            name!(last_round_at, Option<Ts>),
            name!(last_round_micros, i64),
            name!(rounds, i64),
            name!(failed_rounds, i64),
            name!(last_error, Option<String>),
            name!(last_error_at, Option<Ts>),
        ),
    > {
        TableIterator::new(stats::rounds::current().map(|s| {
            (
                ts(s.finished_at).or(ts(s.started_at)),
                s.duration_us,
                s.rounds as i64,
                s.failed as i64,
                s.last_error(),
                ts(s.error_at),
            )
        }))
    }

    pgrx::extension_sql_file!(
        "../../sql/surface/stats_totals.sql",
        name = "stats_totals_surface",
        requires = [stats_totals]
    );

    /// The totals over all scopes of this database: the counters in the order of [`stats::Counter`], how
    /// many scopes, whether counting is on, and the oldest reset.
    #[pg_extern(volatile, parallel_safe)]
    fn stats_totals() -> TableIterator<
        'static,
        (name!(counts, Vec<i64>), name!(scopes, i64), name!(enabled, bool), name!(stats_reset, Option<Ts>)),
    > {
        let rows = stats::rows(database()).unwrap_or_default();
        let mut total = [0u64; COUNTERS];
        for r in &rows {
            for (t, n) in total.iter_mut().zip(r.counts) {
                *t = t.saturating_add(n);
            }
        }
        let oldest = rows.iter().map(|r| r.reset_at).filter(|&t| t != 0).min().unwrap_or(0);
        TableIterator::once((counts(&total), rows.len() as i64, stats::enabled(), ts(oldest)))
    }
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_stats_reset.sql",
    name = "idem_stats_reset_surface",
    requires = [idem_stats_reset]
);

/// Zeroes the counters of one scope, or of every scope of this database; returns the reset's time.
/// Without the library preloaded there is nothing to reset: a NOTICE says so, as the view does.
#[pg_extern(volatile, parallel_unsafe)]
fn idem_stats_reset(scope: default!(Option<&str>, "NULL")) -> Ts {
    if !stats::preloaded() {
        notice_not_preloaded();
    }
    Ts::try_from(stats::reset(database(), scope)).expect("valid timestamp")
}
