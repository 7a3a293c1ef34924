//! `idem_record_offset`, `idem_next_offset`, `idem_offsets`, `idem_reset_offset`.
use super::args;
use crate::errors;
use crate::storage::{self, Position};
use pgrx::prelude::*;

fn position<'a>(group: Option<&'a str>, topic: Option<&'a str>, partition: Option<i32>) -> Position<'a> {
    let group = args::group(group);
    let topic = args::ident("topic", topic);
    let partition = args::required("partition", partition);
    if partition < 0 {
        errors::invalid(format!("partition must not be negative, got {partition}"));
    }
    Position { group, topic, partition }
}

fn non_negative(name: &str, value: Option<i64>) -> Option<i64> {
    if let Some(v) = value {
        if v < 0 {
            errors::invalid(format!("{name} must not be negative, got {v}"));
        }
    }
    value
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_record_offset.sql",
    name = "idem_record_offset_surface",
    requires = [idem_record_offset]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_record_offset(
    consumer_group: Option<&str>,
    topic: Option<&str>,
    partition: Option<i32>,
    processed_offset: Option<i64>,
    generation: default!(Option<i64>, "NULL"),
) -> bool {
    args::writable("idem_record_offset");
    let p = position(consumer_group, topic, partition);
    let processed = args::required("processed_offset", non_negative("processed_offset", processed_offset));
    let generation = non_negative("generation", generation);
    storage::record_offset(p, processed, generation)
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_next_offset.sql",
    name = "idem_next_offset_surface",
    requires = [idem_next_offset]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_next_offset(
    consumer_group: Option<&str>,
    topic: Option<&str>,
    partition: Option<i32>,
) -> Option<i64> {
    storage::next_offset(position(consumer_group, topic, partition))
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_offsets.sql",
    name = "idem_offsets_surface",
    requires = [idem_offsets]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_offsets(
    consumer_group: Option<&str>,
    topic: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(topic, String),
        name!(partition, i32),
        name!(next_offset, i64),
        name!(generation, Option<i64>),
        name!(updated_at, TimestampWithTimeZone),
    ),
> {
    let group = args::group(consumer_group);
    let topic = topic.map(|t| args::ident("topic", Some(t)));
    TableIterator::new(storage::list_offsets(group, topic).into_iter().map(|o| {
        (
            o.topic,
            o.partition,
            o.next_offset,
            o.generation,
            TimestampWithTimeZone::try_from(o.updated_at).expect("valid timestamp"),
        )
    }))
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_reset_offset.sql",
    name = "idem_reset_offset_surface",
    requires = [idem_reset_offset]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_reset_offset(
    consumer_group: Option<&str>,
    topic: Option<&str>,
    partition: Option<i32>,
    next_offset: Option<i64>,
    generation: default!(Option<i64>, "NULL"),
) {
    args::writable("idem_reset_offset");
    let p = position(consumer_group, topic, partition);
    let next = args::required("next_offset", non_negative("next_offset", next_offset));
    // NULL keeps the stored generation; a value replaces it, lower or higher (a zombie's huge
    // generation is undone here).
    let generation = non_negative("generation", generation);
    storage::reset_offset(p, next, generation);
}
