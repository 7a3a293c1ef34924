//! `idempotency`: transactional idempotency keys for at-least-once message consumers.
//!
//! The crate is split by concern:
//! - [`api`]: the SQL-facing functions (`idem_*`), argument checks and outcomes;
//! - [`storage`]: SPI access to the record table, per-key locks and time partitions;
//! - [`gucs`]: the `idempotency.*` settings;
//! - [`worker`]: the background worker that runs maintenance rounds;
//! - [`stats`]: cumulative counters per scope and the maintenance rounds' state, in shared memory;
//! - [`errors`]: the SQLSTATEs the API raises;
//! - [`citus`]: under Citus, a planner hook that refuses a NULL scope before Citus plans the call.
//!
//! Hand-written SQL (schema, tables, grants, comments) lives in `sql/`.
use pgrx::prelude::*;

mod api;
mod citus;
mod errors;
mod gucs;
mod stats;
mod storage;
mod tests;
mod worker;

pgrx::pg_module_magic!();

pgrx::extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
pgrx::extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    errors::init();
    gucs::init();
    stats::init();
    storage::init();
    worker::register();
    citus::init();
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
