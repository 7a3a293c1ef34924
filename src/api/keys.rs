//! `idem_claim`, `idem_complete`, `idem_fail`, `idem_heartbeat`, `idem_once`, `idem_status`.
//!
//! They check their arguments, then hand over to `storage`, which runs as the extension's owner
//! with `pg_catalog` as the only search path (see the storage's `spi::Conn`): consumers need no
//! privilege on the storage tables, and no caller's schema can shadow what the storage runs.
use super::args;
use crate::storage::{self, Document};
use pgrx::pg_sys;
use pgrx::prelude::*;

type Ts = TimestampWithTimeZone;

fn ts(value: pg_sys::TimestampTz) -> Ts {
    Ts::try_from(value).expect("valid timestamp")
}

pgrx::extension_sql!(
    r#"
GRANT EXECUTE ON FUNCTION idem_claim(text, interval, text, text, boolean) TO idempotency_consumer;
COMMENT ON FUNCTION idem_claim(text, interval, text, text, boolean) IS
'Claims (scope, key) for processing. outcome: claimed (you own it; token is your fencing token), completed (payload replays the stored result), in_progress (another holder''s lease is live), failed (terminal; payload is the stored error), mismatch (same key, different fingerprint). ttl NULL = idempotency.lease_ttl.';
"#,
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
) -> TableIterator<
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
    TableIterator::once((
        c.outcome.as_str().to_string(),
        c.token,
        c.attempts,
        c.payload,
        c.expires_at.map(ts),
    ))
}

pgrx::extension_sql!(
    r#"
GRANT EXECUTE ON FUNCTION idem_complete(text, jsonb, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_complete(text, jsonb, text, bigint) IS
'Marks a claimed key completed and stores payload for replay. token may be NULL only in the transaction that claimed. Errors: P0002 unknown key, 55000 already terminal, 55006 lease lost.';
"#,
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

pgrx::extension_sql!(
    r#"
GRANT EXECUTE ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) IS
'Records a failed attempt. retryable: releases the key for another claim and returns released, or returns failed once idempotency.max_attempts is reached. Not retryable: terminal at once, returns failed.';
"#,
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

pgrx::extension_sql!(
    r#"
GRANT EXECUTE ON FUNCTION idem_heartbeat(text, interval, text, bigint) TO idempotency_consumer;
COMMENT ON FUNCTION idem_heartbeat(text, interval, text, bigint) IS
'Extends the caller''s lease to now + ttl and returns the new expires_at. 55006 if the lease was lost.';
"#,
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

pgrx::extension_sql!(
    r#"
GRANT EXECUTE ON FUNCTION idem_once(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_once(text, text) IS
'True exactly once per (scope, key) over all committed transactions; records the key as completed in the caller''s transaction.';
"#,
    name = "idem_once_surface",
    requires = [idem_once]
);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_once(key: Option<&str>, scope: default!(Option<&str>, "'default'")) -> bool {
    args::writable("idem_once");
    storage::once(args::scoped_key(key, scope))
}

pgrx::extension_sql!(
    r#"
GRANT EXECUTE ON FUNCTION idem_status(text, text) TO idempotency_consumer;
COMMENT ON FUNCTION idem_status(text, text) IS
'The stored record of (scope, key): status, attempts, token, payload, error and timestamps; no row if unknown.';
"#,
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
