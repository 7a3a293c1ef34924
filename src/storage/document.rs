//! `jsonb` values passed through untouched.
//!
//! Payloads and errors are stored and replayed, never looked into, so they travel as the jsonb
//! datums PostgreSQL hands us: no round trip through a JSON parser (which would cost time, bound
//! the nesting depth, and risk changing numbers), and their size is the stored size.
use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::nullable::Nullable;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;

/// A detoasted `jsonb` datum, valid in the memory context it was made in. Copies share it.
#[derive(Clone, Copy)]
pub struct Document(pg_sys::Datum);

impl Document {
    pub fn datum(&self) -> pg_sys::Datum {
        self.0
    }

    /// Size of the stored (binary) document in bytes.
    pub fn size(&self) -> usize {
        unsafe { pgrx::varlena::varsize_any(self.0.cast_mut_ptr()) }
    }

    /// Detoasts a datum read through SPI and copies it out of SPI's memory, which is freed when
    /// the SPI connection closes.
    pub fn copy_out(datum: pg_sys::Datum) -> Document {
        unsafe {
            let flat = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
            let size = pgrx::varlena::varsize_any(flat);
            let copy = pg_sys::SPI_palloc(size);
            std::ptr::copy_nonoverlapping(flat as *const u8, copy as *mut u8, size);
            Document(pg_sys::Datum::from(copy))
        }
    }
}

impl FromDatum for Document {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            None
        } else {
            Some(Document(pg_sys::Datum::from(unsafe {
                pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr())
            })))
        }
    }
}

impl IntoDatum for Document {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

unsafe impl SqlTranslatable for Document {
    const TYPE_IDENT: &'static str = concat!(module_path!(), "::Document");
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

unsafe impl<'fcx> ArgAbi<'fcx> for Document {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        unsafe { arg.unbox_arg_using_from_datum().expect("a non-null jsonb argument") }
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum().into() }
    }
}

unsafe impl BoxRet for Document {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

/// A `jsonb[]` argument, passed on to SQL as it came.
pub struct Documents(pg_sys::Datum);

impl Documents {
    pub fn datum(&self) -> pg_sys::Datum {
        self.0
    }

    /// The stored size of each element (None for a NULL element).
    pub fn sizes(&self) -> Vec<Option<usize>> {
        unsafe {
            let array = self.0.cast_mut_ptr::<pg_sys::ArrayType>();
            let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
            let mut nulls: *mut bool = std::ptr::null_mut();
            let mut n: i32 = 0;
            pg_sys::deconstruct_array(
                array,
                pg_sys::JSONBOID,
                -1,
                false,
                b'i' as i8,
                &mut elems,
                &mut nulls,
                &mut n,
            );
            (0..n as usize)
                .map(|i| {
                    if *nulls.add(i) {
                        None
                    } else {
                        Some(pgrx::varlena::varsize_any((*elems.add(i)).cast_mut_ptr()))
                    }
                })
                .collect()
        }
    }
}

impl FromDatum for Documents {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            None
        } else {
            Some(Documents(pg_sys::Datum::from(unsafe { pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) })))
        }
    }
}

impl IntoDatum for Documents {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBARRAYOID
    }
}

unsafe impl SqlTranslatable for Documents {
    const TYPE_IDENT: &'static str = concat!(module_path!(), "::Documents");
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb[]"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb[]")));
}

unsafe impl<'fcx> ArgAbi<'fcx> for Documents {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        unsafe { arg.unbox_arg_using_from_datum().expect("a non-null jsonb[] argument") }
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum().into() }
    }
}
