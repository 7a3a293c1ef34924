//! Scope and consumer-group grants: which roles may call with which scope or group.
//!
//! Off until the first grant of a kind exists (or `idempotency.require_scope_grants` is on): without
//! grants every consumer is trusted with every scope, as before 0.6.0. Once on, a caller that is not a
//! superuser must hold (through role membership) a grant whose pattern matches the name: the name itself,
//! or a prefix followed by `*`.
//!
//! The grants live in `idempotency.scope_grants`. Each backend reads them once and keeps them until that
//! table's relcache entry is invalidated, which a statement trigger on the table sends at every change
//! ([`forget`]); role membership changes clear the per-role answers ([`init`]). A call then costs one
//! hash lookup, or nothing while no grant exists.
use super::pg::catalog::{self, Invalidated};
use super::pg::latest;
use pgrx::FromDatum;
use crate::gucs;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// What a grant names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Scope,
    Group,
}

impl Kind {
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Scope => "scope",
            Kind::Group => "consumer group",
        }
    }
}

/// A grant's pattern: a whole name, or a prefix (written with a trailing `*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    pub fn parse(text: &str) -> Pattern {
        match text.strip_suffix('*') {
            Some(prefix) => Pattern::Prefix(prefix.to_string()),
            None => Pattern::Exact(text.to_string()),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Exact(n) => n == name,
            Pattern::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// The grants of one database as this backend last read them, and the answers given since.
#[derive(Default)]
struct Known {
    grants: Vec<(pg_sys::Oid, Kind, Pattern)>,
    answers: HashMap<(pg_sys::Oid, Kind), HashMap<String, bool>>,
}

thread_local! {
    static KNOWN: RefCell<Option<Known>> = const { RefCell::new(None) };
    static TABLE: std::cell::Cell<pg_sys::Oid> = const { std::cell::Cell::new(pg_sys::InvalidOid) };
}

/// Answers kept per role and kind before they are forgotten and worked out again.
const MAX_ANSWERS: usize = 10_000;

/// Registers the callbacks that forget answers when role memberships change. Once per process.
pub fn init() {
    // SAFETY: registers a `#[pg_guard]`ed function with PostgreSQL's syscache callback table of this
    // process, for two syscaches that exist in every supported version.
    unsafe {
        for cache in [pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM, pg_sys::SysCacheIdentifier::AUTHOID] {
            pg_sys::CacheRegisterSyscacheCallback(cache as i32, Some(roles_changed), pg_sys::Datum::from(0usize));
        }
    }
}

/// # Safety
/// Called by PostgreSQL's invalidation processing only.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn roles_changed(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    KNOWN.with_borrow_mut(|k| {
        if let Some(known) = k {
            known.answers.clear();
        }
    });
}

/// Forgets the grants when `idempotency.scope_grants` (or every relation) was invalidated. Called by
/// the catalog's relcache callback.
pub fn forget(what: Invalidated) {
    if stale(TABLE.with(|t| t.get()), what) {
        KNOWN.with_borrow_mut(|k| *k = None);
        TABLE.with(|t| t.set(pg_sys::InvalidOid));
    }
}

/// Whether `what` makes the grants read from `table` (the grants table's oid) stale: an invalidation of the
/// record table (or of every relation), or of the grants table.
fn stale(table: pg_sys::Oid, what: Invalidated) -> bool {
    match what {
        Invalidated::RecordTable => true,
        Invalidated::Relation(relid) => relid == table,
    }
}

/// Tells every backend to read the grants again, at this transaction's commit: what the table's
/// trigger calls after each statement that changed it.
pub fn changed() {
    let table = table_oid();
    if table != pg_sys::InvalidOid {
        // SAFETY: queues a relcache invalidation of an existing relation for the end of this transaction.
        unsafe { pg_sys::CacheInvalidateRelcacheByRelid(table) };
    }
}

/// The grants table's oid; InvalidOid on a schema that predates it (before ALTER EXTENSION UPDATE).
fn table_oid() -> pg_sys::Oid {
    let cached = TABLE.with(|t| t.get());
    if cached != pg_sys::InvalidOid {
        return cached;
    }
    // SAFETY: catalog lookups by name; a missing schema is an ERROR as for every other storage call.
    let oid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), false);
        pg_sys::get_relname_relid(c"scope_grants".as_ptr(), schema)
    };
    TABLE.with(|t| t.set(oid));
    oid
}

fn load() -> Known {
    let mut known = Known::default();
    if table_oid() == pg_sys::InvalidOid {
        return known;
    }
    // Read without predicate locks (see `pg::latest`): a grant made while SERIALIZABLE consumers run must
    // not conflict with each of them.
    let mut grants = Vec::new();
    // SAFETY: inside the caller's transaction; `table_oid` found the table, whose columns these are.
    unsafe {
        latest::each_row(table_oid(), &[c"role", c"kind", c"pattern"], |v| {
            let [Some(role), Some(kind), Some(pattern)] = v else {
                return; // NOT NULL columns
            };
            let text = |d: pg_sys::Datum| String::from_datum(d, false).expect("text");
            let kind = if text(*kind) == "scope" { Kind::Scope } else { Kind::Group };
            grants.push((pg_sys::Oid::from(role.value() as u32), kind, Pattern::parse(&text(*pattern))));
        });
    }
    known.grants = grants;
    known
}

/// Whether the current user may call with `name` as a scope or group. True while grants of that kind
/// are off; always true for superusers.
pub fn allowed(kind: Kind, name: &str) -> bool {
    if KNOWN.with_borrow(|k| k.is_some()) {
        return decide(kind, name);
    }
    let table = table_oid();
    let (known, settled) = catalog::read_for_cache(load, |_, what| stale(table, what));
    KNOWN.with_borrow_mut(|k| *k = Some(known));
    let answer = decide(kind, name);
    if !settled {
        // Read while the grants kept changing: good for this call (as any concurrent read), not to keep.
        KNOWN.with_borrow_mut(|k| *k = None);
    }
    answer
}

/// [`allowed`] with the grants loaded.
fn decide(kind: Kind, name: &str) -> bool {
    // SAFETY: reads the current user id, set for the whole call.
    let user = unsafe { pg_sys::GetUserId() };
    // Looked at without holding the borrow across catalog lookups: a lookup may process invalidations,
    // whose callbacks ([`forget`], `roles_changed`) borrow the same cell.
    let (enforced, known_answer, grants) = KNOWN.with_borrow(|k| {
        let known = k.as_ref().expect("loaded by allowed");
        let enforced = gucs::require_scope_grants() || known.grants.iter().any(|(_, k, _)| *k == kind);
        let answer = known.answers.get(&(user, kind)).and_then(|a| a.get(name).copied());
        let grants: Vec<(pg_sys::Oid, Pattern)> = if enforced && answer.is_none() {
            known.grants.iter().filter(|(_, k, _)| *k == kind).map(|(r, _, p)| (*r, p.clone())).collect()
        } else {
            Vec::new()
        };
        (enforced, answer, grants)
    });
    if !enforced {
        return true;
    }
    if let Some(answer) = known_answer {
        return answer;
    }
    let answer = is_superuser() || grants.iter().any(|(role, pattern)| pattern.matches(name) && member_of(user, *role));
    KNOWN.with_borrow_mut(|k| {
        // Forgotten meanwhile (an invalidation): the answer is still right for this call.
        if let Some(known) = k {
            let answers = known.answers.entry((user, kind)).or_default();
            // Scopes can be many (one per tenant, per order...): the answers kept are bounded.
            if answers.len() >= MAX_ANSWERS {
                answers.clear();
            }
            answers.insert(name.to_string(), answer);
        }
    });
    answer
}

fn is_superuser() -> bool {
    // SAFETY: a lookup of the current user in PostgreSQL's role cache.
    unsafe { pg_sys::superuser() }
}

/// Whether `user` has the privileges of `role` (a grant whose role was dropped is never held).
fn member_of(user: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    // SAFETY: a lookup in PostgreSQL's role membership cache; unknown roles answer false.
    unsafe { pg_sys::has_privs_of_role(user, role) }
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    #[test]
    fn patterns_match_whole_names_or_prefixes() {
        assert!(Pattern::parse("orders").matches("orders"));
        assert!(!Pattern::parse("orders").matches("orders-2"));
        assert!(Pattern::parse("tenant-7/*").matches("tenant-7/orders"));
        assert!(!Pattern::parse("tenant-7/*").matches("tenant-70/orders"));
        assert!(Pattern::parse("*").matches("anything"));
    }
}
