//! `idem_maintenance()` and `idem_partman_handover()`: retention from SQL, for DBAs and tests.
use super::args;
use crate::errors;
use crate::gucs::{self, PartitionManager};
use crate::storage::{maintenance, spi};
use pgrx::prelude::*;

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
    let r = maintenance::round(as_of.into_inner(), true).expect("waited for the maintenance lock");
    TableIterator::once((r.created, r.dropped, r.deferred, r.reclaimed))
}

static PARTMAN_SCHEMA: spi::Stmt = spi::Stmt {
    sql: "SELECT n.nspname::text FROM pg_catalog.pg_extension e
            JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
           WHERE e.extname = 'pg_partman'",
    args: &[],
};
static FIRST_PARTITION: spi::Stmt =
    spi::Stmt { sql: "SELECT min(range_from)::text FROM idempotency.partitions", args: &[] };

/// Registers `idempotency.records` with pg_partman 4.x, so that its `run_maintenance()`
/// premakes and drops partitions from now on, with the premake and retention of the GUCs.
/// Requires `idempotency.partition_manager = 'pg_partman'` first, so nobody else manages them.
/// Calling it again only refreshes retention and premake. (No pinned search_path here:
/// pg_partman sets and restores search_path itself, and every name below is qualified.)
#[pg_extern(volatile, parallel_unsafe)]
fn idem_partman_handover() -> String {
    args::writable("idem_partman_handover");
    if gucs::partition_manager() != PartitionManager::PgPartman {
        errors::wrong_partition_manager();
    }
    let conn = spi::Conn::open();
    let schema: Option<String> = {
        let rows = conn.run(&PARTMAN_SCHEMA, &[], spi::Snap::Statement);
        if rows.len() == 0 {
            None
        } else {
            rows.get(0, 1)
        }
    };
    let Some(schema) = schema else { errors::partman_missing() };
    let start: Option<String> = conn.run(&FIRST_PARTITION, &[], spi::Snap::Statement).get(0, 1);
    let schema = spi::quote_ident(&schema);
    let interval = format!("{} seconds", gucs::partition_interval_s());
    let start = start.map(|s| spi::quote_literal(&s)).unwrap_or_else(|| "NULL".into());
    let registered = conn
        .execute(&format!(
            "SELECT EXISTS (SELECT FROM {schema}.part_config WHERE parent_table = 'idempotency.records')"
        ))
        .get::<bool>(0, 1);
    if registered != Some(true) {
        conn.execute(&format!(
        "SELECT {schema}.create_parent(p_parent_table := 'idempotency.records', p_control := 'created_at',
                 p_type := 'native', p_interval := {interval}, p_premake := {premake},
                 p_start_partition := {start})",
        interval = spi::quote_literal(&interval),
        premake = gucs::premake(),
        ));
    }
    // pg_partman copies the template table's indexes to each partition it makes; the partitions
    // it made already (and its default partition) get them here.
    conn.execute(&format!(
        "SELECT idempotency.index_partition(template_table::regclass) FROM {schema}.part_config
          WHERE parent_table = 'idempotency.records' AND template_table IS NOT NULL"
    ));
    conn.execute(
        "SELECT idempotency.index_partition(relid) FROM pg_catalog.pg_partition_tree('idempotency.records')
          WHERE isleaf",
    );
    conn.execute(&format!(
        "UPDATE {schema}.part_config SET retention = {retention}, retention_keep_table = false,
                infinite_time_partitions = true, premake = {premake}
          WHERE parent_table = 'idempotency.records'",
        retention = spi::quote_literal(&format!("{} seconds", gucs::retention_s())),
        premake = gucs::premake(),
    ));
    format!("idempotency.records is now managed by {schema}.run_maintenance()")
}
