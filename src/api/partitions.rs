//! Partition upkeep callable from SQL, for CREATE EXTENSION and for DBAs.
use pgrx::prelude::*;

pgrx::extension_sql_file!(
    "../../sql/partitions.sql",
    name = "partitions",
    requires = ["bootstrap", idempotency::partition_range]
);

#[pg_schema]
mod idempotency {
    use crate::storage;
    use pgrx::prelude::*;

    pgrx::extension_sql!(
        r#"
COMMENT ON FUNCTION idempotency.premake_partitions(timestamptz) IS
'Creates the missing partitions of idempotency.records from as_of to idempotency.premake intervals ahead; returns how many.';
    "#,
        name = "premake_partitions_surface",
        requires = [premake_partitions]
    );

    /// Creates the partitions missing from `as_of`'s slot to `idempotency.premake` intervals ahead.
    #[pg_extern(volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn premake_partitions(as_of: default!(Option<TimestampWithTimeZone>, "now()")) -> i32 {
        crate::api::args::writable("idempotency.premake_partitions");
        let as_of = as_of.unwrap_or_else(|| crate::errors::null_argument("as_of"));
        storage::premake_partitions(as_of.into_inner())
    }

    pgrx::extension_sql!(
        r#"
COMMENT ON FUNCTION idempotency.seal_partition(oid) IS
'Seals a partition of idempotency.records (an oid: pass ''idempotency.records_p...''::regclass) now and builds its membership filter (maintenance seals past partitions by itself). Waits for the partition''s writers within lock_timeout. Sealing the partition of the present moves new keys to the next one. False if it was sealed already.';
    "#,
        name = "seal_partition_surface",
        requires = [seal_partition]
    );

    /// Seals one partition now (maintenance seals past ones by itself); false if it was sealed.
    #[pg_extern(volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn seal_partition(part: Option<pg_sys::Oid>) -> bool {
        crate::api::args::writable("idempotency.seal_partition");
        let part = part.unwrap_or_else(|| crate::errors::null_argument("part"));
        storage::seal_partition(part)
    }

    pgrx::extension_sql!(
        r#"
GRANT EXECUTE ON FUNCTION idempotency.partition_range(text) TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.partition_range(text) IS
'The range [range_from, range_to) of a partition bound (pg_class.relpartbound as text), read from its node tree (no row for a default partition); what idempotency.partitions shows, unmoved by DateStyle or TimeZone.';
    "#,
        name = "partition_range_surface",
        requires = [partition_range]
    );

    /// The range of a partition bound (`pg_class.relpartbound` as text), read from its node tree
    /// (never through a timestamp's text, so no session setting moves it); no row for a default
    /// partition.
    #[pg_extern(immutable, strict, parallel_safe)]
    fn partition_range(
        bound: &str,
    ) -> TableIterator<'static, (name!(range_from, TimestampWithTimeZone), name!(range_to, TimestampWithTimeZone))>
    {
        let range = storage::range_of_bound(bound).map(|(from, to)| {
            // SAFETY: both values are the Datums of timestamptz constants PostgreSQL stored.
            unsafe { (TimestampWithTimeZone::from_datum(from.into(), false), TimestampWithTimeZone::from_datum(to.into(), false)) }
        });
        TableIterator::new(range.into_iter().filter_map(|(from, to)| Some((from?, to?))))
    }
}
