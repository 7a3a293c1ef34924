//! A `RETURNS TABLE` function that always answers exactly one row, without pgrx's set-returning
//! protocol.
//!
//! pgrx answers a `TableIterator` through PostgreSQL's value-per-call protocol: at every call it
//! makes a multi-call memory context, builds the result descriptor from the function's catalog
//! entry (`get_call_result_type`), blesses it, and is then called a second time only to say that
//! the set has ended. `idem_claim` answers one row, always. PostgreSQL lets a set-returning function
//! return a single value and leave `ReturnSetInfo.isDone` at `ExprSingleResult`, which the executor
//! reads as "this was the only row", in a `FROM` list and in a select list alike
//! (`ExecMakeTableFunctionResult`, `ExecMakeFunctionResultSet`). So this type returns its row at
//! once, formed with a descriptor built and blessed once per backend and function.
//!
//! The descriptor comes from the function's catalog entry, as pgrx's does, so the row carries the
//! declared column names (`row_to_json(idem_claim(...))`). When it is built it is checked against
//! the Rust row's column types: a library whose SQL definition is another version's raises 55000
//! rather than forming a row of the wrong shape.
//!
//! The type is named `TableIterator` because pgrx's `#[pg_extern]` reads a `RETURNS TABLE`'s column
//! names from a return type of that name, so the generated SQL is the same as for pgrx's own.
use crate::errors;
use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::{IntoDatum, IntoHeapTuple, PgMemoryContexts, PgTupleDesc};
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
pub trait Columns: IntoHeapTuple {
    fn types() -> Vec<pg_sys::Oid>;
}

macro_rules! columns {
    ($($C:ident),+) => {
        impl<$($C: IntoDatum),+> Columns for ($($C,)+) {
            fn types() -> Vec<pg_sys::Oid> {
                vec![$($C::type_oid()),+]
            }
        }
    };
}
columns!(A, B, C, D, E);

thread_local! {
    /// Blessed result descriptors in `TopMemoryContext`, by function OID. A function's OID never
    /// names another result shape (a changed `RETURNS TABLE` is a new function), so nothing is
    /// invalidated; an entry of a dropped function stays, a few hundred bytes, until the backend ends.
    static DESCRIPTORS: RefCell<Vec<(pg_sys::Oid, pg_sys::TupleDesc)>> = const { RefCell::new(Vec::new()) };
}

/// The blessed descriptor of the called function's result, built at its first call in this backend.
///
/// # Safety
/// `fcinfo` is the valid call information of a function declared `RETURNS TABLE`.
unsafe fn descriptor<Row: Columns>(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::TupleDesc {
    // SAFETY: the caller passes a valid fcinfo; its flinfo is set by the function manager.
    let function = unsafe { (*(*fcinfo).flinfo).fn_oid };
    let found = DESCRIPTORS.with_borrow(|all| all.iter().find(|(oid, _)| *oid == function).map(|(_, d)| *d));
    if let Some(desc) = found {
        return desc;
    }
    let mut declared: pg_sys::TupleDesc = std::ptr::null_mut();
    // SAFETY: get_call_result_type reads the function's catalog entry; it allocates in the current
    // (per-call) memory context and raises an ERROR rather than returning a bad descriptor.
    let class = unsafe { pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut declared) };
    let expected = Row::types();
    let matches = class == pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE
        && !declared.is_null()
        && {
            // SAFETY: a composite result comes with a valid descriptor; this view does not free it.
            let view = unsafe { PgTupleDesc::from_pg_unchecked(declared) };
            view.len() == expected.len() && view.iter().zip(&expected).all(|(a, t)| !a.attisdropped && a.atttypid == *t)
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
    DESCRIPTORS.with_borrow_mut(|all| all.push((function, desc)));
    desc
}

// SAFETY: box_into returns the datum of a tuple formed in the caller's memory context with the
// function's own (checked) result descriptor, as the value-per-call protocol's single result.
unsafe impl<Row: Columns> BoxRet for TableIterator<'_, Row> {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        // SAFETY: pgrx passes the call's valid fcinfo; the descriptor has Row's columns (checked
        // when it was built), so heap_form_tuple reads exactly Row's datums.
        unsafe {
            let raw = fcinfo.as_mut_ptr();
            let desc = descriptor::<Row>(raw);
            let info = (*raw).resultinfo;
            if !info.is_null() && (*info).type_ == pg_sys::NodeTag::T_ReturnSetInfo {
                (*info.cast::<pg_sys::ReturnSetInfo>()).isDone = pg_sys::ExprDoneCond::ExprSingleResult;
            }
            let tuple = self.0.into_heap_tuple(desc);
            fcinfo.return_raw_datum(pg_sys::HeapTupleHeaderGetDatum((*tuple).t_data))
        }
    }
}
