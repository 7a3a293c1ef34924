//! A thin layer over SPI with plans prepared once per backend.
//!
//! pgrx's `Spi` client decides on its own whether a statement runs read-only, and it cannot run a
//! statement under a snapshot of our choosing. The record lookups need exactly that: after waiting
//! for a key's lock they must see what the previous holder committed, even under REPEATABLE READ,
//! so they run under the latest snapshot (as PostgreSQL's foreign-key checks do).
use super::owner::AsOwner;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

/// One SQL statement with its parameter types; its plan is prepared on first use and kept.
/// The start of a statement that is planned at each call, with its arguments' values (see `Conn::plan`).
pub const PLANNED_PER_CALL: &str = "/* planned per call */";

pub struct Stmt {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

thread_local! {
    /// How many `Conn`s are open: the storage's own statements run while one is.
    static OPEN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Saved plans by statement and, for statements on one partition, the partition's oid.
    static PLANS: RefCell<HashMap<(usize, pg_sys::Oid), pg_sys::SPIPlanPtr>> = RefCell::new(HashMap::new());
}

/// Which snapshot a statement reads with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Snap {
    /// What a plain statement in a VOLATILE function sees: a new snapshot per statement under
    /// READ COMMITTED, the transaction snapshot under REPEATABLE READ and SERIALIZABLE.
    Statement,
    /// The newest committed state, whatever the isolation level.
    Latest,
}

/// An open SPI connection that runs as the owner of the record table, with `pg_catalog` as the
/// only search path (see [`AsOwner`]); closed, and the caller's role and search path given back,
/// when dropped. On an ERROR, PostgreSQL's (sub)transaction abort closes SPI itself.
pub struct Conn {
    _as_owner: AsOwner,
}

impl Conn {
    pub fn open() -> Conn {
        let as_owner = AsOwner::switch();
        // SAFETY: SPI_connect only pushes a new SPI stack level; it is popped by SPI_finish in
        // `drop`, or by the transaction's abort.
        let rc = unsafe { pg_sys::SPI_connect() };
        if rc < 0 {
            panic!("SPI_connect failed: {rc}");
        }
        OPEN.with(|n| n.set(n.get() + 1));
        Conn { _as_owner: as_owner }
    }

    fn plan(&self, stmt: &'static Stmt, partition: pg_sys::Oid) -> pg_sys::SPIPlanPtr {
        let id = (stmt as *const Stmt as usize, partition);
        if let Some(plan) = PLANS.with(|p| p.borrow().get(&id).copied()) {
            return plan;
        }
        let sql = if partition == pg_sys::InvalidOid {
            stmt.sql.to_string()
        } else {
            forget_dropped_partitions();
            stmt.sql.replace("{partition}", &qualified_name(partition))
        };
        let sql = CString::new(sql).expect("statement text has no NUL");
        let mut types = stmt.args.to_vec();
        // SAFETY: `sql` is NUL-terminated and `types` holds one type oid per parameter, both alive across
        // the call; the plan is checked for NULL and kept (SPI_keepplan) before any other SPI call.
        let plan = unsafe {
            // Generic plans only: a custom plan would be re-planned at every call (our updates
            // name one partition through $3, which makes custom plans look cheaper), and planning
            // costs more than running these statements.
            // Except a statement marked PLANNED_PER_CALL: one joined with an array argument, whose best plan
            // depends on the array's length and the table's size (a generic plan made while a partition was
            // nearly empty hashed the array against a seq scan of the partition, at every later call).
            let options = match stmt.sql.starts_with(PLANNED_PER_CALL) {
                true => pg_sys::CURSOR_OPT_CUSTOM_PLAN,
                false => pg_sys::CURSOR_OPT_GENERIC_PLAN,
            };
            let plan = pg_sys::SPI_prepare_cursor(sql.as_ptr(), types.len() as i32, types.as_mut_ptr(), options as i32);
            if plan.is_null() {
                let code = pg_sys::SPI_result;
                panic!("SPI_prepare failed ({code}) for: {}", stmt.sql);
            }
            pg_sys::SPI_keepplan(plan);
            plan
        };
        PLANS.with(|p| p.borrow_mut().insert(id, plan));
        plan
    }

    /// Runs a saved statement with the given arguments (already converted to datums).
    pub fn run(&self, stmt: &'static Stmt, args: &[Option<pg_sys::Datum>], snap: Snap) -> Rows<'_> {
        self.run_plan(stmt, pg_sys::InvalidOid, args, snap)
    }

    /// Runs a saved statement on one partition (or on the record table itself): `{partition}`
    /// in its text stands for the relation's qualified name. Each relation gets its own plan,
    /// made on first use.
    pub fn run_on(
        &self,
        stmt: &'static Stmt,
        partition: pg_sys::Oid,
        args: &[Option<pg_sys::Datum>],
        snap: Snap,
    ) -> Rows<'_> {
        assert!(partition != pg_sys::InvalidOid, "no partition for: {}", stmt.sql);
        self.run_plan(stmt, partition, args, snap)
    }

    fn run_plan(
        &self,
        stmt: &'static Stmt,
        partition: pg_sys::Oid,
        args: &[Option<pg_sys::Datum>],
        snap: Snap,
    ) -> Rows<'_> {
        assert_eq!(args.len(), stmt.args.len(), "argument count of: {}", stmt.sql);
        let plan = self.plan(stmt, partition);
        let mut values: Vec<pg_sys::Datum> =
            args.iter().map(|a| a.unwrap_or(pg_sys::Datum::from(0usize))).collect();
        let nulls: Vec<std::os::raw::c_char> =
            args.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as std::os::raw::c_char).collect();
        // SAFETY: the plan is a kept plan of this statement; `values` and `nulls` hold one entry per
        // parameter (asserted above) and live across the call; the latest snapshot is only read.
        let rc = unsafe {
            match snap {
                Snap::Statement => {
                    pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0)
                }
                Snap::Latest => pg_sys::SPI_execute_snapshot(
                    plan,
                    values.as_mut_ptr(),
                    nulls.as_ptr(),
                    pg_sys::GetLatestSnapshot(),
                    std::ptr::null_mut(),
                    false,
                    false,
                    0,
                ),
            }
        };
        if rc < 0 {
            panic!("SPI execution failed ({rc}) for: {}", stmt.sql);
        }
        Rows::current(self)
    }

    /// Runs a saved statement on one partition under the latest snapshot through a cursor, handing
    /// `each` its rows `batch` at a time: a result of any size is read in bounded memory.
    pub fn for_each_batch_on(&self, stmt: &'static Stmt, partition: pg_sys::Oid, batch: i64, mut each: impl FnMut(&Rows)) {
        assert!(stmt.args.is_empty(), "no arguments for a cursor: {}", stmt.sql);
        let plan = self.plan(stmt, partition);
        // SAFETY: the plan is a kept plan without parameters; the latest snapshot is pushed as the
        // active one for the cursor (read_only makes the portal use it) and popped once the cursor is
        // closed; each batch's tuple table is freed before the next fetch, after `each` is done with
        // it (the rows cannot outlive the closure call). An ERROR in between leaves the portal, the
        // snapshot and the tables to the (sub)transaction's cleanup.
        unsafe {
            pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot());
            let portal = pg_sys::SPI_cursor_open(std::ptr::null(), plan, std::ptr::null_mut(), std::ptr::null(), true);
            if portal.is_null() {
                panic!("SPI_cursor_open failed for: {}", stmt.sql);
            }
            loop {
                pg_sys::SPI_cursor_fetch(portal, true, batch);
                let rows = Rows::current(self);
                if rows.len() == 0 {
                    break;
                }
                each(&rows);
                pg_sys::SPI_freetuptable(pg_sys::SPI_tuptable);
            }
            pg_sys::SPI_cursor_close(portal);
            pg_sys::PopActiveSnapshot();
        }
    }

    /// Runs a one-off statement built at run time (DDL, or SQL naming a schema found at run time).
    pub fn execute(&self, sql: &str) -> Rows<'_> {
        let sql = CString::new(sql).expect("statement text has no NUL");
        // SAFETY: `sql` is NUL-terminated and lives across the call; SPI is connected (`self`).
        let rc = unsafe { pg_sys::SPI_execute(sql.as_ptr(), false, 0) };
        if rc < 0 {
            panic!("SPI_execute failed ({rc})");
        }
        Rows::current(self)
    }
}

/// Whether the statement being run is the storage's own (a `Conn` is open).
pub fn in_storage() -> bool {
    OPEN.with(|n| n.get() > 0)
}

/// Transaction end: no `Conn` can be open any more (an ERROR may have skipped a drop).
pub fn forget_open() {
    OPEN.with(|n| n.set(0));
}

impl Drop for Conn {
    fn drop(&mut self) {
        OPEN.with(|n| n.set(n.get().saturating_sub(1)));
        // Before the role and search path are given back (the field is dropped after this).
        if !std::thread::panicking() {
            // SAFETY: closes the SPI level `open` pushed; nothing of it is used afterwards (rows
            // borrow the connection, so they are gone).
            unsafe { pg_sys::SPI_finish() };
        }
    }
}

/// `schema.table` for a relation, quoted.
fn qualified_name(relid: pg_sys::Oid) -> String {
    // SAFETY: the relation exists (checked for a NULL name); both names are palloc'd C strings
    // read at once.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() {
            panic!("relation {} does not exist", relid.to_u32());
        }
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        format!(
            "{}.{}",
            quote_ident(&std::ffi::CStr::from_ptr(schema).to_string_lossy()),
            quote_ident(&std::ffi::CStr::from_ptr(name).to_string_lossy())
        )
    }
}

/// Frees the plans of partitions that retention has dropped since, so that a long-lived
/// backend keeps plans for the partitions that exist only. Runs when a partition is first seen.
fn forget_dropped_partitions() {
    let gone: Vec<(usize, pg_sys::Oid)> = PLANS.with(|p| {
        p.borrow()
            .keys()
            .filter(|(_, part)| {
                // SAFETY: a syscache lookup by oid, NULL for a dropped relation.
                *part != pg_sys::InvalidOid && unsafe { pg_sys::get_rel_name(*part) }.is_null()
            })
            .copied()
            .collect()
    });
    for id in gone {
        if let Some(plan) = PLANS.with(|p| p.borrow_mut().remove(&id)) {
            // SAFETY: a plan this backend prepared and kept, removed from the map so it is freed once.
            unsafe { pg_sys::SPI_freeplan(plan) };
        }
    }
}

/// The result of the last statement; values are copied out into Rust types.
pub struct Rows<'c> {
    table: *mut pg_sys::SPITupleTable,
    len: usize,
    _conn: std::marker::PhantomData<&'c Conn>,
}

impl<'c> Rows<'c> {
    fn current(_conn: &'c Conn) -> Rows<'c> {
        // SAFETY: reads SPI's globals right after the statement that set them; the rows borrow the
        // connection, so the tuple table is not freed while they live.
        unsafe {
            let table = pg_sys::SPI_tuptable;
            let len = pg_sys::SPI_processed as usize;
            Rows { table, len, _conn: std::marker::PhantomData }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn raw(&self, row: usize, col: usize) -> Option<pg_sys::Datum> {
        assert!(row < self.len && !self.table.is_null(), "row {row} out of range");
        let mut isnull = false;
        // SAFETY: `row` is within the result (asserted) and the tuple table lives as long as `self`.
        let datum = unsafe {
            let table = &*self.table;
            let tuple = *table.vals.add(row);
            pg_sys::SPI_getbinval(tuple, table.tupdesc, col as i32, &mut isnull)
        };
        if isnull {
            None
        } else {
            Some(datum)
        }
    }

    /// Column `col` (1-based) of row `row` (0-based), copied into `T`.
    pub fn get<T: FromDatum>(&self, row: usize, col: usize) -> Option<T> {
        let datum = self.raw(row, col)?;
        // SAFETY: a non-NULL datum of the column's type, from a live SPI tuple table.
        unsafe { T::from_datum(datum, false) }
    }

    /// A jsonb column, detoasted and copied out of SPI's memory.
    pub fn get_document(&self, row: usize, col: usize) -> Option<super::document::Document> {
        self.raw(row, col).map(super::document::Document::copy_out)
    }

    /// A timestamptz column as PostgreSQL's microseconds since 2000-01-01.
    pub fn get_ts(&self, row: usize, col: usize) -> Option<pg_sys::TimestampTz> {
        self.raw(row, col).map(|d| d.value() as i64)
    }
}

/// Converts one argument to a datum in the current memory context.
pub fn arg<T: IntoDatum>(value: T) -> Option<pg_sys::Datum> {
    value.into_datum()
}

/// A timestamptz argument from PostgreSQL's microseconds since 2000-01-01.
pub fn ts_arg(ts: pg_sys::TimestampTz) -> Option<pg_sys::Datum> {
    arg(TimestampWithTimeZone::try_from(ts).expect("valid timestamp"))
}

/// A tid argument (a row version's ctid), copied into the current memory context.
pub fn tid_arg(tid: pg_sys::ItemPointerData) -> Option<pg_sys::Datum> {
    // SAFETY: palloc'd memory of the tid's size is written once and handed to SPI as the
    // argument's datum, in the current memory context.
    unsafe {
        let copy =
            pg_sys::palloc(std::mem::size_of::<pg_sys::ItemPointerData>()) as *mut pg_sys::ItemPointerData;
        copy.write(tid);
        Some(pg_sys::Datum::from(copy))
    }
}

/// # Safety
/// `raw` is a NUL-terminated string that lives across the call (PostgreSQL's palloc'd result).
unsafe fn quoted(raw: *const std::os::raw::c_char) -> String {
    // SAFETY: as the caller promises.
    unsafe { std::ffi::CStr::from_ptr(raw) }.to_string_lossy().into_owned()
}

/// PostgreSQL's `quote_ident()`, for DDL built at run time.
pub fn quote_ident(ident: &str) -> String {
    let c = CString::new(ident).expect("identifier has no NUL");
    // SAFETY: `c` is NUL-terminated and outlives the call; the result is a palloc'd C string
    // (or `c` itself), valid while `c` lives.
    unsafe { quoted(pg_sys::quote_identifier(c.as_ptr())) }
}

/// PostgreSQL's `quote_literal()`, for DDL built at run time.
pub fn quote_literal(text: &str) -> String {
    let c = CString::new(text).expect("literal has no NUL");
    // SAFETY: `c` is NUL-terminated and outlives the call; the result is a palloc'd C string.
    unsafe { quoted(pg_sys::quote_literal_cstr(c.as_ptr())) }
}
