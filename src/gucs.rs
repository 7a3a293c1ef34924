//! The `idempotency.*` settings. Sizes and durations use PostgreSQL units, so
//! `SET idempotency.lease_ttl = '30s'` and `idempotency.max_payload_bytes = '256kB'` work.
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::PostgresGucEnum;
use std::ffi::CString;

/// Who creates and drops the partitions of `idempotency.records`.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum PartitionManager {
    /// This extension: consumers create a missing current partition, maintenance premakes and drops.
    #[name = c"builtin"]
    Builtin,
    /// pg_partman's run_maintenance() premakes and drops (see idem_partman_handover()).
    #[name = c"pg_partman"]
    PgPartman,
    /// Nobody: the DBA does. Maintenance still reclaims stuck leases.
    #[name = c"none"]
    None,
}

/// Lease length, in milliseconds, when `idem_claim` / `idem_heartbeat` get `ttl => NULL`.
pub static LEASE_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(5 * 60 * 1000);
/// Claims of one key before it becomes terminal.
pub static MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(5);
/// Longest key and scope, in bytes.
pub static MAX_KEY_BYTES: GucSetting<i32> = GucSetting::<i32>::new(512);
/// Largest payload or error, in bytes of stored jsonb.
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
/// Width of one storage partition, in seconds.
pub static PARTITION_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(24 * 60 * 60);
/// Partitions kept ready ahead of the current one.
pub static PREMAKE: GucSetting<i32> = GucSetting::<i32>::new(4);

/// Partitions whose whole range is older than this (seconds) are dropped.
pub static RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(7 * 24 * 60 * 60);
/// Pause between two maintenance rounds of the background worker (seconds).
pub static MAINTENANCE_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(60);
/// Databases the background worker maintains, comma-separated.
pub static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));
pub static PARTITION_MANAGER: GucSetting<PartitionManager> =
    GucSetting::<PartitionManager>::new(PartitionManager::Builtin);
/// A lease that expired this long ago (seconds) and was never taken over is reclaimed.
pub static RECLAIM_AFTER_S: GucSetting<i32> = GucSetting::<i32>::new(60 * 60);
/// How long dropping a partition may wait for its lock before it is left for the next round (ms).
pub static DROP_LOCK_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(100);
/// Most keys accepted by one batch call.
pub static MAX_BATCH_KEYS: GucSetting<i32> = GucSetting::<i32>::new(1_000);

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
        c"Largest accepted payload or error document, in bytes of stored jsonb.",
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
    GucRegistry::define_int_guc(
        c"idempotency.retention",
        c"Age past which whole partitions are dropped.",
        c"A partition is dropped once its upper bound is older than now - retention; keys in it can then be processed again.",
        &RETENTION_S,
        60,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.maintenance_interval",
        c"Pause between two rounds of the maintenance worker.",
        c"",
        &MAINTENANCE_INTERVAL_S,
        1,
        24 * 60 * 60,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_string_guc(
        c"idempotency.database",
        c"Comma-separated databases the maintenance worker maintains.",
        c"Databases without the extension are skipped quietly.",
        &DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"idempotency.partition_manager",
        c"Who premakes and drops partitions: builtin, pg_partman or none.",
        c"",
        &PARTITION_MANAGER,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"idempotency.reclaim_after",
        c"Grace period after a lease expired before maintenance deletes the never-taken-over key.",
        c"",
        &RECLAIM_AFTER_S,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.drop_lock_timeout",
        c"How long dropping a partition may wait for its lock before maintenance leaves it for the next round.",
        c"Dropping a partition needs a brief exclusive lock on the record table; claims queue behind it at most this long.",
        &DROP_LOCK_TIMEOUT_MS,
        1,
        60 * 1000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"idempotency.max_batch_keys",
        c"Most keys accepted by one idem_*_batch call.",
        c"Each key of a batch holds one entry of the shared lock table until the transaction ends; raise max_locks_per_transaction with it.",
        &MAX_BATCH_KEYS,
        1,
        1_000_000,
        GucContext::Suset,
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
pub fn retention_s() -> i64 {
    RETENTION_S.get() as i64
}
pub fn maintenance_interval() -> std::time::Duration {
    std::time::Duration::from_secs(MAINTENANCE_INTERVAL_S.get() as u64)
}
/// The databases listed in `idempotency.database`.
pub fn databases() -> Vec<String> {
    let list = DATABASE.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}
pub fn partition_manager() -> PartitionManager {
    PARTITION_MANAGER.get()
}
pub fn reclaim_after_s() -> i64 {
    RECLAIM_AFTER_S.get() as i64
}
pub fn drop_lock_timeout_ms() -> i32 {
    DROP_LOCK_TIMEOUT_MS.get()
}
pub fn max_batch_keys() -> usize {
    MAX_BATCH_KEYS.get() as usize
}
