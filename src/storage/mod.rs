//! Storage: the record table behind the API. Three floors, each using only those below it:
//!
//! - the domain, one module per verb: `record` (a key, its record), `call` (what every call does
//!   around its work), `claim`, `settle` (complete, fail, heartbeat), `once`, `batch`, `status`,
//!   `admin` (redrive and forget by hand), `offsets` (broker positions), `grants` (who may use which
//!   scope), `deferred` (a new key's claim written once, when its fate is known), and `decide` (what a
//!   call does to one key: pure, unit-tested);
//! - the `lifecycle` of the record table: partitions, sealing, maintenance rounds, pg_partman;
//! - the `pg` plumbing: SPI, probes, the row writer, the owner switch, the catalog, locks, transaction
//!   facts, documents, filter arithmetic and reads. Every PostgreSQL-version-specific call is there.
//!
//! Only what is re-exported here is visible to the rest of the crate.
mod admin;
mod batch;
mod call;
mod claim;
mod decide;
mod deferred;
mod grants;
mod lifecycle;
mod offsets;
mod once;
mod pg;
mod record;
mod settle;
mod status;

pub use admin::{forget, redrive, redrive_scope};
pub use batch::{claim_batch, complete_batch, once_batch};
pub use claim::claim;
pub use grants::{allowed as grant_allows, changed as grants_changed, Kind as GrantKind};
pub use lifecycle::maintenance::{reclaim_more, Round, RECLAIM_PER_ROUND};
pub use lifecycle::partitions::premake as premake_partitions;
pub use lifecycle::partman::handover as partman_handover;
pub use offsets::{
    list as list_offsets, next as next_offset, record as record_offset, reset as reset_offset, Position,
};
pub use once::once;
pub use pg::bounds::range_of_bound;
pub use pg::document::{Document, Documents};
pub use pg::settings::pin_session as pin_session_settings;
pub use pg::xact::start_time as transaction_start;
pub use record::Key;
pub use settle::{complete, fail, heartbeat};
pub use status::status;

/// Seals one partition now (`idempotency.seal_partition`); the claims this transaction remembers get
/// their rows first, since the seal must see every key. False if it was already sealed.
pub fn seal_partition(partition: pgrx::pg_sys::Oid) -> bool {
    call::with_all_claims_written(|| lifecycle::sealing::seal_partition(partition))
}

/// One maintenance round as of `as_of` (see `lifecycle::maintenance`); the claims this transaction
/// remembers get their rows first, since a seal must see every key. None when another session holds
/// this database's maintenance lock (and `wait` is false).
pub fn maintenance_round(as_of: pgrx::pg_sys::TimestampTz, wait: bool) -> Option<Round> {
    call::with_all_claims_written(|| lifecycle::maintenance::round(as_of, wait))
}

/// Process start: the callbacks that write remembered claims, and those that keep the cached catalog
/// facts true.
pub fn init() {
    pg::unlocked::init();
    pg::holds::init();
    pg::keylock::init();
    deferred::init();
    pg::nojit::init();
    grants::init();
    pg::catalog::init(&[
        pg::layout::forget_layouts,
        pg::leaves::forget_walk,
        pg::direct::forget_layouts,
        pg::indexes::forget,
        lifecycle::partitions::forget_coverage,
        pg::sealed::forget,
        grants::forget,
    ]);
}
