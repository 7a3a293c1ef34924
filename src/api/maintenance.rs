//! `idem_maintenance()` and `idem_partman_handover()`: retention from SQL, for DBAs and tests.
use super::args;
use crate::errors;
use crate::gucs::{self, PartitionManager};
use crate::stats;
use crate::storage;
use pgrx::prelude::*;

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION idem_maintenance(timestamptz) IS
'One maintenance round as of as_of: premake partitions, drop those older than idempotency.retention, reclaim leases expired longer than idempotency.reclaim_after. What the background worker runs; call it from cron when the library cannot be preloaded.';
"#,
    name = "idem_maintenance_surface",
    requires = [idem_maintenance]
);

/// One maintenance round as of `as_of` (a future `as_of` ages the data without waiting).
/// Waits for a round already running on this database (the worker's, say) to finish first.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn idem_maintenance(
    as_of: default!(Option<TimestampWithTimeZone>, "now()"),
) -> TableIterator<
    'static,
    (
        name!(partitions_created, i32),
        name!(partitions_dropped, i32),
        name!(partitions_deferred, i32),
        name!(leases_reclaimed, i64),
    ),
> {
    args::writable("idem_maintenance");
    let as_of = as_of.unwrap_or_else(|| errors::null_argument("as_of"));
    let r = stats::rounds::observe(|| storage::maintenance_round(as_of.into_inner(), true), |r| r.error())
        .expect("waited for the maintenance lock");
    TableIterator::once((r.created, r.dropped, r.deferred, r.reclaimed))
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION idem_partman_handover() IS
'Registers idempotency.records with pg_partman (create_parent, retention and premake from the GUCs). Set idempotency.partition_manager = pg_partman first.';
"#,
    name = "idem_partman_handover_surface",
    requires = [idem_partman_handover]
);

/// Registers `idempotency.records` with pg_partman (4.x or 5.x), so that its `run_maintenance()`
/// premakes and drops partitions from now on, with the premake and retention of the GUCs.
/// Requires `idempotency.partition_manager = 'pg_partman'` first, so nobody else manages them.
/// Calling it again only refreshes retention and premake. (No pinned search_path here:
/// pg_partman sets and restores search_path itself, and every name it is given is qualified.)
#[pg_extern(volatile, parallel_unsafe)]
fn idem_partman_handover() -> String {
    args::writable("idem_partman_handover");
    if gucs::partition_manager() != PartitionManager::PgPartman {
        errors::wrong_partition_manager();
    }
    storage::partman_handover()
}
