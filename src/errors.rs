//! Every error the API raises, with its SQLSTATE. docs/reference.md's SQLSTATE table documents these.
//!
//! PostgreSQL's own errors (timeouts, cancel, serialization, disk full) raised inside our calls
//! reach the client as PostgreSQL raised them: pgrx turns them into a Rust unwind and raises them
//! again with their SQLSTATE, message, detail and hint. See [`init`] for the one thing we change.
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode as Code;

fn raise(code: Code, message: String, hint: Option<&str>) -> ! {
    let mut report = ErrorReport::new(code, message, "");
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// Replaces pgrx's panic hook, which records a Rust backtrace at every unwind (PostgreSQL's own
/// errors travel through our frames as unwinds) that pgrx then appends to the error's DETAIL
/// whenever `RUST_BACKTRACE` is set in the server's environment. A client must see PostgreSQL's
/// error as PostgreSQL raised it, never our internal frames. The hook stays silent: a bug of ours
/// still becomes an ERROR (SQLSTATE XX000) with its message, just without the frames.
pub fn init() {
    std::panic::set_hook(Box::new(|_| {}));
}

/// 25006: a writing function called in a read-only transaction or on a hot standby. Checked before
/// anything is done, so the message names the function the user called rather than our statement.
pub fn read_only(function: &str) -> ! {
    // SAFETY: a plain read of the backend's recovery state, no side effects.
    let standby = unsafe { pg_sys::RecoveryInProgress() };
    let hint = if standby {
        "This server is a hot standby: call it on the primary."
    } else {
        "Call it in a read-write transaction."
    };
    raise(
        Code::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        format!("{function} cannot run in a read-only transaction"),
        Some(hint),
    )
}

/// 55000: a partition of the record table without the `(key, scope)` index lookups need
/// (one a DBA attached by hand, say).
pub fn partition_not_indexed(partition: &str) -> ! {
    raise(
        Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("idempotency: partition {partition} of idempotency.records has no btree index on (key, scope)"),
        Some(&format!("SELECT idempotency.index_partition('idempotency.{partition}'); creates the indexes every partition needs.")),
    )
}

/// 55000: a function whose SQL definition answers other columns than this library's code (a library
/// of another version than the installed extension's, before `ALTER EXTENSION idempotency UPDATE`).
pub fn definition_mismatch(function: &str) -> ! {
    raise(
        Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("idempotency: the SQL definition of function {function} does not match the installed library"),
        Some("Make the installed extension the library's version: ALTER EXTENSION idempotency UPDATE;"),
    )
}

/// 0A000, PostgreSQL's own error for a set-returning function called where no set is taken (a C caller
/// without a ReturnSetInfo); SQL always calls with one.
pub fn no_set_accepted() -> ! {
    raise(
        Code::ERRCODE_FEATURE_NOT_SUPPORTED,
        "set-valued function called in context that cannot accept a set".to_string(),
        None,
    )
}

/// 0A000, PostgreSQL's own error for a caller whose ReturnSetInfo does not take a tuplestore; both of
/// the executor's callers of set-returning functions take one.
pub fn no_materialize() -> ! {
    raise(
        Code::ERRCODE_FEATURE_NOT_SUPPORTED,
        "materialize mode required, but it is not allowed in this context".to_string(),
        None,
    )
}

/// 22004: a required argument is NULL.
pub fn null_argument(name: &str) -> ! {
    raise(Code::ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("idempotency: {name} must not be NULL"), None)
}

/// 54000: a document whose arrays and objects nest deeper than a fingerprint takes.
pub fn too_deep(what: &str, depth: usize, limit: usize) -> ! {
    raise(
        Code::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("idempotency: {what} nests {depth} arrays and objects deep, over the limit of {limit}"),
        Some("A fingerprint takes documents nested at most that deep, here and in the client libraries."),
    )
}

/// 22023: an argument has a value the API does not accept.
pub fn invalid(message: String) -> ! {
    raise(Code::ERRCODE_INVALID_PARAMETER_VALUE, format!("idempotency: {message}"), None)
}

/// 54000: a key, scope or document is over its configured limit.
pub fn too_large(what: &str, bytes: usize, limit: usize, guc: &str) -> ! {
    raise(
        Code::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("idempotency: {what} is {bytes} bytes, over the limit of {limit}"),
        Some(&format!("The limit is set by {guc}.")),
    )
}

/// P0002: the key has no record. The hint says what the caller can do about it.
pub fn unknown_key(scope: &str, key: &str, hint: &str) -> ! {
    raise(
        Code::ERRCODE_NO_DATA_FOUND,
        format!("idempotency: key {key:?} in scope {scope:?} does not exist"),
        Some(hint),
    )
}

/// The hint of a holder's call (complete, fail, heartbeat) on a key without a record.
pub const HINT_CLAIM_FIRST: &str =
    "Claim the key with idem_claim first; a claim made in a rolled-back transaction leaves no record.";
/// The hint of an admin's redrive of a key without a record.
pub const HINT_REDRIVE_FAILED: &str =
    "Only a key with a record can be redriven; idempotency.dead_letters lists the failed keys of each scope.";

/// 55000: the key is already completed or failed.
pub fn already_terminal(scope: &str, key: &str, status: &str) -> ! {
    raise(
        Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("idempotency: key {key:?} in scope {scope:?} is already {status}"),
        None,
    )
}

/// 55006: the caller does not hold the key's lease (any more).
pub fn lease_lost(scope: &str, key: &str, why: &str) -> ! {
    raise(
        Code::ERRCODE_OBJECT_IN_USE,
        format!("idempotency: lease lost on key {key:?} in scope {scope:?}: {why}"),
        Some("Another consumer owns this key now; abandon this attempt without side effects."),
    )
}

/// 40001: the key was written by a transaction this snapshot cannot see.
pub fn serialization_failure(scope: &str, key: &str) -> ! {
    raise(
        Code::ERRCODE_T_R_SERIALIZATION_FAILURE,
        format!(
            "idempotency: could not serialize access to key {key:?} in scope {scope:?} due to a concurrent claim"
        ),
        Some("The transaction should be retried."),
    )
}

/// 40001: the partitions changed under every one of several lookups (concurrent DDL without pause).
pub fn partitions_changing() -> ! {
    raise(
        Code::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "idempotency: the partitions of idempotency.records kept changing while they were looked up".into(),
        Some("The transaction should be retried."),
    )
}

/// 22003: a number that cannot be stored.
pub fn out_of_range(name: &str, value: i64) -> ! {
    raise(
        Code::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        format!("idempotency: {name} {value} is out of range"),
        None,
    )
}

/// 55006: a consumer of an older group generation (a zombie) tried to move an offset.
pub fn fenced(group: &str, topic: &str, partition: i32, given: i64, stored: i64) -> ! {
    raise(
        Code::ERRCODE_OBJECT_IN_USE,
        format!(
            "idempotency: consumer fenced on group {group:?} topic {topic:?} partition {partition}: generation {given} is older than the stored generation {stored}"
        ),
        Some("A newer member of the consumer group owns this partition; abandon this transaction."),
    )
}

/// 54000: a batch with more keys than `idempotency.max_batch_keys`.
pub fn too_many_keys(count: usize, limit: usize) -> ! {
    raise(
        Code::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("idempotency: batch has {count} keys, over the limit of {limit}"),
        Some("The limit is set by idempotency.max_batch_keys; split the batch."),
    )
}

/// 55000: pg_partman handover while another partition manager is configured.
pub fn wrong_partition_manager() -> ! {
    raise(
        Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "idempotency: idempotency.partition_manager must be 'pg_partman' before the handover".to_string(),
        Some("ALTER SYSTEM SET idempotency.partition_manager = 'pg_partman'; SELECT pg_reload_conf();"),
    )
}

/// 55000: pg_partman handover without pg_partman.
pub fn partman_missing() -> ! {
    raise(
        Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "idempotency: the pg_partman extension is not installed in this database".to_string(),
        Some("CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman;"),
    )
}

/// 42501: the caller holds no grant on the scope or consumer group, and grants of its kind are on.
pub fn no_grant(noun: &str, name: &str) -> ! {
    // SAFETY: reads the current user id and looks its name up in the syscache.
    let role = unsafe { std::ffi::CStr::from_ptr(pgrx::pg_sys::GetUserNameFromId(pgrx::pg_sys::GetUserId(), false)) };
    raise(
        Code::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("idempotency: role {:?} has no grant on {noun} {name:?}", role.to_string_lossy()),
        Some(&format!(
            "A DBA grants it with idem_grant_{}('{}', '<name or prefix*>'); see docs/security.md.",
            if noun == "scope" { "scope" } else { "group" },
            role.to_string_lossy()
        )),
    )
}
