//! Cumulative statistics: what the `idem_*` calls answered, per database and scope.
//!
//! Counting must not show in a call's cost, so a call only adds to counters of its own backend
//! ([`count`]); they are published to shared memory ([`slots`]) once per transaction, when it ends
//! (committed, aborted or prepared: a consumer saw those answers either way). Without the library in
//! `shared_preload_libraries` there is no shared memory, and nothing is counted.
//!
//! The same shared memory keeps what the last maintenance rounds of each database did ([`rounds`]).
//!
//! The files, each importing only from files listed after it (this one only declares them and
//! re-exports what the rest of the crate uses):
//!
//! - [`shmem`]: `_PG_init`'s part, the shared-memory hooks that set the region up at server start;
//! - [`counting`]: a backend's counts, published at transaction end; whether counting is on;
//! - [`persist`]: the file the counters are saved to at a clean shutdown and read back from at start;
//! - [`rounds`]: what the maintenance rounds of each database did lately;
//! - [`slots`]: the lock-free table of counter slots, one per (database, scope);
//! - [`names`]: scope names as a slot keeps and shows them (cut, with a hash of the full name);
//! - [`region`]: the layout of the shared memory (header, rounds' state, slots), this process's
//!   pointer to it;
//! - [`hash`]: PostgreSQL's hash, and a slot's key made with it;
//! - [`backend`]: this backend's database and the clock;
//! - [`counters`]: the counters, in the order of every counter array.
mod backend;
mod counters;
mod counting;
mod hash;
mod names;
mod persist;
mod region;
pub mod rounds;
mod shmem;
mod slots;

pub use backend::database;
pub use counters::{Counter, COUNTERS};
pub use counting::{count, count_serialization_failures, enabled, lock_wait, preloaded, Tally};
pub use shmem::init;
pub use slots::{reset, rows, ScopeRow};
