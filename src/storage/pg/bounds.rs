//! A partition's range as PostgreSQL stores it: the constants of its `PartitionBoundSpec`, read from
//! `pg_class.relpartbound` without passing through text.
//!
//! `pg_get_expr(relpartbound)` prints the bounds under the reader's `DateStyle` and `TimeZone`, and
//! reading that text back as `timestamptz` is not always the value printed: a zone abbreviation such as
//! `CST` (Asia/Shanghai) reads back as another zone's, hours away. Every range the storage compares
//! times with comes from here instead.
use pgrx::pg_sys;

/// `[from, to)` of a partition bound as `pg_class.relpartbound` holds it (its node tree as text); None
/// for a default partition or a bound of MINVALUE or MAXVALUE. The view passes the bound of the row it
/// read, so the range is that of the same snapshot: a syscache lookup by oid would use the catalog
/// snapshot instead, which can be older than the statement's and miss a partition another session just
/// made.
pub fn range_of_bound(bound: &str) -> Option<(pg_sys::TimestampTz, pg_sys::TimestampTz)> {
    let text = std::ffi::CString::new(bound).ok()?;
    // SAFETY: a node tree PostgreSQL wrote (the caller passes relpartbound), which stringToNode parses
    // into palloc'd nodes of the current memory context, read by their own layouts below.
    unsafe { range_of(pg_sys::stringToNode(text.as_ptr()) as *mut pg_sys::PartitionBoundSpec) }
}

/// `[from, to)` of a range partition of the record table, from the syscache (for a partition the caller
/// has opened and locked); None for a relation that is no partition, a default partition, or a bound of
/// MINVALUE or MAXVALUE.
pub fn partition_range(relid: pg_sys::Oid) -> Option<(pg_sys::TimestampTz, pg_sys::TimestampTz)> {
    // SAFETY: the syscache tuple is checked for NULL, read only through SysCacheGetAttr and released
    // before returning; the bound text is a node tree PostgreSQL itself wrote, which stringToNode
    // parses into palloc'd nodes of the current memory context, read below by their own layouts.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(relid));
        if tuple.is_null() {
            return None;
        }
        let mut isnull = false;
        let datum = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            tuple,
            pg_sys::Anum_pg_class_relpartbound as pg_sys::AttrNumber,
            &mut isnull,
        );
        let range = if isnull {
            None
        } else {
            let text = pg_sys::text_to_cstring(datum.cast_mut_ptr());
            let spec = pg_sys::stringToNode(text) as *mut pg_sys::PartitionBoundSpec;
            range_of(spec)
        };
        pg_sys::ReleaseSysCache(tuple);
        range
    }
}

/// # Safety
/// `spec` is NULL or a node parsed from a `relpartbound`.
unsafe fn range_of(spec: *mut pg_sys::PartitionBoundSpec) -> Option<(pg_sys::TimestampTz, pg_sys::TimestampTz)> {
    // SAFETY: the tag is checked before the node is read as a PartitionBoundSpec.
    unsafe {
        if spec.is_null()
            || (*spec).type_ != pg_sys::NodeTag::T_PartitionBoundSpec
            || (*spec).is_default
            || (*spec).strategy as u8 != super::compat::PARTITION_STRATEGY_RANGE
        {
            return None;
        }
        Some((first_value((*spec).lowerdatums)?, first_value((*spec).upperdatums)?))
    }
}

/// The first datum of a range bound when it is a finite `timestamptz` constant.
///
/// # Safety
/// `datums` is NULL or the List of `PartitionRangeDatum` nodes of a range bound.
unsafe fn first_value(datums: *mut pg_sys::List) -> Option<pg_sys::TimestampTz> {
    // SAFETY: a non-empty List's first cell holds a node pointer; each node's tag is checked before it
    // is read by its own layout.
    unsafe {
        if datums.is_null() || (*datums).length < 1 {
            return None;
        }
        let datum = (*(*datums).elements).ptr_value as *mut pg_sys::PartitionRangeDatum;
        if datum.is_null()
            || (*datum).type_ != pg_sys::NodeTag::T_PartitionRangeDatum
            || (*datum).kind != pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE
        {
            return None;
        }
        let value = (*datum).value as *mut pg_sys::Const;
        if value.is_null()
            || (*value).xpr.type_ != pg_sys::NodeTag::T_Const
            || (*value).consttype != pg_sys::TIMESTAMPTZOID
            || (*value).constisnull
        {
            return None;
        }
        Some((*value).constvalue.value() as pg_sys::TimestampTz)
    }
}
