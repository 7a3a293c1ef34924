//! The indexes a direct insert fills (`direct`), opened as the executor's `ExecOpenIndices` opens them,
//! with what it builds for each at every insert kept by the backend instead: the `IndexInfo` and the
//! partial index's predicate made ready to evaluate (together 3,000 instructions of each `idem_once`).
//! Kept per partition until a relcache invalidation of the partition, of one of its indexes or of the
//! record table: an index created, dropped, made ready or changed. Those invalidations are the ones that
//! give PostgreSQL's own list of the partition's indexes, read by `ExecOpenIndices`, its new value.
//!
//! Only for B-tree indexes without expressions or exclusion constraints (the extension's own, and a DBA's
//! alike): an expression's state is made in the executor state of the insert, and other access methods
//! keep per-insert state of their own. A partition with any other index is opened by `ExecOpenIndices`.
use super::catalog::Invalidated;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// What a backend keeps of a partition's indexes: None when one of them is not for keeping.
type Kept = Option<Rc<Indexes>>;

/// A partition's indexes, in the order of its index list, each with its `IndexInfo` (in `context`).
pub struct Indexes {
    list: Vec<(pg_sys::Oid, *mut pg_sys::IndexInfo)>,
    context: pg_sys::MemoryContext,
}

impl Drop for Indexes {
    fn drop(&mut self) {
        // SAFETY: the context was made for these IndexInfos alone; nothing else points into it once the
        // last holder (a map entry, or an insert under way) lets go.
        unsafe { pg_sys::MemoryContextDelete(self.context) };
    }
}

thread_local! {
    static KEPT: RefCell<HashMap<pg_sys::Oid, Kept>> = RefCell::new(HashMap::new());
}

/// Forgets what was kept of a partition whose relcache entry, or one of whose indexes', was invalidated,
/// or of all of them. Called by [`super::catalog`]'s callback. (An insert under way keeps its own
/// reference until it closes the indexes.)
pub fn forget(what: Invalidated) {
    KEPT.with_borrow_mut(|kept| kept.retain(|part, indexes| !stale(*part, indexes, what)));
}

/// Whether `what` makes what is kept of partition `part` stale: an invalidation of the record table, of the
/// partition or of one of its indexes.
fn stale(part: pg_sys::Oid, kept: &Kept, what: Invalidated) -> bool {
    match what {
        Invalidated::RecordTable => true,
        Invalidated::Relation(relid) => {
            part == relid || kept.as_ref().is_some_and(|i| i.list.iter().any(|(index, _)| *index == relid))
        }
    }
}

/// Opens the indexes of `result`'s relation for inserts (`RowExclusiveLock`), as `ExecOpenIndices`
/// does, and fills in `result`'s index fields; `ExecCloseIndices` closes them. Returns what must live
/// until then (the IndexInfos `result` points to).
///
/// # Safety
/// `result` was made by `InitResultRelInfo` for an open leaf partition, its indexes not opened yet.
pub unsafe fn open_indices(result: *mut pg_sys::ResultRelInfo) -> Kept {
    let rel = (*result).ri_RelationDesc;
    let relid = (*rel).rd_id;
    let kept = match KEPT.with_borrow(|k| k.get(&relid).cloned()) {
        Some(kept) => kept,
        None => {
            // (Opening the indexes may process invalidations: what was read meanwhile is not kept.)
            let (built, settled) =
                super::catalog::read_for_cache(|| build(rel), |built, what| stale(relid, built, what));
            if settled {
                KEPT.with_borrow_mut(|k| k.insert(relid, built.clone()));
            }
            built
        }
    };
    let Some(indexes) = &kept else {
        pg_sys::ExecOpenIndices(result, false);
        return None;
    };
    let n = indexes.list.len();
    (*result).ri_NumIndices = n as i32;
    if n > 0 {
        let (desc_bytes, info_bytes) =
            (n * std::mem::size_of::<pg_sys::Relation>(), n * std::mem::size_of::<*mut pg_sys::IndexInfo>());
        // (One guard for the whole loop: it calls only `unguarded`'s functions, on plain values.)
        super::unguarded::section(|| {
            let descs = super::unguarded::palloc0(desc_bytes) as *mut pg_sys::Relation;
            let infos = super::unguarded::palloc0(info_bytes) as *mut *mut pg_sys::IndexInfo;
            for (i, (index, info)) in (0..n).zip(indexes.list.iter()) {
                *descs.add(i) = super::unguarded::index_open(*index, pg_sys::RowExclusiveLock as i32);
                *infos.add(i) = *info;
            }
            (*result).ri_IndexRelationDescs = descs;
            (*result).ri_IndexRelationInfo = infos;
        });
    }
    kept
}

/// The IndexInfos of `rel`'s indexes, the predicates ready: None when an index is not for keeping.
///
/// # Safety
/// `rel` is an open leaf partition.
unsafe fn build(rel: pg_sys::Relation) -> Kept {
    let context = pg_sys::AllocSetContextCreateInternal(
        pg_sys::TopMemoryContext,
        c"idempotency: a partition's indexes".as_ptr(),
        0,
        1024,
        8192,
    );
    let indexes = Rc::new(Indexes { list: Vec::new(), context });
    let caller = pg_sys::MemoryContextSwitchTo(context);
    let list = pg_sys::RelationGetIndexList(rel);
    let mut built = Vec::new();
    let mut keep = true;
    for i in 0..if list.is_null() { 0 } else { (*list).length } {
        let oid = (*(*list).elements.add(i as usize)).oid_value;
        let index = pg_sys::index_open(oid, pg_sys::RowExclusiveLock as i32);
        let info = pg_sys::BuildIndexInfo(index);
        keep &= (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
            && (*info).ii_Expressions.is_null()
            && (*info).ii_ExclusionOps.is_null();
        if keep && !(*info).ii_Predicate.is_null() {
            // What ExecPrepareQual would make at the first insert, here in the kept context.
            let planned = pg_sys::expression_planner((*info).ii_Predicate as *mut pg_sys::Expr);
            (*info).ii_PredicateState = pg_sys::ExecInitQual(planned as *mut pg_sys::List, std::ptr::null_mut());
        }
        // (Released as ExecCloseIndices releases it: the insert opens the index again.)
        pg_sys::index_close(index, pg_sys::RowExclusiveLock as i32);
        built.push((oid, info));
    }
    pg_sys::list_free(list);
    pg_sys::MemoryContextSwitchTo(caller);
    if !keep {
        return None; // (the context goes with `indexes`)
    }
    let mut indexes = Rc::into_inner(indexes).expect("not shared yet");
    indexes.list = built;
    Some(Rc::new(indexes))
}
