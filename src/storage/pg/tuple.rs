//! A record a probe found, readable while its buffer is pinned.
use super::layout::Col;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// A record found by [`Prober::find`], readable while it is pinned.
pub struct Tuple<'a> {
    pub(super) slot: *mut pg_sys::TupleTableSlot,
    pub(super) columns: &'a [i32; 7],
    pub(super) relid: pg_sys::Oid,
}

impl Tuple<'_> {
    fn raw(&self, col: Col) -> Option<pg_sys::Datum> {
        let mut isnull = false;
        // SAFETY: the slot holds a pinned tuple of this partition (see `find`) and the column number
        // comes from the partition's own tuple descriptor.
        let datum = unsafe { pg_sys::slot_getattr(self.slot, self.columns[col as usize], &mut isnull) };
        (!isnull).then_some(datum)
    }

    /// A column copied into `T`.
    pub fn get<T: FromDatum>(&self, col: Col) -> Option<T> {
        // SAFETY: a non-NULL datum of the column's own type, read from the pinned tuple.
        self.raw(col).and_then(|d| unsafe { T::from_datum(d, false) })
    }

    /// A timestamptz column as PostgreSQL's microseconds since 2000-01-01.
    pub fn get_ts(&self, col: Col) -> Option<pg_sys::TimestampTz> {
        self.raw(col).map(|d| d.value() as i64)
    }

    /// A jsonb column, detoasted and copied out of the buffer and of SPI's memory.
    pub fn get_document(&self, col: Col) -> Option<super::document::Document> {
        self.raw(col).map(super::document::Document::copy_out)
    }

    /// The partition that holds this row.
    pub fn partition(&self) -> pg_sys::Oid {
        self.relid
    }

    /// This row version's ctid.
    pub fn tid(&self) -> pg_sys::ItemPointerData {
        // SAFETY: the slot is valid while the tuple is pinned (see `find`).
        unsafe { (*self.slot).tts_tid }
    }

    /// The inserting transaction of this row version.
    pub fn xmin(&self) -> pg_sys::TransactionId {
        let mut isnull = false;
        // SAFETY: xmin is a system attribute every heap tuple has; the slot holds a pinned heap tuple.
        let datum = unsafe {
            pg_sys::slot_getsysattr(self.slot, pg_sys::MinTransactionIdAttributeNumber, &mut isnull)
        };
        pg_sys::TransactionId::from(datum.value() as u32)
    }
}
