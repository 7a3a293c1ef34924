//! `idem_claim_batch`, `idem_complete_batch`, `idem_once_batch`: one call per broker poll.
//!
//! Keys are locked in sorted order, so two consumers with overlapping batches cannot deadlock.
//! Every key lock is one entry in PostgreSQL's shared lock table: batches of thousands of keys
//! across many consumers may need a larger `max_locks_per_transaction`.
use super::args;
use crate::errors;
use crate::gucs;
use crate::storage::{self, Document, Documents};
use pgrx::prelude::*;

/// Checks every key of a batch before anything is written. The count is read from the array's header
/// before a single element is converted: an oversized array is refused without allocating for it.
fn keys<'b, 'a: 'b>(keys: &'b Option<Array<'a, &'a str>>) -> Vec<&'b str> {
    let keys = args::required("keys", keys.as_ref());
    let limit = gucs::max_batch_keys();
    if keys.len() > limit {
        errors::too_many_keys(keys.len(), limit);
    }
    keys.iter().map(|k| args::ident("key", k)).collect()
}

fn same_length(name: &str, len: usize, keys: usize) {
    if len != keys {
        errors::invalid(format!("{name} has {len} elements but keys has {keys}"));
    }
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_claim_batch.sql",
    name = "idem_claim_batch_surface",
    requires = [idem_claim_batch]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_claim_batch<'a>(
    keys: Option<Array<'a, &'a str>>,
    ttl: default!(Option<Interval>, "NULL"),
    scope: default!(Option<&str>, "'default'"),
) -> TableIterator<
    'static,
    (
        name!(key, String),
        name!(outcome, String),
        name!(token, Option<i64>),
        name!(attempts, Option<i32>),
        name!(payload, Option<Document>),
        name!(expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    args::writable("idem_claim_batch");
    let owned = keys;
    let keys = self::keys(&owned);
    let scope = args::scope(scope);
    let ttl = args::ttl(ttl);
    let claims = storage::claim_batch(scope, &keys, ttl);
    let rows: Vec<_> = keys
        .iter()
        .zip(claims)
        .map(|(key, c)| {
            let expires = c.expires_at.map(|t| TimestampWithTimeZone::try_from(t).expect("valid timestamp"));
            (key.to_string(), c.outcome.as_str().to_string(), c.token, c.attempts, c.payload, expires)
        })
        .collect();
    TableIterator::new(rows)
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_complete_batch.sql",
    name = "idem_complete_batch_surface",
    requires = [idem_complete_batch]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_complete_batch<'a>(
    keys: Option<Array<'a, &'a str>>,
    payloads: default!(Option<Documents>, "NULL"),
    scope: default!(Option<&str>, "'default'"),
    tokens: default!(Option<Array<'_, i64>>, "NULL"),
) -> i32 {
    args::writable("idem_complete_batch");
    let owned = keys;
    let keys = self::keys(&owned);
    let scope = args::scope(scope);
    let mut distinct = keys.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != keys.len() {
        errors::invalid("keys must not repeat a key in idem_complete_batch".to_string());
    }
    if let Some(p) = &payloads {
        same_length("payloads", p.len(), keys.len());
        let sizes = p.sizes();
        sizes.into_iter().flatten().for_each(|size| args::check_document_size("payload", size));
    }
    let tokens: Vec<Option<i64>> = match tokens {
        None => vec![None; keys.len()],
        Some(t) => {
            same_length("tokens", t.len(), keys.len());
            t.iter().map(args::token).collect()
        }
    };
    storage::complete_batch(scope, &keys, payloads.as_ref(), &tokens) as i32
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_once_batch.sql",
    name = "idem_once_batch_surface",
    requires = [idem_once_batch]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_once_batch<'a>(
    keys: Option<Array<'a, &'a str>>,
    scope: default!(Option<&str>, "'default'"),
) -> SetOfIterator<'static, String> {
    args::writable("idem_once_batch");
    let owned = keys;
    let keys = self::keys(&owned);
    let scope = args::scope(scope);
    SetOfIterator::new(storage::once_batch(scope, &keys))
}
