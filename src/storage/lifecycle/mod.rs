//! The record table's life over time: `partitions` made ahead and found for new rows, past ones
//! sealed (`sealing`), old ones dropped and stuck leases reclaimed by a `maintenance` round, or the
//! partitions handed over to pg_partman (`partman`).
pub mod maintenance;
pub mod partitions;
pub mod partman;
pub mod sealing;
