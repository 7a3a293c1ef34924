//! Storage: the record table behind the API, reached through SPI with saved plans.
pub mod document;
pub mod keylock;
pub mod maintenance;
pub mod offsets;
pub mod partitions;
pub mod records;
pub mod spi;
