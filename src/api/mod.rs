//! The SQL-facing functions. Each one checks its arguments (so bad input is rejected before
//! anything is written) and hands over to [`crate::storage`].
mod args;
mod keys;
mod partitions;
