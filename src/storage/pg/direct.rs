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
        let (desc, estate, result) = unguarded::section(|| {
            let desc = fill_slots(rel, &columns, rows, &mut slots);
            let estate = unguarded::CreateExecutorState();
            let result = unguarded::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()) as *mut pg_sys::ResultRelInfo;
            unguarded::InitResultRelInfo(result, rel, 1, std::ptr::null_mut(), 0);
            (desc, estate, result)
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
            if copied(desc) {
                unguarded::FreeTupleDesc(desc);
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

/// Fills `slots` with `rows`, each column where `columns` says, and returns the descriptor they share: for
/// several rows a copy of `rel`'s, which the caller frees after dropping them (see [`copied`]). Called
/// unguarded.
///
/// A slot made on the relation's own descriptor (as `table_slot_create` makes it) pins it in the resource
/// owner, once per slot. The resource owner finds each of those identical entries by probing past the ones
/// before it, so a batch's group of n rows cost time growing with n² to remember and forget them. A copy is
/// counted by no one (`tdrefcount` -1), so making and dropping a slot on it is the same work at any n. One
/// row (`idem_once`, a claim) takes the relation's own, which costs less than a copy.
///
/// # Safety
/// `rel` is open; `columns` is its layout (each entry below the relation's number of attributes); every
/// datum of the rows is of its column's type; `slots` has one entry per row; inside an `unguarded::section`.
unsafe fn fill_slots(
    rel: pg_sys::Relation,
    columns: &[usize; 10],
    rows: &[Row],
    slots: &mut [*mut pg_sys::TupleTableSlot],
) -> pg_sys::TupleDesc {
    // SAFETY: the caller's contract; each slot's arrays have `natts` entries, which `columns` stays below.
    unsafe {
        let desc = match rows.len() {
            1 => (*rel).rd_att,
            _ => unguarded::CreateTupleDescCopy((*rel).rd_att),
        };
        let ops = unguarded::table_slot_callbacks(rel);
        let natts = (*desc).natts as usize;
        for (slot, row) in slots.iter_mut().zip(rows) {
            *slot = unguarded::MakeSingleTupleTableSlot(desc, ops);
            let (values, nulls) = ((**slot).tts_values, (**slot).tts_isnull);
            for at in 0..natts {
                *nulls.add(at) = true;
            }
            for (&at, datum) in columns.iter().zip(&datums(row)) {
                if let Some(d) = *datum {
                    *values.add(at) = d;
                    *nulls.add(at) = false;
                }
            }
            unguarded::ExecStoreVirtualTuple(*slot);
        }
        desc
    }
}

/// Whether `desc` is a copy [`fill_slots`] made (counted by no one), rather than a relation's own.
///
/// # Safety
/// `desc` is a valid tuple descriptor.
unsafe fn copied(desc: pg_sys::TupleDesc) -> bool {
    // SAFETY: the caller's contract.
    unsafe { (*desc).tdrefcount < 0 }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    /// A group's slots share one copy of the partition's descriptor, and making them pins nothing: the
    /// relation's descriptor keeps its reference count. Made on that descriptor, each slot pinned it in the
    /// resource owner, which made a group of n rows cost time growing with n².
    #[pg_test]
    fn a_groups_slots_pin_nothing() {
        Spi::run("SELECT idem_once('warm-up')").expect("a call runs");
        let partition = Spi::get_one::<pg_sys::Oid>(
            "SELECT i.inhrelid FROM pg_inherits i JOIN idempotency.records r ON r.tableoid = i.inhrelid LIMIT 1",
        )
        .expect("query runs")
        .expect("a partition holds the warm-up's row");
        let keys: Vec<String> = (0..100).map(|i| format!("k-{i}")).collect();
        // SAFETY: the partition is opened and closed here; the slots are made on it inside one section with
        // rows of its columns' types, and dropped with their descriptor before it is closed.
        unsafe {
            let rel = pg_sys::table_open(partition, pg_sys::RowExclusiveLock as i32);
            let (columns, (from, _)) = layout(rel).expect("a partition the direct insert writes");
            let rows: Vec<Row> = keys
                .iter()
                .map(|key| Row {
                    scope: "default",
                    key,
                    status: "completed",
                    token: None,
                    attempts: 1,
                    fingerprint: None,
                    payload: None,
                    created_at: from,
                    updated_at: from,
                    expires_at: None,
                })
                .collect();
            let before = (*(*rel).rd_att).tdrefcount;
            let mut slots = vec![std::ptr::null_mut::<pg_sys::TupleTableSlot>(); rows.len()];
            let desc = unguarded::section(|| fill_slots(rel, &columns, &rows, &mut slots));
            let during = (*(*rel).rd_att).tdrefcount;
            let key_of_last = pg_sys::slot_getattr(slots[99], columns[1] as i32 + 1, &mut false);
            let last = String::from_datum(key_of_last, false).expect("a key");
            for slot in slots {
                pg_sys::ExecDropSingleTupleTableSlot(slot);
            }
            assert!(copied(desc));
            pg_sys::FreeTupleDesc(desc);
            pg_sys::table_close(rel, pg_sys::NoLock as i32);
            assert_eq!(during, before, "the slots pinned the relation's descriptor");
            assert_eq!(last, "k-99");
        }
    }
}
