//! `idem_distribute(colocate_with regclass)`: scale-out on Citus. Hand-written PL/pgSQL in
//! `sql/distribute.sql` (it only calls Citus' own `create_distributed_function` for each consumer
//! function and guards the coordinator's record table), included in the extension's script here.
pgrx::extension_sql_file!(
    "../../sql/distribute.sql",
    name = "distribute",
    requires = ["bootstrap", idempotency::delegated_functions]
);

#[pgrx::pg_schema]
mod idempotency {
    use pgrx::prelude::*;

    pgrx::extension_sql!(
        r#"
COMMENT ON FUNCTION idempotency.delegated_functions() IS
'The functions idem_distribute delegates to the Citus workers by their scope argument (regprocedure text), from the same table as the planner hook that guards them.';
"#,
        name = "delegated_functions_surface",
        requires = [delegated_functions]
    );

    /// The functions Citus delegates by scope, as signatures (`crate::citus::DELEGATED`).
    #[pg_extern(immutable, parallel_safe)]
    fn delegated_functions() -> SetOfIterator<'static, &'static str> {
        SetOfIterator::new(crate::citus::DELEGATED.iter().map(|(signature, _)| *signature))
    }
}
