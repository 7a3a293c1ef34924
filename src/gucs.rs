//! The `idempotency.*` settings. Sizes and durations use PostgreSQL units, so
//! `SET idempotency.lease_ttl = '30s'` and `idempotency.max_payload_bytes = '256kB'` work.
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Lease length, in milliseconds, when `idem_claim` / `idem_heartbeat` get `ttl => NULL`.
pub static LEASE_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(5 * 60 * 1000);
/// Claims of one key before it becomes terminal.
pub static MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(5);
/// Longest key and scope, in bytes.
pub static MAX_KEY_BYTES: GucSetting<i32> = GucSetting::<i32>::new(512);
/// Largest payload or error, in bytes of JSON text.
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
/// Width of one storage partition, in seconds.
pub static PARTITION_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(24 * 60 * 60);
/// Partitions kept ready ahead of the current one.
pub static PREMAKE: GucSetting<i32> = GucSetting::<i32>::new(4);

pub fn init() {
    GucRegistry::define_int_guc(
        c"idempotency.lease_ttl",
        c"Lease length used when idem_claim or idem_heartbeat get ttl => NULL.",
        c"A claim in two-transaction mode is owned until its lease ends; then the next claim takes it over.",
        &LEASE_TTL_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"idempotency.max_attempts",
        c"Claims of one key before it becomes a terminal failure.",
        c"Counted by idem_fail(retryable => true) and by takeovers of expired leases.",
        &MAX_ATTEMPTS,
        1,
        1_000_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"idempotency.max_key_bytes",
        c"Longest accepted key and scope, in bytes.",
        c"Longer keys are rejected with SQLSTATE 54000; hash long natural keys on the client.",
        &MAX_KEY_BYTES,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"idempotency.max_payload_bytes",
        c"Largest accepted payload or error document, in bytes of JSON text.",
        c"Larger documents are rejected with SQLSTATE 54000.",
        &MAX_PAYLOAD_BYTES,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"idempotency.partition_interval",
        c"Width of one time partition of the record table.",
        c"Retention drops whole partitions, so this is also the granularity of retention.",
        &PARTITION_INTERVAL_S,
        60,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.premake",
        c"Partitions created ahead of the current one.",
        c"",
        &PREMAKE,
        1,
        1000,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

pub fn lease_ttl_ms() -> i64 {
    LEASE_TTL_MS.get() as i64
}
pub fn max_attempts() -> i32 {
    MAX_ATTEMPTS.get()
}
pub fn max_key_bytes() -> usize {
    MAX_KEY_BYTES.get() as usize
}
pub fn max_payload_bytes() -> usize {
    MAX_PAYLOAD_BYTES.get() as usize
}
pub fn partition_interval_s() -> i64 {
    PARTITION_INTERVAL_S.get() as i64
}
pub fn premake() -> i32 {
    PREMAKE.get()
}
