//! Partition upkeep callable from SQL, for CREATE EXTENSION and for DBAs.
use pgrx::prelude::*;

#[pg_schema]
mod idempotency {
    use crate::storage;
    use pgrx::prelude::*;

    /// Creates the partitions missing from `as_of`'s slot to `idempotency.premake` intervals ahead.
    #[pg_extern(volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn premake_partitions(as_of: default!(Option<TimestampWithTimeZone>, "now()")) -> i32 {
        crate::api::args::writable("idempotency.premake_partitions");
        let as_of = as_of.unwrap_or_else(|| crate::errors::null_argument("as_of"));
        storage::premake_partitions(as_of.into_inner())
    }

    /// Seals one partition now (maintenance seals past ones by itself); false if it was sealed.
    #[pg_extern(volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn seal_partition(part: Option<pg_sys::Oid>) -> bool {
        crate::api::args::writable("idempotency.seal_partition");
        let part = part.unwrap_or_else(|| crate::errors::null_argument("part"));
        storage::seal_partition(part)
    }
}
