//! The PostgreSQL plumbing under the storage: everything that talks to PostgreSQL's internals, and the
//! only place with calls that differ between PostgreSQL versions (each written once, in `compat`).
//! Nothing here knows what a claim is.
//!
//! - `spi`: saved statements run as the storage's owner (`owner`); `settings`: session settings pinned
//!   while the storage runs DDL or maintenance; `nojit`: those statements planned without JIT;
//! - `probe`: index lookups without the executor (`partition`: one partition open for them; `layout`:
//!   where a partition keeps what they read; `leaves`: the partitions they search; `tuple`: a record
//!   found); `latest`: reads under the latest snapshot that take no SERIALIZABLE predicate locks; `direct`:
//!   row inserts without the executor (`indexes`: the indexes they fill), behind `writer`, the one row writer;
//! - `catalog`: cached catalog facts and the invalidations that clear them; `bounds`: partition
//!   bounds read from the catalog;
//! - `keylock`: the per-key lock and the storage's other advisory locks; `holds`: keys held past the
//!   lock budget in a shared table instead (`heldtable`: that table); `unlocked`: whether some
//!   transaction's uncommitted rows stand in for key locks it gave back (when that table is full);
//!   `xact`: transaction facts;
//! - `document`: jsonb payloads passed through; `filter`: the membership filter's arithmetic;
//!   `sealed`: what a backend knows of the sealed partitions, and the reads of their filters;
//! - `compat`: the calls whose form differs between PostgreSQL 15, 16, 17 and 18.
pub mod bounds;
pub mod catalog;
pub mod compat;
pub mod direct;
pub mod document;
pub mod filter;
pub mod heldtable;
pub mod holds;
pub mod indexes;
pub mod keylock;
pub mod latest;
pub mod layout;
pub mod leaves;
pub mod nojit;
pub mod owner;
pub mod partition;
pub mod probe;
pub mod sealed;
pub mod settings;
pub mod spi;
pub mod tuple;
pub mod unguarded;
pub mod unlocked;
pub mod writer;
pub mod xact;
