//! `idem_distribute(colocate_with regclass)`: scale-out on Citus. Hand-written PL/pgSQL in
//! `sql/distribute.sql` (it only calls Citus' own `create_distributed_function` for each consumer
//! function and guards the coordinator's record table), included in the extension's script here.
pgrx::extension_sql_file!("../../sql/distribute.sql", name = "distribute", requires = ["bootstrap"]);
