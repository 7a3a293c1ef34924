//! Scope and consumer-group grants from SQL: the functions a DBA grants with live in `sql/grants.sql`;
//! here are the trigger that makes every backend read them again, and the check every scoped call makes.
use crate::errors;
use crate::storage::{self, GrantKind};
use pgrx::prelude::*;

pgrx::extension_sql_file!(
    "../../sql/grants.sql",
    name = "grants",
    requires = ["bootstrap", idempotency::scope_grants_changed]
);

/// Refuses (42501) a caller without a grant on `name` once grants of its kind are on.
pub fn authorize(kind: GrantKind, name: &str) {
    if !storage::grant_allows(kind, name) {
        errors::no_grant(kind.noun(), name);
    }
}

#[pg_schema]
mod idempotency {
    use pgrx::prelude::*;

    pgrx::extension_sql!(
        r#"
COMMENT ON FUNCTION idempotency.scope_grants_changed() IS
'Statement trigger of idempotency.scope_grants: every backend reads the grants again after the change commits.';
    "#,
        name = "scope_grants_changed_surface",
        requires = [scope_grants_changed]
    );

    /// Statement trigger of `idempotency.scope_grants`: every backend reads the grants again once the
    /// changing transaction commits.
    #[pg_trigger]
    fn scope_grants_changed<'a>(
        _trigger: &'a pgrx::PgTrigger<'a>,
    ) -> Result<Option<PgHeapTuple<'a, pgrx::AllocatedByPostgres>>, std::convert::Infallible> {
        crate::storage::grants_changed();
        Ok(None)
    }
}
