//! One-row claims: the claim of a new key is written once, when its fate is known.
//!
//! A consumer in one-transaction mode claims, works and completes before it commits; writing the
//! claim as a `pending` row and then updating it to `completed` would cost two row versions and
//! their index entries for one key. So the claim of a new key (by `idem_claim` or `idem_claim_batch`) is
//! only remembered here, under the
//! key's lock (which keeps every other transaction out until this one ends, exactly as the
//! uncommitted row did), with its token, its lease and its place (while the transaction keeps its key
//! locks: past `keylock::budget` the claim is written at once, and its lock given back after the call): the partition it was to go to is
//! locked as the insert would have (so a seal waits for this transaction as before). Then
//! - `idem_complete` writes the row once, as `completed`, and so does `idem_complete_batch` when every
//!   key it is given is such a claim (the batch loop of one transaction);
//! - anything else that looks at the key in this transaction (a second claim, `idem_once`,
//!   `idem_status`, a batch, `idem_fail`, `idem_heartbeat`) first writes it as `pending`, as the
//!   claim would have, and then works on the row as before;
//! - at commit (or PREPARE TRANSACTION), a claim still unwritten is written as `pending`: the
//!   two-transaction mode's lease.
//! A rollback forgets the claim with the transaction; a rollback to a savepoint forgets the claims
//! made after it, and makes a row written after it (which the rollback removed) unwritten again.
//! A statement of this transaction that reads the storage with SQL (a view, `idem_metrics()`, a
//! DBA's SELECT) first writes the remembered claims, so that it sees them as it would have.
use super::pg::document::Document;
use super::pg::spi::{self, Conn};
use super::pg::writer::{self, Row};
use super::pg::xact;
use super::record::Key;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// A claim of a new key, not written yet (or written in `written_in`).
struct Deferred {
    token: i64,
    fingerprint: Option<String>,
    partition: pg_sys::Oid,
    created_at: pg_sys::TimestampTz,
    claimed_at: pg_sys::TimestampTz,
    expires_at: pg_sys::TimestampTz,
    /// The subtransaction that claimed.
    made_in: pg_sys::SubTransactionId,
    /// The subtransaction that wrote its row, if one did.
    written_in: Option<pg_sys::SubTransactionId>,
}

thread_local! {
    static CLAIMS: RefCell<HashMap<(String, String), Deferred>> = RefCell::new(HashMap::new());
}

fn id(k: Key) -> (String, String) {
    (k.scope.to_owned(), k.key.to_owned())
}

/// The claim of a new key: remembered instead of inserted when `remember` (the caller keeps the key's
/// lock until the transaction ends, see `keylock::KeyLock::may_defer`), else written at once as
/// `pending`. The caller has locked `partition` for the insert.
#[allow(clippy::too_many_arguments)]
pub fn claim_new(
    conn: &Conn,
    k: Key,
    remember: bool,
    token: i64,
    fingerprint: Option<&str>,
    partition: pg_sys::Oid,
    created_at: pg_sys::TimestampTz,
    claimed_at: pg_sys::TimestampTz,
    expires_at: pg_sys::TimestampTz,
) {
    let claim = Deferred {
        token,
        fingerprint: fingerprint.map(str::to_owned),
        partition,
        created_at,
        claimed_at,
        expires_at,
        made_in: xact::subtransaction(),
        written_in: None,
    };
    if remember {
        CLAIMS.with_borrow_mut(|claims| claims.insert(id(k), claim));
    } else {
        insert_pending(conn, k, &claim);
    }
}

/// What a claim's row is written as.
enum Fate<'a> {
    /// Claimed and not completed: the lease of the two-transaction mode.
    Pending,
    /// Completed in the claiming transaction, with its payload: what the update of the pending row
    /// would have left.
    Completed(Option<&'a Document>),
}

/// Writes the claim's row (see `writer`). Its serialization failures (an SSI conflict of the insert)
/// are counted here when no call counts them: at COMMIT, or before a statement that reads the storage.
fn insert(conn: &Conn, k: Key, c: &Deferred, fate: Fate) {
    let row = row_of(k, c, fate);
    crate::stats::count_serialization_failures(k.scope, || writer::insert(conn, c.partition, &row));
}

/// Writes the rows of several claims of `scope`, each with its fate, a partition's rows together.
fn insert_all<'a>(conn: &Conn, scope: &str, claims: impl Iterator<Item = (Key<'a>, &'a Deferred, Fate<'a>)>) {
    let mut by_partition: HashMap<pg_sys::Oid, Vec<Row>> = HashMap::new();
    for (k, c, fate) in claims {
        by_partition.entry(c.partition).or_default().push(row_of(k, c, fate));
    }
    for (partition, rows) in by_partition {
        crate::stats::count_serialization_failures(scope, || writer::insert_all(conn, partition, &rows));
    }
}

fn row_of<'a>(k: Key<'a>, c: &'a Deferred, fate: Fate) -> Row<'a> {
    let (status, payload, updated_at, expires_at) = match fate {
        Fate::Pending => ("pending", None, c.claimed_at, Some(c.expires_at)),
        Fate::Completed(payload) => ("completed", payload.map(|d| d.datum()), xact::clock(), None),
    };
    Row {
        scope: k.scope,
        key: k.key,
        status,
        token: Some(c.token),
        attempts: 1,
        fingerprint: c.fingerprint.as_deref(),
        payload,
        created_at: c.created_at,
        updated_at,
        expires_at,
    }
}

fn insert_pending(conn: &Conn, k: Key, c: &Deferred) {
    insert(conn, k, c, Fate::Pending);
}

/// Writes the key's claim as `pending` if it is remembered and unwritten: from here on the key has
/// its row, as if the claim had inserted it.
pub fn write_key(conn: &Conn, k: Key) {
    if CLAIMS.with_borrow(|claims| claims.is_empty()) {
        return;
    }
    let sub = xact::subtransaction();
    CLAIMS.with_borrow_mut(|claims| {
        if let Some(c) = claims.get_mut(&id(k)) {
            if c.written_in.is_none() {
                insert_pending(conn, k, c);
                c.written_in = Some(sub);
            }
        }
    });
}

/// Writes every unwritten claim of `scope` (every scope with None) as `pending`.
pub fn write_all(conn: &Conn, scope: Option<&str>) {
    if CLAIMS.with_borrow(|claims| claims.is_empty()) {
        return;
    }
    let sub = xact::subtransaction();
    CLAIMS.with_borrow_mut(|claims| {
        let unwritten = |(s, _): &(String, String), c: &Deferred| {
            c.written_in.is_none() && scope.is_none_or(|wanted| wanted == s)
        };
        let mut scopes: Vec<&str> = claims.iter().filter(|(id, c)| unwritten(id, c)).map(|((s, _), _)| s.as_str()).collect();
        scopes.sort_unstable();
        scopes.dedup();
        for s in scopes {
            let mine = claims.iter().filter(|(id, c)| unwritten(id, c) && id.0 == s);
            insert_all(conn, s, mine.map(|((s, key), c)| (Key { scope: s, key }, c, Fate::Pending)));
        }
        for (id, c) in claims.iter_mut() {
            if unwritten(id, c) {
                c.written_in = Some(sub);
            }
        }
    });
}

/// Whether this transaction remembers an unwritten claim of the key that `token` (None: any) holds: what
/// [`complete`] needs to complete it with one row.
pub fn unwritten(k: Key, token: Option<i64>) -> bool {
    CLAIMS.with_borrow(|claims| {
        claims.get(&id(k)).is_some_and(|c| c.written_in.is_none() && token.is_none_or(|t| t == c.token))
    })
}

/// `idem_complete` of a key whose claim this transaction remembers, unwritten: writes its one row,
/// completed, and returns true. False (nothing done) when there is no such claim, or when `token`
/// is not its token (the caller's usual path then writes the claim and refuses the call).
pub fn complete(conn: &Conn, k: Key, payload: Option<&Document>, token: Option<i64>) -> bool {
    if CLAIMS.with_borrow(|claims| claims.is_empty()) {
        return false;
    }
    let sub = xact::subtransaction();
    CLAIMS.with_borrow_mut(|claims| {
        let Some(c) = claims.get_mut(&id(k)) else {
            return false;
        };
        if c.written_in.is_some() || token.is_some_and(|t| t != c.token) {
            return false;
        }
        insert(conn, k, c, Fate::Completed(payload));
        c.written_in = Some(sub);
        true
    })
}

/// `idem_complete_batch` of keys whose claims this transaction remembers, each unwritten and held by its
/// token (see [`unwritten`]): writes their rows, completed, a partition's rows together.
pub fn complete_all(conn: &Conn, scope: &str, keys: &[&str], payloads: Option<&[Option<Document>]>) {
    let sub = xact::subtransaction();
    CLAIMS.with_borrow_mut(|claims| {
        let ids: Vec<(String, String)> = keys.iter().map(|key| id(Key { scope, key })).collect();
        let rows = ids.iter().zip(keys).enumerate().map(|(i, (id, key))| {
            let c = claims.get(id).expect("an unwritten claim");
            let payload = payloads.and_then(|p| p[i].as_ref());
            (Key { scope, key }, c, Fate::Completed(payload))
        });
        insert_all(conn, scope, rows);
        for id in &ids {
            claims.get_mut(id).expect("an unwritten claim").written_in = Some(sub);
        }
    });
}

/// Before the commit (or PREPARE TRANSACTION): the claims still unwritten become `pending` rows.
fn write_before_commit() {
    if CLAIMS.with_borrow(|claims| claims.iter().all(|(_, c)| c.written_in.is_some())) {
        return;
    }
    // The statement that committed has ended: its snapshot is gone. Run under the transaction's, as
    // PostgreSQL runs deferred triggers at this point.
    // SAFETY: pushes the transaction snapshot (valid until the transaction ends) and pops it below;
    // an ERROR in between aborts the transaction, which empties the snapshot stack itself.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    write_all(&Conn::open(), None);
    // SAFETY: pops the snapshot pushed above; the connection using it is closed.
    unsafe { pg_sys::PopActiveSnapshot() };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => write_before_commit(),
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE => {
            CLAIMS.with_borrow_mut(|claims| claims.clear());
            spi::forget_open();
        }
        _ => {}
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_event(
    event: pg_sys::SubXactEvent::Type,
    sub: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    match event {
        SUBXACT_EVENT_ABORT_SUB => CLAIMS.with_borrow_mut(|claims| {
            // Its claims go (their key locks went with the subtransaction), and the rows it wrote.
            claims.retain(|_, c| c.made_in != sub);
            for c in claims.values_mut() {
                if c.written_in == Some(sub) {
                    c.written_in = None;
                }
            }
        }),
        SUBXACT_EVENT_COMMIT_SUB => CLAIMS.with_borrow_mut(|claims| {
            for c in claims.values_mut() {
                if c.made_in == sub {
                    c.made_in = parent;
                }
                if c.written_in == Some(sub) {
                    c.written_in = Some(parent);
                }
            }
        }),
        _ => {}
    }
}

fn any_unwritten() -> bool {
    CLAIMS.with_borrow(|claims| claims.values().any(|c| c.written_in.is_none()))
}

/// Whether a statement reads or writes a relation of the storage's schema (a partition of the
/// record table, the table itself, one of the views).
///
/// # Safety
/// `qd` is the query descriptor ExecutorStart was given.
unsafe fn touches_storage(qd: *mut pg_sys::QueryDesc) -> bool {
    let stmt = (*qd).plannedstmt;
    if stmt.is_null() {
        return false;
    }
    let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), true);
    if schema == pg_sys::InvalidOid {
        return false;
    }
    let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg((*stmt).rtable);
    let touches = rtable.iter_ptr().any(|rte| {
        (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION && pg_sys::get_rel_namespace((*rte).relid) == schema
    });
    touches
}

static mut PREV_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;

/// Before a statement of the caller's that reads the storage: the remembered claims get their rows,
/// and the statement's snapshot is moved past them so that it sees them (its own transaction's
/// writes are visible by command id alone).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn executor_start(qd: *mut pg_sys::QueryDesc, eflags: std::ffi::c_int) {
    if !spi::in_storage() && any_unwritten() && touches_storage(qd) {
        write_all(&Conn::open(), None);
        pg_sys::CommandCounterIncrement();
        if !(*qd).snapshot.is_null() {
            (*(*qd).snapshot).curcid = pg_sys::GetCurrentCommandId(false);
        }
    }
    match PREV_EXECUTOR_START {
        Some(prev) => prev(qd, eflags),
        None => pg_sys::standard_ExecutorStart(qd, eflags),
    }
}

/// Process start: the transaction callbacks that write and forget the claims, and the executor
/// hook that writes them before a statement reads the storage.
pub fn init() {
    // SAFETY: registers static functions once per process (they live as long as the process) and
    // chains the executor hook in front of the one installed before, which it calls.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_transaction_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_event), std::ptr::null_mut());
        PREV_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
    }
}
