//! The `idempotency.*` settings, each defined once below: name, descriptions, default, bounds, who
//! may set it and its unit. Sizes and durations use PostgreSQL units, so
//! `SET idempotency.lease_ttl = '30s'` and `idempotency.max_payload_bytes = '256kB'` work. The rest of
//! the crate reads them through the typed accessors at the end (durations as `Duration`).
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::PostgresGucEnum;
use std::ffi::{CStr, CString};
use std::time::Duration;

mod common_path;

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

/// An integer setting and everything PostgreSQL needs to register it.
struct Int {
    name: &'static CStr,
    short: &'static CStr,
    long: &'static CStr,
    value: GucSetting<i32>,
    min: i32,
    max: i32,
    set_by: SetBy,
    flags: GucFlags,
}

/// Who may change a setting (pgrx's `GucContext`, which cannot be copied out of a static).
#[derive(Clone, Copy)]
enum SetBy {
    /// Anyone, with `SET` (per session or transaction).
    Anyone,
    /// Superusers, with `SET`.
    Superuser,
    /// postgresql.conf or `ALTER SYSTEM`, then a reload: what the maintenance worker reads.
    Reload,
    /// postgresql.conf, then a restart: sizes of shared memory.
    Startup,
}

impl SetBy {
    fn context(self) -> GucContext {
        match self {
            SetBy::Anyone => GucContext::Userset,
            SetBy::Superuser => GucContext::Suset,
            SetBy::Reload => GucContext::Sighup,
            SetBy::Startup => GucContext::Postmaster,
        }
    }
}

impl Int {
    fn register(&'static self) {
        GucRegistry::define_int_guc(
            self.name,
            self.short,
            self.long,
            &self.value,
            self.min,
            self.max,
            self.set_by.context(),
            self.flags,
        );
    }
}

const DAY_S: i32 = 24 * 60 * 60;

// The defaults of the limits that the SQL edition's calls read (see `common_path`).
const LEASE_TTL_DEFAULT: i32 = 5 * 60 * 1000;
const MAX_LEASE_TTL_DEFAULT: i32 = DAY_S;
const MAX_KEY_BYTES_DEFAULT: i32 = 512;
const MAX_PAYLOAD_BYTES_DEFAULT: i32 = 1024 * 1024;
const MAX_BATCH_KEYS_DEFAULT: i32 = 1_000;

static LEASE_TTL: Int = Int {
    name: c"idempotency.lease_ttl",
    short: c"Lease length used when idem_claim or idem_heartbeat get ttl => NULL.",
    long:
        c"A claim in two-transaction mode is owned until its lease ends; then the next claim takes it over.",
    value: GucSetting::<i32>::new(LEASE_TTL_DEFAULT),
    min: 1,
    max: i32::MAX,
    set_by: SetBy::Anyone,
    flags: GucFlags::UNIT_MS,
};
static MAX_LEASE_TTL: Int = Int {
    name: c"idempotency.max_lease_ttl",
    short: c"Longest lease idem_claim, idem_claim_batch and idem_heartbeat grant.",
    long: c"A longer ttl (or idempotency.lease_ttl) is refused with 22023: a consumer cannot hold a key for years. Superusers only.",
    value: GucSetting::<i32>::new(MAX_LEASE_TTL_DEFAULT),
    min: 1,
    max: i32::MAX,
    set_by: SetBy::Superuser,
    flags: GucFlags::UNIT_S,
};
static MAX_ATTEMPTS: Int = Int {
    name: c"idempotency.max_attempts",
    short: c"Claims of one key before it becomes a terminal failure.",
    long: c"Counted by idem_fail(retryable => true) and by takeovers of expired leases. A policy of the database, not of one consumer: superusers only.",
    value: GucSetting::<i32>::new(5),
    min: 1,
    max: 1_000_000,
    set_by: SetBy::Superuser,
    flags: GucFlags::empty(),
};
static MAX_KEY_BYTES: Int = Int {
    name: c"idempotency.max_key_bytes",
    short: c"Longest accepted key and scope, in bytes.",
    long: c"Longer keys are rejected with SQLSTATE 54000; hash long natural keys on the client.",
    value: GucSetting::<i32>::new(MAX_KEY_BYTES_DEFAULT),
    min: 1,
    max: 1024 * 1024,
    set_by: SetBy::Superuser,
    flags: GucFlags::UNIT_BYTE,
};
static MAX_PAYLOAD_BYTES: Int = Int {
    name: c"idempotency.max_payload_bytes",
    short: c"Largest accepted payload or error document, in bytes of stored jsonb.",
    long: c"Larger documents are rejected with SQLSTATE 54000.",
    value: GucSetting::<i32>::new(MAX_PAYLOAD_BYTES_DEFAULT),
    min: 0,
    max: i32::MAX,
    set_by: SetBy::Superuser,
    flags: GucFlags::UNIT_BYTE,
};
static PARTITION_INTERVAL: Int = Int {
    name: c"idempotency.partition_interval",
    short: c"Width of one time partition of the record table.",
    long: c"Retention drops whole partitions, so this is also the granularity of retention.",
    value: GucSetting::<i32>::new(DAY_S),
    min: 60,
    max: i32::MAX,
    set_by: SetBy::Reload,
    flags: GucFlags::UNIT_S,
};
static PREMAKE: Int = Int {
    name: c"idempotency.premake",
    short: c"Partitions created ahead of the current one.",
    long: c"Each maintenance round makes the partitions missing from the current one to this many intervals ahead, so claims rarely have to create one.",
    value: GucSetting::<i32>::new(4),
    min: 1,
    max: 1000,
    set_by: SetBy::Reload,
    flags: GucFlags::empty(),
};
static RETENTION: Int = Int {
    name: c"idempotency.retention",
    short: c"Age past which whole partitions are dropped.",
    long: c"A partition is dropped once its upper bound is older than now - retention; keys in it can then be processed again.",
    value: GucSetting::<i32>::new(7 * DAY_S),
    min: 60,
    max: i32::MAX,
    set_by: SetBy::Reload,
    flags: GucFlags::UNIT_S,
};
static MAINTENANCE_INTERVAL: Int = Int {
    name: c"idempotency.maintenance_interval",
    short: c"Pause between two rounds of the maintenance worker.",
    long: c"Each round premakes and drops partitions and reclaims stuck leases in every database of idempotency.database.",
    value: GucSetting::<i32>::new(60),
    min: 1,
    max: DAY_S,
    set_by: SetBy::Reload,
    flags: GucFlags::UNIT_S,
};
static RECLAIM_AFTER: Int = Int {
    name: c"idempotency.reclaim_after",
    short: c"Grace period after a lease expired before maintenance deletes the never-taken-over key.",
    long: c"A key whose consumer vanished and that no claim took over is deleted this long after its lease ended, so that it can be processed again from scratch.",
    value: GucSetting::<i32>::new(60 * 60),
    min: 0,
    max: i32::MAX,
    set_by: SetBy::Reload,
    flags: GucFlags::UNIT_S,
};
static DROP_LOCK_TIMEOUT: Int = Int {
    name: c"idempotency.drop_lock_timeout",
    short: c"How long dropping a partition may wait for its lock before maintenance leaves it for the next round.",
    long: c"Dropping a partition needs a brief exclusive lock on the record table; claims queue behind it at most this long.",
    value: GucSetting::<i32>::new(100),
    min: 1,
    max: 60 * 1000,
    set_by: SetBy::Reload,
    flags: GucFlags::UNIT_MS,
};
static FILTER_MEMORY: Int = Int {
    name: c"idempotency.filter_memory",
    short: c"Most space all membership filters of sealed partitions may take together.",
    long: c"A sealed partition gets a filter (about 1.9 bytes a key) while the filters' total stays under this; beyond it, partitions are sealed without one and claims probe their index (logged once). Filters live in idempotency.filter_chunks, read through shared buffers.",
    value: GucSetting::<i32>::new(256 * 1024),
    min: 0,
    max: i32::MAX,
    set_by: SetBy::Reload,
    flags: GucFlags::UNIT_KB,
};
static FILTER_CACHE: Int = Int {
    name: c"idempotency.filter_cache",
    short: c"Memory a backend may use for copies of the sealed partitions' filters.",
    long: c"A claim reads a filter's block from the backend's copy instead of a shared buffer while the copies fit (about 1.9 bytes a retained key); past it, from shared buffers. 0 turns the copies off.",
    value: GucSetting::<i32>::new(8 * 1024),
    min: 0,
    max: i32::MAX,
    set_by: SetBy::Superuser,
    flags: GucFlags::UNIT_KB,
};
static MAX_BATCH_KEYS: Int = Int {
    name: c"idempotency.max_batch_keys",
    short: c"Most keys accepted by one idem_*_batch call.",
    long: c"A bound on the arrays one call takes; a batch holds at most idempotency.key_locks_per_transaction key locks whatever its size.",
    value: GucSetting::<i32>::new(MAX_BATCH_KEYS_DEFAULT),
    min: 1,
    max: 1_000_000,
    set_by: SetBy::Superuser,
    flags: GucFlags::empty(),
};
static KEY_LOCKS_PER_TRANSACTION: Int = Int {
    name: c"idempotency.key_locks_per_transaction",
    short: c"Key locks a transaction keeps until it ends; -1: half of max_locks_per_transaction.",
    long: c"Each key a transaction writes holds one entry of the shared lock table. Within this many, a claim made and completed in one transaction writes its row once; past it, every call writes its keys' rows at once and gives their locks back, so that a transaction of any size takes a bounded share of the lock table.",
    value: GucSetting::<i32>::new(-1),
    min: -1,
    max: 1_000_000,
    set_by: SetBy::Superuser,
    flags: GucFlags::empty(),
};
static STATS_MAX_SCOPES: Int = Int {
    name: c"idempotency.stats_max_scopes",
    short: c"Scopes per cluster that idempotency.stats counts one by one.",
    long: c"Counters of further scopes are added up in one row per database with scope NULL. A scope keeps its place until a restart finds its counters all zero (reset) or its database dropped. Sizes shared memory (592 bytes a scope: two slots of 296 bytes); needs shared_preload_libraries.",
    value: GucSetting::<i32>::new(1_000),
    min: 1,
    max: 1_000_000,
    set_by: SetBy::Startup,
    flags: GucFlags::empty(),
};
static HELD_KEYS: Int = Int {
    name: c"idempotency.held_keys",
    short: c"Keys the cluster's transactions may hold past their key-lock budget without lock-table entries.",
    long: c"A transaction past idempotency.key_locks_per_transaction holds each further key in a shared table of its own (about 21 bytes a key) instead of the lock table, and still writes a claim made and completed in one transaction once. When the table is full, the claim is written at once and its uncommitted row keeps other writers out. 0 turns the table off. Sizes shared memory; needs shared_preload_libraries.",
    value: GucSetting::<i32>::new(65_536),
    min: 0,
    max: 16_777_216,
    set_by: SetBy::Startup,
    flags: GucFlags::empty(),
};

static STATS: GucSetting<bool> = GucSetting::<bool>::new(true);
static REQUIRE_SCOPE_GRANTS: GucSetting<bool> = GucSetting::<bool>::new(false);
static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));
static PARTITION_MANAGER: GucSetting<PartitionManager> =
    GucSetting::<PartitionManager>::new(PartitionManager::Builtin);

pub fn init() {
    for setting in [
        &LEASE_TTL,
        &MAX_LEASE_TTL,
        &MAX_ATTEMPTS,
        &MAX_KEY_BYTES,
        &MAX_PAYLOAD_BYTES,
        &PARTITION_INTERVAL,
        &PREMAKE,
        &RETENTION,
        &MAINTENANCE_INTERVAL,
        &RECLAIM_AFTER,
        &DROP_LOCK_TIMEOUT,
        &MAX_BATCH_KEYS,
        &KEY_LOCKS_PER_TRANSACTION,
        &FILTER_MEMORY,
        &FILTER_CACHE,
    ] {
        setting.register();
    }
    // A setting that sizes shared memory can only be defined while the library is preloaded.
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries.
    if unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        STATS_MAX_SCOPES.register();
        HELD_KEYS.register();
    }
    GucRegistry::define_bool_guc(
        c"idempotency.require_scope_grants",
        c"Refuses every scope and consumer group not granted with idem_grant_scope or idem_grant_group.",
        c"Off: grants of a kind are enforced once one exists. On: enforced even before the first grant. Superusers only; superusers are never refused.",
        &REQUIRE_SCOPE_GRANTS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"idempotency.stats",
        c"Counts what the idem_* calls answer, per scope, in idempotency.stats.",
        c"Needs the library in shared_preload_libraries. Counts are kept per backend and published when its transaction ends.",
        &STATS,
        GucContext::Suset,
        GucFlags::default(),
    );
    common_path::register();
    GucRegistry::define_string_guc(
        c"idempotency.database",
        c"Comma-separated databases the maintenance worker maintains.",
        c"Databases without the extension, or without partitions yet, are skipped quietly.",
        &DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"idempotency.partition_manager",
        c"Who premakes and drops partitions: builtin, pg_partman or none.",
        c"builtin: this extension (claims make a missing current partition, maintenance premakes and drops); pg_partman: its run_maintenance() after idem_partman_handover(); none: the DBA. Maintenance reclaims stuck leases under all three.",
        &PARTITION_MANAGER,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

fn millis(setting: &Int) -> Duration {
    Duration::from_millis(setting.value.get() as u64)
}
fn seconds(setting: &Int) -> Duration {
    Duration::from_secs(setting.value.get() as u64)
}

pub fn lease_ttl() -> Duration {
    millis(&LEASE_TTL)
}
pub fn max_lease_ttl() -> Duration {
    seconds(&MAX_LEASE_TTL)
}
pub fn require_scope_grants() -> bool {
    REQUIRE_SCOPE_GRANTS.get()
}
pub fn max_attempts() -> i32 {
    MAX_ATTEMPTS.value.get()
}
pub fn max_key_bytes() -> usize {
    MAX_KEY_BYTES.value.get() as usize
}
pub fn max_payload_bytes() -> usize {
    MAX_PAYLOAD_BYTES.value.get() as usize
}
pub fn partition_interval() -> Duration {
    seconds(&PARTITION_INTERVAL)
}
pub fn premake() -> i32 {
    PREMAKE.value.get()
}
pub fn retention() -> Duration {
    seconds(&RETENTION)
}
pub fn maintenance_interval() -> Duration {
    seconds(&MAINTENANCE_INTERVAL)
}
pub fn reclaim_after() -> Duration {
    seconds(&RECLAIM_AFTER)
}
pub fn drop_lock_timeout() -> Duration {
    millis(&DROP_LOCK_TIMEOUT)
}
/// `idempotency.filter_memory` in bytes.
pub fn filter_memory() -> u64 {
    FILTER_MEMORY.value.get() as u64 * 1024
}
/// `idempotency.filter_cache` in bytes.
pub fn filter_cache() -> usize {
    FILTER_CACHE.value.get() as usize * 1024
}
pub fn key_locks_per_transaction() -> i32 {
    KEY_LOCKS_PER_TRANSACTION.value.get()
}
/// `idempotency.held_keys` (read while preloading, to size the table of held keys).
pub fn held_keys() -> usize {
    HELD_KEYS.value.get() as usize
}
pub fn max_batch_keys() -> usize {
    MAX_BATCH_KEYS.value.get() as usize
}
/// The databases listed in `idempotency.database`.
pub fn databases() -> Vec<String> {
    let list = DATABASE.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}
pub fn partition_manager() -> PartitionManager {
    PARTITION_MANAGER.get()
}
pub fn stats() -> bool {
    STATS.get()
}
pub fn stats_max_scopes() -> usize {
    STATS_MAX_SCOPES.value.get() as usize
}
