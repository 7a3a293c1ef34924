//! Where a partition of the record table keeps what a lookup reads: its lookup index and its column
//! numbers, learned once per backend and forgotten at the partition's relcache invalidation.
use super::catalog::Invalidated;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// The record columns a lookup reads, in the order of [`COLUMN_NAMES`].
#[derive(Clone, Copy)]
pub enum Col {
    Status,
    Token,
    Attempts,
    Fingerprint,
    ExpiresAt,
    Payload,
    Error,
}

const COLUMN_NAMES: [&std::ffi::CStr; 7] =
    [c"status", c"token", c"attempts", c"fingerprint", c"expires_at", c"payload", c"error"];

/// What a backend remembers about one partition: its lookup index and where the columns
/// are (a partition attached by a DBA may order its columns differently from the parent).
#[derive(Clone, Copy)]
pub struct Layout {
    pub index: pg_sys::Oid,
    /// The index is on `(key, scope)` (0.7.0 on), rather than `(scope, key)` (until the update to 0.7.0).
    pub key_first: bool,
    pub columns: [i32; 7],
}

thread_local! {
    static LAYOUTS: RefCell<HashMap<pg_sys::Oid, Layout>> = RefCell::new(HashMap::new());
}

/// Forgets what was learned from a partition whose relcache entry was invalidated (index rebuilt,
/// column dropped, partition dropped), or from all of them. Called by [`catalog`]'s callback.
pub fn forget_layouts(what: Invalidated) {
    LAYOUTS.with(|l| match what {
        Invalidated::RecordTable => l.borrow_mut().clear(),
        Invalidated::Relation(relid) => {
            l.borrow_mut().remove(&relid);
        }
    });
}

/// The lookup index of an open partition, on `(key, scope)` or `(scope, key)`, and its column numbers.
///
/// # Safety
/// `part` is an open relation, a leaf partition of the record table.
pub unsafe fn layout(part: pg_sys::Relation) -> Layout {
    let relid = (*part).rd_id;
    if let Some(found) = LAYOUTS.with(|l| l.borrow().get(&relid).copied()) {
        return found;
    }
    let desc = (*part).rd_att;
    let mut columns = [0i32; 7];
    for (slot, name) in columns.iter_mut().zip(COLUMN_NAMES) {
        *slot = pg_sys::SPI_fnumber(desc, name.as_ptr());
        if *slot <= 0 {
            panic!("partition {} of idempotency.records has no column {name:?}", name_of(part));
        }
    }
    let scope_col = pg_sys::SPI_fnumber(desc, c"scope".as_ptr()) as i16;
    let key_col = pg_sys::SPI_fnumber(desc, c"key".as_ptr()) as i16;
    let list = pg_sys::RelationGetIndexList(part);
    let mut index = pg_sys::InvalidOid;
    let mut key_first = false;
    for i in 0..if list.is_null() { 0 } else { (*list).length } {
        let candidate = (*(*list).elements.add(i as usize)).oid_value;
        let rel = pg_sys::index_open(candidate, pg_sys::AccessShareLock as i32);
        let form = (*rel).rd_index;
        // (The first two key columns, read only when the index has two: `indkey` has `indnatts` entries.)
        let leading = ((*form).indnkeyatts >= 2).then(|| (*form).indkey.values.as_slice(2));
        let usable = (*(*rel).rd_rel).relam == pg_sys::BTREE_AM_OID
            && (*form).indisvalid
            && (leading == Some(&[scope_col, key_col][..]) || leading == Some(&[key_col, scope_col][..]))
            && pg_sys::RelationGetIndexPredicate(rel).is_null();
        key_first = leading == Some(&[key_col, scope_col][..]);
        pg_sys::index_close(rel, pg_sys::NoLock as i32);
        if usable {
            index = candidate;
            break;
        }
    }
    if index == pg_sys::InvalidOid {
        crate::errors::partition_not_indexed(&name_of(part));
    }
    let found = Layout { index, key_first, columns };
    LAYOUTS.with(|l| l.borrow_mut().insert(relid, found));
    found
}

/// # Safety
/// `rel` is an open relation.
pub unsafe fn name_of(rel: pg_sys::Relation) -> String {
    std::ffi::CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned()
}

