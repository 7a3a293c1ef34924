//! The SQL-facing functions. Each one checks its arguments (so bad input is rejected before
//! anything is written) and hands over to [`crate::storage`].
mod admin;
mod args;
mod batch;
mod derive;
mod distribute;
mod grants;
mod keys;
mod maintenance;
mod observe;
mod offsets;
mod partitions;
