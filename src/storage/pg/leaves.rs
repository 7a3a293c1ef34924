//! The leaf partitions a lookup searches, read from the partition descriptors (no catalog query).
use super::catalog;
use pgrx::pg_sys;

/// Partitions premade for later than this past the current time are not searched: rows get
/// `created_at = now()`, the start of their transaction, which began before the lookup (that
/// waited for the key's lock). The margin absorbs a system clock stepped backwards.
pub const FUTURE_MARGIN_US: i64 = 3600 * 1_000_000;

/// The leaf partitions under `relid`, oldest range first (partition descriptors list partitions
/// in bound order); when `horizon` is given, without the partitions whose range starts after it.
/// Partitioned tables on the way are opened and locked (the locks stay until the transaction
/// ends); the leaves are not opened.
///
/// # Safety
/// Inside a transaction; `relid` is the record table or one of its partitions.
pub unsafe fn collect_leaves(
    relid: pg_sys::Oid,
    horizon: Option<pg_sys::TimestampTz>,
    out: &mut Vec<pg_sys::Oid>,
) {
    if relid != catalog::records_oid()
        && pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_PARTITIONED_TABLE
    {
        out.push(relid);
        return;
    }
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
    // Copied before opening the children: opening them may process invalidations.
    let desc = pg_sys::RelationGetPartitionDesc(rel, true);
    // (A table without partitions may have no array at all: from_raw_parts needs a pointer.)
    let children: Vec<pg_sys::Oid> = if (*desc).nparts == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts((*desc).oids, (*desc).nparts as usize).to_vec()
    };
    let starts = horizon.map(|_| range_starts(desc)).unwrap_or_default();
    pg_sys::table_close(rel, pg_sys::NoLock as i32);
    for (i, child) in children.into_iter().enumerate() {
        let later = matches!((starts.get(i), horizon), (Some(Some(start)), Some(h)) if *start > h);
        if !later {
            collect_leaves(child, None, out);
        }
    }
}

/// The lower bound of each partition of a range-partitioned table on one timestamptz column,
/// by position in the partition descriptor; None where unknown (a default partition, MINVALUE).
///
/// # Safety
/// `desc` is the partition descriptor of an open partitioned table, valid while it stays open.
unsafe fn range_starts(desc: pg_sys::PartitionDesc) -> Vec<Option<pg_sys::TimestampTz>> {
    let mut starts = vec![None; (*desc).nparts as usize];
    let bounds = (*desc).boundinfo;
    if bounds.is_null() || (*bounds).strategy as u8 != super::compat::PARTITION_STRATEGY_RANGE {
        return starts;
    }
    // Range bounds are sorted; indexes[i] is the partition whose range ends at bound i, and so
    // starts at bound i - 1 (or -1 when no partition ends there).
    for i in 1..(*bounds).ndatums as usize {
        let part = *(*bounds).indexes.add(i);
        if part < 0 || part as usize >= starts.len() {
            continue;
        }
        if **(*bounds).kind.add(i - 1) == pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE {
            starts[part as usize] = Some((**(*bounds).datums.add(i - 1)).value() as i64);
        }
    }
    starts
}

