//! Storage: the record table behind the API, written through SPI with saved plans and read by
//! direct index probes.
pub mod document;
pub mod keylock;
pub mod maintenance;
pub mod offsets;
pub mod partitions;
pub mod probe;
pub mod records;
pub mod spi;
