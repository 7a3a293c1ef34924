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
        // SAFETY: the datum is a detoasted varlena (made so by from_datum or copy_out), valid in
        // the memory context it was made in, which outlives this call.
        unsafe { pgrx::varlena::varsize_any(self.0.cast_mut_ptr()) }
    }

    /// Detoasts a datum read through SPI and copies it out of SPI's memory, which is freed when
    /// the SPI connection closes.
    pub fn copy_out(datum: pg_sys::Datum) -> Document {
        // SAFETY: `datum` is a jsonb datum read by SPI or a probe while its tuple is pinned; it is
        // detoasted into fresh memory, then copied byte for byte (its own varlena size) into SPI's
        // upper memory context, which outlives the SPI connection.
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
            // SAFETY: a non-NULL jsonb argument or column, which PostgreSQL hands over valid for the call.
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

// SAFETY: jsonb is the SQL type of this datum in both directions, as declared here.
unsafe impl SqlTranslatable for Document {
    const TYPE_IDENT: &'static str = concat!(module_path!(), "::Document");
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

// SAFETY: the argument is unboxed with FromDatum above, which accepts any jsonb datum.
unsafe impl<'fcx> ArgAbi<'fcx> for Document {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // SAFETY: the caller (pgrx's argument unboxing) guarantees a non-NULL jsonb argument here.
        unsafe { arg.unbox_arg_using_from_datum().expect("a non-null jsonb argument") }
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        // SAFETY: pgrx's argument unboxing hands over a jsonb argument, NULL or not.
        unsafe { arg.unbox_arg_using_from_datum().into() }
    }
}

// SAFETY: the datum returned is a jsonb varlena allocated in a context that outlives the call.
unsafe impl BoxRet for Document {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        // SAFETY: `self.0` is a valid jsonb datum in the function's memory context.
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

/// A `jsonb[]` argument, passed on to SQL as it came.
pub struct Documents(pg_sys::Datum);

impl Documents {
    pub fn datum(&self) -> pg_sys::Datum {
        self.0
    }

    /// The number of elements, read from the array's header without converting any.
    pub fn len(&self) -> usize {
        // SAFETY: `self.0` is a detoasted jsonb[] (from from_datum); its `ndim` dimensions follow the
        // ArrayType header (C's ARR_DIMS), and ArrayGetNItems raises an ERROR on an overflowing product.
        unsafe {
            let array = self.0.cast_mut_ptr::<pg_sys::ArrayType>();
            let dims = (array as *mut u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *mut i32;
            pg_sys::ArrayGetNItems((*array).ndim, dims) as usize
        }
    }

    /// The stored size of each element (None for a NULL element).
    pub fn sizes(&self) -> Vec<Option<usize>> {
        self.elements().iter().map(|d| d.map(|d| d.size())).collect()
    }

    /// Each element (None for a NULL one), pointing into the array, which lives as long as the call.
    pub fn elements(&self) -> Vec<Option<Document>> {
        // SAFETY: `self.0` is a detoasted jsonb[] (from from_datum); deconstruct_array fills the three
        // out-pointers with arrays of `n` elements, which are read only below `n`; the element datums
        // point into the array (jsonb elements of a detoasted array are not toasted themselves).
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
                        Some(Document(*elems.add(i)))
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
            // SAFETY: a non-NULL jsonb[] argument, valid for the call; detoasting copies it if needed.
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

// SAFETY: jsonb[] is the SQL type of this datum, as declared here.
unsafe impl SqlTranslatable for Documents {
    const TYPE_IDENT: &'static str = concat!(module_path!(), "::Documents");
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb[]"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb[]")));
}

// SAFETY: the argument is unboxed with FromDatum above, which accepts any jsonb[] datum.
unsafe impl<'fcx> ArgAbi<'fcx> for Documents {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // SAFETY: the caller (pgrx's argument unboxing) guarantees a non-NULL jsonb[] argument here.
        unsafe { arg.unbox_arg_using_from_datum().expect("a non-null jsonb[] argument") }
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        // SAFETY: pgrx's argument unboxing hands over a jsonb[] argument, NULL or not.
        unsafe { arg.unbox_arg_using_from_datum().into() }
    }
}
