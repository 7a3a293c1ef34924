//! `idem_claim`, `idem_complete`, `idem_fail`, `idem_heartbeat`, `idem_once`, `idem_status`.
//!
//! They check their arguments, then hand over to `storage`, which runs as the extension's owner
//! with `pg_catalog` as the only search path (see the storage's `spi::Conn`): consumers need no
//! privilege on the storage tables, and no caller's schema can shadow what the storage runs.
use super::{args, one_row};
use crate::storage::{self, Document};
use pgrx::pg_sys;
use pgrx::prelude::*;

type Ts = TimestampWithTimeZone;

fn ts(value: pg_sys::TimestampTz) -> Ts {
    Ts::try_from(value).expect("valid timestamp")
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_claim.sql",
    name = "idem_claim_surface",
    requires = [idem_claim]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_claim(
    key: Option<&str>,
    ttl: default!(Option<Interval>, "NULL"),
    scope: default!(Option<&str>, "'default'"),
    fingerprint: default!(Option<&str>, "NULL"),
    wait: default!(Option<bool>, "true"),
) -> one_row::TableIterator<
    'static,
    (
        name!(outcome, String),
        name!(token, Option<i64>),
        name!(attempts, Option<i32>),
        name!(payload, Option<Document>),
        name!(expires_at, Option<Ts>),
    ),
> {
    args::writable("idem_claim");
    let k = args::scoped_key(key, scope);
    let ttl = args::ttl(ttl);
    let fingerprint = args::fingerprint(fingerprint);
    let wait = args::required("wait", wait);
    let c = storage::claim(k, ttl, fingerprint, wait);
    one_row::TableIterator::once((
        c.outcome.as_str().to_string(),
        c.token,
        c.attempts,
        c.payload,
        c.expires_at.map(ts),
    ))
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_complete.sql",
    name = "idem_complete_surface",
    requires = [idem_complete]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_complete(
    key: Option<&str>,
    payload: default!(Option<Document>, "NULL"),
    scope: default!(Option<&str>, "'default'"),
    token: default!(Option<i64>, "NULL"),
) {
    args::writable("idem_complete");
    let k = args::scoped_key(key, scope);
    let payload = args::document("payload", payload);
    let token = args::token(token);
    storage::complete(k, payload, token);
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_fail.sql",
    name = "idem_fail_surface",
    requires = [idem_fail]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_fail(
    key: Option<&str>,
    error: default!(Option<Document>, "NULL"),
    retryable: default!(Option<bool>, "true"),
    scope: default!(Option<&str>, "'default'"),
    token: default!(Option<i64>, "NULL"),
) -> String {
    args::writable("idem_fail");
    let k = args::scoped_key(key, scope);
    let error = args::document("error", error);
    let retryable = args::required("retryable", retryable);
    let token = args::token(token);
    storage::fail(k, error, retryable, token).to_string()
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_heartbeat.sql",
    name = "idem_heartbeat_surface",
    requires = [idem_heartbeat]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_heartbeat(
    key: Option<&str>,
    ttl: default!(Option<Interval>, "NULL"),
    scope: default!(Option<&str>, "'default'"),
    token: default!(Option<i64>, "NULL"),
) -> Ts {
    args::writable("idem_heartbeat");
    let k = args::scoped_key(key, scope);
    let ttl = args::ttl(ttl);
    let token = args::token(token);
    ts(storage::heartbeat(k, ttl, token))
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_once.sql",
    name = "idem_once_surface",
    requires = [idem_once]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_once(key: Option<&str>, scope: default!(Option<&str>, "'default'")) -> bool {
    args::writable("idem_once");
    storage::once(args::scoped_key(key, scope))
}

pgrx::extension_sql_file!(
    "../../sql/surface/idem_status.sql",
    name = "idem_status_surface",
    requires = [idem_status]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_status(
    key: Option<&str>,
    scope: default!(Option<&str>, "'default'"),
) -> TableIterator<
    'static,
    (
        name!(status, String),
        name!(attempts, i32),
        name!(token, Option<i64>),
        name!(payload, Option<Document>),
        name!(error, Option<Document>),
        name!(created_at, Ts),
        name!(updated_at, Ts),
        name!(expires_at, Option<Ts>),
    ),
> {
    let k = args::scoped_key(key, scope);
    let rows = storage::status(k).map(|r| {
        (
            r.status,
            r.attempts,
            r.token,
            r.payload,
            r.error,
            ts(r.created_at),
            ts(r.updated_at),
            r.expires_at.map(ts),
        )
    });
    TableIterator::new(rows)
}
