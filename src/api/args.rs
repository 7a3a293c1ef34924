//! Argument checks shared by the SQL functions. All functions are declared non-STRICT so that a
//! NULL argument reaches these checks and gets an ERROR instead of a silent NULL result.
use crate::errors;
use crate::gucs;
use super::grants;
use crate::storage::{Document, GrantKind, Key};
use pgrx::prelude::*;

/// Checks a key or scope: present, non-empty, within `idempotency.max_key_bytes`, printable.
pub fn ident<'a>(name: &str, value: Option<&'a str>) -> &'a str {
    let Some(value) = value else { errors::null_argument(name) };
    if value.is_empty() {
        errors::invalid(format!("{name} must not be empty"));
    }
    let limit = gucs::max_key_bytes();
    if value.len() > limit {
        errors::too_large(name, value.len(), limit, "idempotency.max_key_bytes");
    }
    // (An ASCII string, the usual key, is checked a byte at a time: its control characters are the bytes below
    // 0x20 and 0x7f.)
    let control = match value.is_ascii() {
        true => value.bytes().any(|b| b < 0x20 || b == 0x7f),
        false => value.chars().any(char::is_control),
    };
    if control {
        errors::invalid(format!("{name} must not contain control characters"));
    }
    value
}

pub fn key<'a>(key: Option<&'a str>, scope: Option<&'a str>) -> Key<'a> {
    Key { key: ident("key", key), scope: ident("scope", scope) }
}

/// A consumer call's key, with its scope authorized for the caller (see `storage::grants`).
pub fn scoped_key<'a>(key: Option<&'a str>, scope: Option<&'a str>) -> Key<'a> {
    let k = self::key(key, scope);
    grants::authorize(GrantKind::Scope, k.scope);
    k
}

/// A consumer call's scope, checked and authorized for the caller.
pub fn scope(scope: Option<&str>) -> &str {
    let scope = ident("scope", scope);
    grants::authorize(GrantKind::Scope, scope);
    scope
}

/// A consumer group, checked and authorized for the caller.
pub fn group(group: Option<&str>) -> &str {
    let group = ident("consumer_group", group);
    grants::authorize(GrantKind::Group, group);
    group
}

/// Writing functions refuse a read-only transaction (every transaction of a hot standby is one)
/// before anything else, with their own name in the message.
pub fn writable(function: &str) {
    // SAFETY: reads a backend global that PostgreSQL sets when the transaction starts.
    if unsafe { pgrx::pg_sys::XactReadOnly } {
        errors::read_only(function);
    }
}

pub fn required<T>(name: &str, value: Option<T>) -> T {
    value.unwrap_or_else(|| errors::null_argument(name))
}

/// A lease length: the given interval, or `idempotency.lease_ttl`; it must be positive and at most
/// `idempotency.max_lease_ttl`.
pub fn ttl(ttl: Option<Interval>) -> Interval {
    let ttl = ttl.unwrap_or_else(|| {
        Interval::new(0, 0, gucs::lease_ttl().as_micros() as i64).expect("lease_ttl is a valid interval")
    });
    // PostgreSQL compares intervals with 30-day months; so do we.
    let micros = ttl.months() as i128 * 30 * 86_400_000_000
        + ttl.days() as i128 * 86_400_000_000
        + ttl.micros() as i128;
    if micros <= 0 {
        errors::invalid(format!("ttl must be positive, got {ttl}"));
    }
    let limit = gucs::max_lease_ttl();
    if micros > limit.as_micros() as i128 {
        errors::invalid(format!(
            "ttl {ttl} is longer than idempotency.max_lease_ttl ({} s)",
            limit.as_secs()
        ));
    }
    ttl
}

/// A payload or error document, within `idempotency.max_payload_bytes` (its stored size).
pub fn document(name: &str, doc: Option<Document>) -> Option<Document> {
    let doc = doc?;
    check_document_size(name, doc.size());
    Some(doc)
}

pub fn check_document_size(name: &str, size: usize) {
    let limit = gucs::max_payload_bytes();
    if size > limit {
        errors::too_large(name, size, limit, "idempotency.max_payload_bytes");
    }
}

pub fn token(token: Option<i64>) -> Option<i64> {
    if let Some(t) = token {
        if t <= 0 {
            errors::invalid(format!("token must be positive, got {t}"));
        }
    }
    token
}

pub fn fingerprint(fingerprint: Option<&str>) -> Option<&str> {
    let limit = gucs::max_key_bytes();
    if let Some(f) = fingerprint {
        if f.len() > limit {
            errors::too_large("fingerprint", f.len(), limit, "idempotency.max_key_bytes");
        }
    }
    fingerprint
}
