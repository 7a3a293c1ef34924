//! The leaf partitions a lookup searches, read from the partition descriptors (no catalog query), and
//! remembered by the backend until the partition map changes.
//!
//! The walk (the record table's partition descriptor, each child's kind, the range starts) cost every
//! call 2 to 3 µs at a week of partitions, for a map that changes once a day. What it found is kept until
//! a relcache invalidation of the record table (any partition created, dropped, attached, detached or
//! sealed, in this transaction or a committed one, and their rollback) or of a partitioned table under it.
//! Those are the invalidations that would give the walk another partition descriptor: a call still takes
//! the record table's lock first, which processes them, so it searches what a fresh walk would.
use super::catalog::{self, Invalidated};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::rc::Rc;

/// Partitions premade for later than this past the current time are not searched: rows get
/// `created_at = now()`, the start of their transaction, which began before the lookup (that
/// waited for the key's lock). The margin absorbs a system clock stepped backwards.
pub const FUTURE_MARGIN_US: i64 = 3600 * 1_000_000;

/// What a walk of the record table found.
struct Walk {
    /// The leaves, oldest range first, each with the start of its ancestor's range among the record
    /// table's own partitions (None where unknown: a default partition, MINVALUE).
    leaves: Vec<(pg_sys::Oid, Option<pg_sys::TimestampTz>)>,
    /// The partitioned tables under the record table, which the walk opens (and so locks).
    partitioned: Vec<pg_sys::Oid>,
}

thread_local! {
    static WALK: RefCell<Option<Rc<Walk>>> = const { RefCell::new(None) };
}

/// Forgets the walk when the record table's relcache entry, or one of the partitioned tables under
/// it, is invalidated. Called by [`catalog`]'s callback.
pub fn forget_walk(what: Invalidated) {
    WALK.with_borrow_mut(|w| {
        if w.as_ref().is_some_and(|walk| stale(walk, what)) {
            *w = None;
        }
    });
}

/// Whether `what` makes `walk` stale: an invalidation of the record table, or of a partitioned table under it.
fn stale(walk: &Walk, what: Invalidated) -> bool {
    match what {
        Invalidated::RecordTable => true,
        Invalidated::Relation(relid) => walk.partitioned.contains(&relid),
    }
}

/// The leaf partitions of the record table, oldest range first (partition descriptors list partitions
/// in bound order), without those whose range starts after `horizon`. The partitioned tables on the
/// way are locked (`AccessShareLock`, until the transaction ends), as a query would; the leaves are not
/// opened.
///
/// # Safety
/// Inside a transaction, the record table locked (`AccessShareLock`) by the caller, who has then processed
/// pending invalidations (`AcceptInvalidationMessages`): those that partitions created, dropped or sealed
/// since have sent, which forget the walk. (Taking the lock the first time in a transaction processes
/// them too; `probe::Prober::open` does both.)
pub unsafe fn collect_leaves(horizon: pg_sys::TimestampTz, out: &mut Vec<pg_sys::Oid>) {
    let records = catalog::records_oid();
    let walk = match WALK.with_borrow(|w| w.clone()) {
        Some(walk) if lock_partitioned(&walk) => walk,
        _ => {
            let ((walk, detaching), settled) =
                catalog::read_for_cache(|| walk_from(records), |(walk, _), what| stale(walk, what));
            let walk = Rc::new(walk);
            // (Not kept while a partition is being detached concurrently: which partitions the
            // descriptor omits then depends on the snapshot.)
            if settled && !detaching {
                WALK.with_borrow_mut(|w| *w = Some(walk.clone()));
            }
            walk
        }
    };
    let searched = walk.leaves.iter().filter(|(_, start)| !start.is_some_and(|s| s > horizon));
    out.extend(searched.map(|(leaf, _)| *leaf));
}

/// Locks the partitioned tables of a remembered walk, as the walk would; false when that processed an
/// invalidation that made the walk stale (it is then forgotten).
///
/// # Safety
/// Inside a transaction.
unsafe fn lock_partitioned(walk: &Rc<Walk>) -> bool {
    for &relid in &walk.partitioned {
        pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as i32);
    }
    WALK.with_borrow(|w| w.as_ref().is_some_and(|now| Rc::ptr_eq(now, walk)))
}

/// Walks the partition tree under `records`, which the caller has locked; also whether a partition
/// is being detached concurrently somewhere in it.
///
/// # Safety
/// Inside a transaction.
unsafe fn walk_from(records: pg_sys::Oid) -> (Walk, bool) {
    let mut walk = Walk { leaves: Vec::new(), partitioned: Vec::new() };
    let mut detaching = false;
    let (children, starts) = children_of(records, true, &mut detaching);
    for (child, start) in children.into_iter().zip(starts) {
        let mut below = Vec::new();
        collect(child, &mut below, &mut walk.partitioned, &mut detaching);
        walk.leaves.extend(below.into_iter().map(|leaf| (leaf, start)));
    }
    (walk, detaching)
}

/// The leaves under `relid` (itself when it is one), in bound order; the partitioned tables on the way
/// are opened, locked and listed in `partitioned`.
///
/// # Safety
/// Inside a transaction; `relid` is a partition of the record table.
unsafe fn collect(relid: pg_sys::Oid, out: &mut Vec<pg_sys::Oid>, partitioned: &mut Vec<pg_sys::Oid>, detaching: &mut bool) {
    if pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
        out.push(relid);
        return;
    }
    partitioned.push(relid);
    for child in children_of(relid, false, detaching).0 {
        collect(child, out, partitioned, detaching);
    }
}

/// The partitions of a partitioned table, in bound order, with their range starts when `starts`.
///
/// # Safety
/// Inside a transaction; `relid` is the record table or a partitioned table under it.
unsafe fn children_of(
    relid: pg_sys::Oid,
    starts: bool,
    detaching: &mut bool,
) -> (Vec<pg_sys::Oid>, Vec<Option<pg_sys::TimestampTz>>) {
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
    // Copied before opening the children: opening them may process invalidations.
    let desc = pg_sys::RelationGetPartitionDesc(rel, true);
    *detaching |= (*desc).detached_exist;
    // (A table without partitions may have no array at all: from_raw_parts needs a pointer.)
    let children: Vec<pg_sys::Oid> = if (*desc).nparts == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts((*desc).oids, (*desc).nparts as usize).to_vec()
    };
    let starts = if starts { range_starts(desc) } else { vec![None; children.len()] };
    pg_sys::table_close(rel, pg_sys::NoLock as i32);
    (children, starts)
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

