//! The handover of the record table to pg_partman 4.x or 5.x (`idem_partman_handover()`).
//!
//! pg_partman's `create_parent` takes `p_type := 'native'` in 4.x and `'range'` in 5.x; the rest of
//! what is used here (`part_config`'s retention, premake and template table) is the same in both.
//! Every partition needs the indexes of `idempotency.index_partition`: pg_partman 4.x copies the
//! template table's indexes to each partition it makes, 5.x only its unique ones, so maintenance
//! rounds index the partitions that lack them (see `partitions::index_missing`).
use super::partitions;
use crate::storage::pg::spi::{quote_ident, quote_literal, Conn, Snap, Stmt};
use crate::errors;
use crate::gucs;

/// pg_partman's schema and major version, when it is installed here.
static PARTMAN: Stmt = Stmt {
    sql: "SELECT n.nspname::text, split_part(e.extversion, '.', 1)::int FROM pg_catalog.pg_extension e
            JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
           WHERE e.extname = 'pg_partman'",
    args: &[],
};
static FIRST_PARTITION: Stmt =
    Stmt { sql: "SELECT min(range_from)::text FROM idempotency.partitions", args: &[] };

/// Registers the record table with pg_partman (or refreshes its retention and premake), gives the
/// template table and the existing partitions their indexes. Returns what it did, for the DBA.
pub fn handover() -> String {
    // The first partition's time travels to pg_partman as text: ISO and UTC, whatever the session's.
    let _pinned = crate::storage::pg::settings::Pinned::enter();
    let conn = Conn::open();
    let found = conn.run(&PARTMAN, &[], Snap::Statement);
    if found.len() == 0 {
        errors::partman_missing();
    }
    let schema: String = found.get(0, 1).expect("pg_partman's schema");
    let major: i32 = found.get(0, 2).expect("pg_partman's major version");
    let start: Option<String> = conn.run(&FIRST_PARTITION, &[], Snap::Statement).get(0, 1);
    let schema = quote_ident(&schema);
    let registered = conn
        .execute(&format!(
            "SELECT EXISTS (SELECT FROM {schema}.part_config WHERE parent_table = 'idempotency.records')"
        ))
        .get::<bool>(0, 1);
    if registered != Some(true) {
        conn.execute(&format!(
            "SELECT {schema}.create_parent(p_parent_table := 'idempotency.records', p_control := 'created_at',
                     p_type := {kind}, p_interval := {interval}, p_premake := {premake},
                     p_start_partition := {start})",
            kind = quote_literal(if major >= 5 { "range" } else { "native" }),
            interval = quote_literal(&format!("{} seconds", gucs::partition_interval().as_secs())),
            premake = gucs::premake(),
            start = start.map(|s| quote_literal(&s)).unwrap_or_else(|| "NULL".into()),
        ));
    }
    // The template table that pg_partman 4.x copies indexes from gets ours, and so do the
    // partitions pg_partman made already (and its default partition) that lack them.
    conn.execute(&format!(
        "SELECT idempotency.index_partition(template_table::regclass) FROM {schema}.part_config
          WHERE parent_table = 'idempotency.records' AND template_table IS NOT NULL"
    ));
    partitions::index_missing(&conn);
    conn.execute(&format!(
        "UPDATE {schema}.part_config SET retention = {retention}, retention_keep_table = false,
                infinite_time_partitions = true, premake = {premake}
          WHERE parent_table = 'idempotency.records'",
        retention = quote_literal(&format!("{} seconds", gucs::retention().as_secs())),
        premake = gucs::premake(),
    ));
    format!("idempotency.records is now managed by {schema}.run_maintenance()")
}
