//! Storage: the record table behind the API: new rows inserted with the access methods, other
//! writes through SPI with saved plans, reads by direct index probes. Only the operations re-exported here are visible to the rest of the crate.
//!
//! - `decide`: what a call does to one key (pure, unit-tested); `records`: reads and writes keys;
//!   `admin`: redrive and forget keys by hand; `deferred`: a new key's claim written once, when its fate is known;
//! - `offsets`: broker positions; `maintenance`: one retention round; `partitions`: time
//!   partitions and their indexes; `partman`: the handover to pg_partman;
//! - `probe`: index lookups without the executor; `direct`: row inserts without it; `spi`: saved plans; `owner`: running as the table's owner;
//!   `filters`: sealed partitions and their membership filters; `keylock`: the per-key lock; `catalog`: cached catalog facts; `xact`: transaction facts;
//!   `document`: jsonb payloads passed through.
mod admin;
mod bounds;
mod catalog;
mod decide;
mod deferred;
mod direct;
mod document;
mod filters;
mod grants;
mod keylock;
mod maintenance;
mod offsets;
mod owner;
mod partitions;
mod partman;
mod probe;
mod records;
mod settings;
mod spi;
mod xact;

pub use admin::{forget, redrive, redrive_scope};
pub use bounds::range_of_bound;
pub use settings::pin_session as pin_session_settings;
pub use document::{Document, Documents};
pub use maintenance::{reclaim_more, round as maintenance_round, RECLAIM_PER_ROUND};
pub use offsets::{
    list as list_offsets, next as next_offset, record as record_offset, reset as reset_offset, Position,
};
pub use filters::seal_partition;
pub use grants::{allowed as grant_allows, changed as grants_changed, Kind as GrantKind};
pub use partitions::premake as premake_partitions;
pub use partman::handover as partman_handover;
pub use records::{
    claim, claim_batch, complete, complete_batch, fail, heartbeat, once, once_batch, status, Key,
};
pub use xact::start_time as transaction_start;

/// Process start: the relcache callback that keeps the cached catalog facts true.
pub fn init() {
    deferred::init();
    grants::init();
    catalog::init(&[
        probe::forget_layouts,
        direct::forget_layouts,
        partitions::forget_coverage,
        filters::forget,
        grants::forget,
    ]);
}
