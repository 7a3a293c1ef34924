//! A new record's row inserted with the table and index access methods, as COPY FROM does, instead of
//! an SPI `INSERT`: that statement's executor (plan revalidation, node and expression setup, the
//! partition check, teardown) cost more than the insert itself. The row goes into the partition the
//! caller chose and locked (`partitions::insert_target`), whose range holds its `created_at`.
//!
//! The executor's other duties are kept or avoided: `heap_insert` takes the same SERIALIZABLE
//! conflict checks, WAL and statistics; `ExecInsertIndexTuples` fills every index of the partition,
//! expression and partial ones included, and raises a unique violation as the INSERT would. A
//! partition with triggers, CHECK constraints, generated columns, row security or columns beyond the
//! record's (a DBA's additions) is left to the SPI statement: [`insert_all`] then answers false. So is a
//! row whose `created_at` lies outside the partition's range as its catalog entry holds it: the
//! executor's partition check then refuses it with PostgreSQL's own error, where a direct insert would
//! have put it where no lookup by time finds it.
use super::catalog::Invalidated;
use super::unguarded;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// A record's columns, in the order of [`COLUMN_NAMES`].
pub struct Row<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub status: &'static str,
    pub token: Option<i64>,
    pub attempts: i32,
    pub fingerprint: Option<&'a str>,
    pub payload: Option<pg_sys::Datum>,
    pub created_at: pg_sys::TimestampTz,
    pub updated_at: pg_sys::TimestampTz,
    pub expires_at: Option<pg_sys::TimestampTz>,
}

const COLUMN_NAMES: [&std::ffi::CStr; 10] = [
    c"scope",
    c"key",
    c"status",
    c"token",
    c"attempts",
    c"fingerprint",
    c"payload",
    c"created_at",
    c"updated_at",
    c"expires_at",
];

/// What a backend knows about a partition: where each record column is (a partition attached by a
/// DBA may order its columns differently) and its range, or None when inserts there need the executor.
type Layout = Option<([usize; 10], (pg_sys::TimestampTz, pg_sys::TimestampTz))>;

thread_local! {
    static LAYOUTS: RefCell<HashMap<pg_sys::Oid, Layout>> = RefCell::new(HashMap::new());
}

/// Forgets what was learned from a relation whose relcache entry was invalidated (a trigger or
/// constraint added, a column dropped, the partition dropped), or from all of them.
pub fn forget_layouts(what: Invalidated) {
    LAYOUTS.with_borrow_mut(|l| match what {
        Invalidated::RecordTable => l.clear(),
        Invalidated::Relation(relid) => {
            l.remove(&relid);
        }
    });
}

/// # Safety
/// `rel` is an open relation.
unsafe fn layout(rel: pg_sys::Relation) -> Layout {
    let relid = (*rel).rd_id;
    if let Some(found) = LAYOUTS.with_borrow(|l| l.get(&relid).copied()) {
        return found;
    }
    let form = (*rel).rd_rel;
    let constr = (*(*rel).rd_att).constr;
    let plain = (*form).relkind as u8 == pg_sys::RELKIND_RELATION
        && (*rel).trigdesc.is_null()
        && !(*form).relrowsecurity
        && (constr.is_null() || ((*constr).num_check == 0 && !(*constr).has_generated_stored));
    // Every live column is a record column (`error`, always NULL here, is the eleventh): a column a
    // DBA added to the record table may have a default, which only the executor's INSERT applies.
    let desc = (*rel).rd_att;
    let live = super::compat::tuple_desc_attrs(desc).iter().filter(|a| !a.attisdropped).count();
    let mut columns = [0usize; 10];
    let mut found = plain && live == COLUMN_NAMES.len() + 1;
    for (slot, name) in columns.iter_mut().zip(COLUMN_NAMES) {
        let attnum = pg_sys::SPI_fnumber(desc, name.as_ptr());
        if attnum <= 0 {
            found = false;
            break;
        }
        *slot = attnum as usize - 1;
    }
    let range = super::bounds::partition_range(relid);
    let layout = if found { range.map(|r| (columns, r)) } else { None };
    LAYOUTS.with_borrow_mut(|l| l.insert(relid, layout));
    layout
}

/// Inserts `rows`, of distinct keys, into `partition` and returns true: one heap write for all of them, as
/// COPY makes (a WAL record per page rather than per row), then their index entries, the partition and its
/// indexes opened once. Returns false (nothing done) when the partition needs the executor's INSERT (see the
/// module's comment) or a row lies outside its range. The caller holds the keys' locks and has locked the
/// partition (RowExclusiveLock).
pub fn insert_all(partition: pg_sys::Oid, rows: &[Row]) -> bool {
    if rows.is_empty() {
        return true;
    }
    // SAFETY: the partition is locked by the caller, so it stays as opened; the slots, executor state
    // and result relation are made here for these rows and released before returning (an ERROR in
    // between leaves them to the (sub)transaction's memory and resource cleanup); every datum stored
    // in a slot is of its column's type and lives in the current memory context until then. The
    // sections call only `unguarded`'s functions, on raw pointers and plain values owned out here.
    unsafe {
        let rel = pg_sys::table_open(partition, pg_sys::RowExclusiveLock as i32);
        let Some((columns, (from, to))) = layout(rel) else {
            pg_sys::table_close(rel, pg_sys::NoLock as i32);
            return false;
        };
        // (The slots are filled through raw pointers below: every column the layout names is checked to
        // be one of the relation's, which it always is, as a layout is read from the same descriptor.)
        let natts = (*(*rel).rd_att).natts as usize;
        let outside = rows.iter().any(|row| !(from <= row.created_at && row.created_at < to));
        if outside || columns.iter().any(|&c| c >= natts) {
            pg_sys::table_close(rel, pg_sys::NoLock as i32);
            return false;
        }
        let mut slots = vec![std::ptr::null_mut::<pg_sys::TupleTableSlot>(); rows.len()];
        let (estate, result) = unguarded::section(|| {
            for (slot, row) in slots.iter_mut().zip(rows) {
                *slot = filled_slot(rel, &columns, &datums(row));
            }
            let estate = unguarded::CreateExecutorState();
            let result = unguarded::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()) as *mut pg_sys::ResultRelInfo;
            unguarded::InitResultRelInfo(result, rel, 1, std::ptr::null_mut(), 0);
            (estate, result)
        });
        // (The IndexInfos `result` points to, kept until the indexes are closed.)
        let _indexes = super::indexes::open_indices(result);
        unguarded::section(|| {
            // `table_multi_insert`, an inline function of tableam.h, calls the table access method's own.
            match ((*(*rel).rd_tableam).multi_insert, slots.as_mut_slice()) {
                (Some(multi_insert), many) if many.len() > 1 => {
                    let cid = unguarded::GetCurrentCommandId(true);
                    multi_insert(rel, many.as_mut_ptr(), many.len() as i32, cid, 0, std::ptr::null_mut());
                }
                (_, all) => {
                    for &mut slot in all {
                        unguarded::simple_table_tuple_insert(rel, slot);
                    }
                }
            }
            for &slot in &slots {
                if (*result).ri_NumIndices > 0 {
                    super::compat::insert_index_tuples(result, slot, estate);
                    // What evaluating index predicates and expressions left, as the executor frees it per row.
                    let econtext = (*estate).es_per_tuple_exprcontext;
                    if !econtext.is_null() {
                        unguarded::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
                    }
                }
                unguarded::ExecDropSingleTupleTableSlot(slot);
            }
            unguarded::ExecCloseIndices(result);
            unguarded::FreeExecutorState(estate);
            unguarded::table_close(rel, pg_sys::NoLock as i32);
            // As after an SPI INSERT: later commands of this transaction see the rows.
            unguarded::CommandCounterIncrement();
        });
    }
    true
}

/// `row`'s values in the order of [`COLUMN_NAMES`], None for NULL: its texts palloc'd in the current memory
/// context, without pgrx's guard of each (a row's three or four texts cost as many guards).
///
/// # Safety
/// Inside an `unguarded::section`.
#[inline(always)]
unsafe fn datums(row: &Row) -> [Option<pg_sys::Datum>; 10] {
    // SAFETY: the caller's contract.
    let text = |s: &str| Some(unsafe { unguarded::text_datum(s) });
    [
        text(row.scope),
        text(row.key),
        text(row.status),
        row.token.map(pg_sys::Datum::from),
        Some(pg_sys::Datum::from(row.attempts)),
        row.fingerprint.and_then(text),
        row.payload,
        Some(pg_sys::Datum::from(row.created_at)),
        Some(pg_sys::Datum::from(row.updated_at)),
        row.expires_at.map(pg_sys::Datum::from),
    ]
}

/// A slot of `rel` holding `datums`, each column where `columns` says. Called unguarded.
///
/// # Safety
/// `rel` is open; `columns` is its layout (each entry below the relation's number of attributes); every
/// datum is of its column's type; inside an `unguarded::section`.
#[inline(always)]
unsafe fn filled_slot(
    rel: pg_sys::Relation,
    columns: &[usize; 10],
    datums: &[Option<pg_sys::Datum>; 10],
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the caller's contract; the slot's arrays have `natts` entries, which `columns` stays below.
    unsafe {
        let slot = unguarded::table_slot_create(rel, std::ptr::null_mut());
        unguarded::ExecClearTuple(slot);
        let natts = (*(*slot).tts_tupleDescriptor).natts as usize;
        let (values, nulls) = ((*slot).tts_values, (*slot).tts_isnull);
        for at in 0..natts {
            *nulls.add(at) = true;
        }
        for (&at, datum) in columns.iter().zip(datums) {
            if let Some(d) = *datum {
                *values.add(at) = d;
                *nulls.add(at) = false;
            }
        }
        unguarded::ExecStoreVirtualTuple(slot);
        slot
    }
}
