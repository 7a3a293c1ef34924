//! `idem_redrive`, `idem_redrive_scope`, `idem_forget`: keys by hand, for `idempotency_admin`.
use super::args;
use crate::errors;
use crate::gucs;
use crate::storage;
use pgrx::prelude::*;

pgrx::extension_sql_file!(
    "../../sql/surface/idem_redrive.sql",
    name = "idem_redrive_surface",
    requires = [idem_redrive]
);

/// Makes a terminally failed key claimable again (its next claim is attempt 1); false when the key is
/// not failed. P0002 for an unknown key.
#[pg_extern(volatile, parallel_unsafe)]
fn idem_redrive(key: Option<&str>, scope: default!(Option<&str>, "'default'")) -> bool {
    args::writable("idem_redrive");
    storage::redrive(args::key(key, scope))
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_redrive_scope.sql",
    name = "idem_redrive_scope_surface",
    requires = [idem_redrive_scope]
);

/// Redrives up to `max_keys` failed keys of a scope, those failed since `failed_since` when given;
/// returns how many. Call again until it returns 0.
#[pg_extern(volatile, parallel_unsafe)]
fn idem_redrive_scope(
    scope: Option<&str>,
    failed_since: default!(Option<TimestampWithTimeZone>, "NULL"),
    max_keys: default!(Option<i32>, "1000"),
) -> i64 {
    args::writable("idem_redrive_scope");
    let scope = args::ident("scope", scope);
    let max_keys = args::required("max_keys", max_keys);
    if max_keys < 1 {
        errors::invalid(format!("max_keys must be at least 1, not {max_keys}"));
    }
    if max_keys as usize > gucs::max_batch_keys() {
        errors::too_many_keys(max_keys as usize, gucs::max_batch_keys());
    }
    storage::redrive_scope(scope, failed_since.map(|t| t.into_inner()), max_keys)
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_forget.sql",
    name = "idem_forget_surface",
    requires = [idem_forget]
);

/// Removes a key's record, whatever its state (a lease holder then gets P0002); false when unknown.
#[pg_extern(volatile, parallel_unsafe)]
fn idem_forget(key: Option<&str>, scope: default!(Option<&str>, "'default'")) -> bool {
    args::writable("idem_forget");
    storage::forget(args::key(key, scope))
}
