//! The calls whose form differs between the PostgreSQL majors the extension builds for (15 to 18), each
//! once, behind one signature; the rest of the plumbing calls these and has no `cfg` of its own.
//!
//! | what | 15 | 16 | 17 | 18 |
//! | --- | --- | --- | --- | --- |
//! | the range partition strategy | `#define` | enum | enum | enum |
//! | `ExecInsertIndexTuples` | 7 arguments | 8 (`onlySummarizing`) | 8 | 8 |
//! | `index_beginscan` | 5 arguments | 5 | 5 | 6 (`instrument`) |
//! | a tuple descriptor's attributes | `attrs[]` | `attrs[]` | `attrs[]` | after `compact_attrs[]` |
//! | a search path for one section | `PushOverrideSearchPath` | same | GUC nest level | same |
use pgrx::pg_sys;

/// The code of range partitioning, `'r'` in every major: a `#define` up to 15, a value of the
/// `PartitionStrategy` enum from 16 on. Compare a `strategy` field to it after `as u8` (a `c_char` in
/// `PartitionBoundSpec`, the enum in `PartitionBoundInfoData` from 16 on).
#[cfg(feature = "pg15")]
pub const PARTITION_STRATEGY_RANGE: u8 = pg_sys::PARTITION_STRATEGY_RANGE;
#[cfg(not(feature = "pg15"))]
pub const PARTITION_STRATEGY_RANGE: u8 = pg_sys::PartitionStrategy::PARTITION_STRATEGY_RANGE as u8;

/// `ExecInsertIndexTuples` for a plain insert: every index of the relation (16 added `onlySummarizing`,
/// which only an UPDATE that is HOT but for summarizing indexes sets), no ON CONFLICT arbiters. Called
/// unguarded, inside an `unguarded::section`.
///
/// # Safety
/// As `ExecInsertIndexTuples`: `result`'s indices are open (`ExecOpenIndices`), `slot` holds the tuple
/// just inserted into its relation, `estate` is a live executor state; and as a function of `unguarded`.
#[inline(always)]
pub unsafe fn insert_index_tuples(
    result: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
) {
    use super::unguarded::ExecInsertIndexTuples;
    let (conflict, arbiters) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the caller's contract is the function's own.
    unsafe {
        #[cfg(feature = "pg15")]
        ExecInsertIndexTuples(result, slot, estate, false, false, conflict, arbiters);
        #[cfg(not(feature = "pg15"))]
        ExecInsertIndexTuples(result, slot, estate, false, false, conflict, arbiters, false);
    }
}

/// `index_beginscan` without instrumentation (18 added the `instrument` argument, for EXPLAIN ANALYZE's
/// index search counts).
///
/// # Safety
/// As `index_beginscan`: `heap` and `index` are open, `index` is an index of `heap`, and `snapshot`
/// stays registered while the scan is in use.
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
    norderbys: i32,
) -> pg_sys::IndexScanDesc {
    // SAFETY: the caller's contract is the function's own.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        return pg_sys::index_beginscan(heap, index, snapshot, nkeys, norderbys);
        #[cfg(feature = "pg18")]
        return pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), nkeys, norderbys);
    }
}

/// The attributes of a tuple descriptor, one per column (dropped ones included). Up to 17 they are the
/// descriptor's `attrs` array; 18 puts a `CompactAttribute` array first and the full attributes after it,
/// where its `TupleDescAttr` finds them.
///
/// # Safety
/// `desc` is a valid tuple descriptor that outlives the slice.
pub unsafe fn tuple_desc_attrs<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    // SAFETY: a descriptor holds `natts` attributes in one array, whose start each branch finds as its
    // major's headers do.
    unsafe {
        let natts = (*desc).natts as usize;
        #[cfg(not(feature = "pg18"))]
        return (*desc).attrs.as_slice(natts);
        #[cfg(feature = "pg18")]
        return std::slice::from_raw_parts(pg_sys::TupleDescAttr(desc, 0), natts);
    }
}

/// A section in which name lookups see `pg_catalog` only (and, from 17 on, `pg_temp` last): what
/// `SECURITY DEFINER ... SET search_path = pg_catalog, pg_temp` gives a function, whatever the caller's
/// `search_path`. Ended by [`end_catalog_search_path`], in the same transaction and in LIFO order with
/// any other such section or GUC nest level (an ERROR in between ends it by the abort instead).
///
/// Up to 16: an override search path (`PushOverrideSearchPath`), which leaves the `search_path`
/// setting itself alone. 17 removed override search paths; as PostgreSQL 17's own maintenance commands
/// do (`RestrictSearchPath`), `search_path` is set to `pg_catalog, pg_temp` at a new GUC nest level.
/// That value is then what `current_setting('search_path')` shows inside the section, so code run
/// there that saves the setting and `SET`s it back at session level (pg_partman's `create_parent`)
/// would carry it out of the section if it ended as a function's `SET` clause does: the section ends
/// as an abort ends a nest level instead, discarding every setting made inside it. On 15 and 16 the
/// same code set the caller's own value back, so both end with the caller's `search_path` in force.
///
/// Returns what [`end_catalog_search_path`] needs.
pub fn begin_catalog_search_path() -> i32 {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        let mut path = pg_sys::OverrideSearchPath {
            schemas: std::ptr::null_mut(),
            addCatalog: true,
            addTemp: false,
            generation: 0,
        };
        // SAFETY: PushOverrideSearchPath copies the struct into its own memory; the pointer is only
        // read during the call.
        unsafe { pg_sys::PushOverrideSearchPath(&mut path) };
        0
    }
    #[cfg(not(any(feature = "pg15", feature = "pg16")))]
    {
        // SAFETY: opens a GUC nest level inside the current transaction and sets search_path at it
        // (GUC_ACTION_SAVE, as RestrictSearchPath does); the level is closed by
        // `end_catalog_search_path` or by the (sub)transaction's abort.
        unsafe {
            let nest_level = pg_sys::NewGUCNestLevel();
            pg_sys::RestrictSearchPath();
            nest_level
        }
    }
}

/// Ends the section [`begin_catalog_search_path`] began (`token` is what it returned): the caller's
/// search path is in force again.
///
/// # Safety
/// Called once per section, in the transaction that began it, after every section or GUC nest level
/// begun inside it has ended, and not while unwinding from an ERROR (the abort ends it).
pub unsafe fn end_catalog_search_path(token: i32) {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        let _ = token;
        // SAFETY: pops the override `begin_catalog_search_path` pushed, the top one (see the contract).
        unsafe { pg_sys::PopOverrideSearchPath() };
    }
    #[cfg(not(any(feature = "pg15", feature = "pg16")))]
    {
        // SAFETY: closes the nest level `begin_catalog_search_path` opened, the innermost one (see the
        // contract), discarding what was set at it and above, as a subtransaction's abort does.
        unsafe { pg_sys::AtEOXact_GUC(false, token) };
    }
}
