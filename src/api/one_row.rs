//! A `RETURNS TABLE` function that always answers exactly one row, without pgrx's value-per-call
//! protocol.
//!
//! pgrx answers a `TableIterator` through PostgreSQL's value-per-call protocol: at every call it
//! makes a multi-call memory context, builds the result descriptor from the function's catalog
//! entry (`get_call_result_type`), blesses it, and is then called a second time only to say that
//! the set has ended. `idem_claim` answers one row, always. This type answers it in materialize
//! mode instead: the row goes into a tuplestore at the first and only call, formed with a
//! descriptor built and blessed once per backend and function. A `FROM` list reads that tuplestore
//! as it is (in value-per-call mode the executor would have copied the row into one of its own); a
//! select list reads the row from it and then the end of the set, so the function is never called
//! again for the same row, also beside another set-returning function (`SELECT idem_claim(k),
//! generate_series(1, 3)` claims once, as pgrx's protocol and the SQL edition do).
//!
//! The descriptor comes from the function's catalog entry, as pgrx's does, so the row carries the
//! declared column names (`row_to_json(idem_claim(...))`). When it is built, before the function's
//! body runs, it is checked against the Rust row's column types: a library whose SQL definition is
//! another version's raises 55000, having done and counted nothing, rather than forming a row of
//! the wrong shape.
//!
//! The type is named `TableIterator` because pgrx's `#[pg_extern]` reads a `RETURNS TABLE`'s column
//! names from a return type of that name, so the generated SQL is the same as for pgrx's own.
use crate::errors;
use pgrx::callconv::{CallCx, RetAbi};
use pgrx::pg_sys;
use pgrx::{IntoDatum, IntoHeapTuple, PgMemoryContexts, PgTupleDesc};
use std::any::TypeId;
use std::cell::RefCell;
use std::marker::PhantomData;

/// One row of `Row`'s columns (a tuple of `name!(column, Type)`), answered as the only row of the set.
pub struct TableIterator<'a, Row>(Row, PhantomData<&'a ()>);

impl<Row> TableIterator<'static, Row> {
    pub fn once(row: Row) -> Self {
        Self(row, PhantomData)
    }
}

/// A row's column types, to check the function's declared result against.
pub trait Columns: IntoHeapTuple + 'static {
    fn types() -> Vec<pg_sys::Oid>;
}

macro_rules! columns {
    ($($C:ident),+) => {
        impl<$($C: IntoDatum + 'static),+> Columns for ($($C,)+) {
            fn types() -> Vec<pg_sys::Oid> {
                vec![$($C::type_oid()),+]
            }
        }
    };
}
columns!(A, B, C, D, E);

thread_local! {
    /// Blessed result descriptors in `TopMemoryContext`, by function OID and the Rust row they were
    /// checked against. A `RETURNS TABLE` function's OID never names another result shape (a changed
    /// one is a new function: `CREATE OR REPLACE` refuses it), so nothing is invalidated; an entry of a
    /// dropped function stays, a few hundred bytes, until the backend ends.
    static DESCRIPTORS: RefCell<Vec<(pg_sys::Oid, TypeId, pg_sys::TupleDesc)>> = const { RefCell::new(Vec::new()) };
}

/// The blessed descriptor of the called function's result, built and checked at its first call in
/// this backend; 55000 when the function's declared result is not a set of anonymous rows of `Row`'s
/// types.
///
/// # Safety
/// `fcinfo` is the valid call information of the function being called.
unsafe fn descriptor<Row: Columns>(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::TupleDesc {
    // SAFETY: the caller passes a valid fcinfo; its flinfo is set by the function manager.
    let function = unsafe { (*(*fcinfo).flinfo).fn_oid };
    let row = TypeId::of::<Row>();
    let found = DESCRIPTORS.with_borrow(|all| all.iter().find(|e| e.0 == function && e.1 == row).map(|e| e.2));
    if let Some(desc) = found {
        return desc;
    }
    let mut declared: pg_sys::TupleDesc = std::ptr::null_mut();
    // SAFETY: get_call_result_type reads the function's catalog entry and allocates in the current
    // (per-call) memory context; it may answer another class or no descriptor, checked below.
    let class = unsafe { pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut declared) };
    let expected = Row::types();
    // Only an anonymous row (RETURNS TABLE): a named composite type can change under the same OID.
    // SAFETY: as above.
    let returns_set = unsafe { (*(*fcinfo).flinfo).fn_retset };
    let matches = returns_set
        && class == pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE
        && !declared.is_null()
        && {
            // SAFETY: a composite result comes with a valid descriptor; this view does not free it.
            let view = unsafe { PgTupleDesc::from_pg_unchecked(declared) };
            view.oid() == pg_sys::RECORDOID
                && view.len() == expected.len()
                && view.iter().zip(&expected).all(|(a, t)| !a.attisdropped && a.atttypid == *t)
        };
    if !matches {
        // SAFETY: format_procedure names any OID (a missing one as its number) in a palloc'd string.
        let name = unsafe { std::ffi::CStr::from_ptr(pg_sys::format_procedure(function)) };
        errors::definition_mismatch(&name.to_string_lossy());
    }
    let desc = PgMemoryContexts::TopMemoryContext.switch_to(|_| {
        // SAFETY: a copy of a valid descriptor, blessed (registered as a record type for this
        // backend) in TopMemoryContext, so it outlives the call.
        unsafe { pg_sys::BlessTupleDesc(pg_sys::CreateTupleDescCopy(declared)) }
    });
    DESCRIPTORS.with_borrow_mut(|all| all.push((function, row, desc)));
    desc
}

/// The call's ReturnSetInfo, which must take a tuplestore (0A000 otherwise).
///
/// # Safety
/// `fcinfo` is the valid call information of the function being called.
unsafe fn materialize_into(fcinfo: pg_sys::FunctionCallInfo) -> *mut pg_sys::ReturnSetInfo {
    // SAFETY: a valid fcinfo's resultinfo is null or points to a node.
    unsafe {
        let info = (*fcinfo).resultinfo;
        if info.is_null() || (*info).type_ != pg_sys::NodeTag::T_ReturnSetInfo {
            errors::no_set_accepted();
        }
        let rsinfo = info.cast::<pg_sys::ReturnSetInfo>();
        if (*rsinfo).allowedModes & pg_sys::SetFunctionReturnMode::SFRM_Materialize as i32 == 0 {
            errors::no_materialize();
        }
        rsinfo
    }
}

// SAFETY: the caller and the declared result are checked before the function's body runs (in
// check_fcinfo_and_prepare, which pgrx's wrapper calls first), and the body runs in the call's own
// memory context, as for any function returning one value. The row is answered in materialize mode,
// as the executor's ReturnSetInfo allows: a tuplestore made in the query's memory holding the one row,
// formed with the function's own (checked) descriptor, and a copy of that descriptor, which the
// executor frees once it has checked it. No other method is used for a type that is not multi-call.
unsafe impl<Row: Columns> RetAbi for TableIterator<'_, Row> {
    type Item = Self;
    type Ret = Self;

    unsafe fn check_fcinfo_and_prepare(fcinfo: pg_sys::FunctionCallInfo) -> CallCx {
        // SAFETY: pgrx passes the call's valid fcinfo.
        unsafe {
            materialize_into(fcinfo);
            descriptor::<Row>(fcinfo);
            CallCx::WrappedFn(pg_sys::CurrentMemoryContext)
        }
    }

    fn to_ret(self) -> Self {
        self
    }

    unsafe fn box_ret_in_fcinfo(fcinfo: pg_sys::FunctionCallInfo, ret: Self) -> pg_sys::Datum {
        // SAFETY: pgrx passes the call's valid fcinfo, checked in check_fcinfo_and_prepare; the
        // descriptor has Row's columns, so heap_form_tuple reads exactly Row's datums, and the
        // tuplestore copies the row into the query's memory.
        unsafe {
            let rsinfo = materialize_into(fcinfo);
            let desc = descriptor::<Row>(fcinfo);
            let tuple = ret.0.into_heap_tuple(desc);
            let random = (*rsinfo).allowedModes & pg_sys::SetFunctionReturnMode::SFRM_Materialize_Random as i32 != 0;
            PgMemoryContexts::For((*(*rsinfo).econtext).ecxt_per_query_memory).switch_to(|_| {
                let store = pg_sys::tuplestore_begin_heap(random, false, pg_sys::work_mem);
                pg_sys::tuplestore_puttuple(store, tuple);
                (*rsinfo).returnMode = pg_sys::SetFunctionReturnMode::SFRM_Materialize;
                (*rsinfo).setResult = store;
                (*rsinfo).setDesc = pg_sys::CreateTupleDescCopy(desc);
            });
            (*fcinfo).isnull = false;
            pg_sys::Datum::from(0)
        }
    }

    unsafe fn move_into_fcinfo_fcx(self, _fcinfo: pg_sys::FunctionCallInfo) {}

    unsafe fn fill_fcinfo_fcx(&self, _fcinfo: pg_sys::FunctionCallInfo) {}
}
