//! The shared table behind `holds`: fixed-size shards in shared memory, each an open-addressed table
//! (linear probing) of 16-byte entries under its own LWLock. It knows nothing of transactions: `holds`
//! decides what goes in and out.
use pgrx::pg_sys;

/// Shards of the table, each with its own LWLock, so that backends rarely wait for each other.
pub const SHARDS: usize = 64;
const TRANCHE: &std::ffi::CStr = c"idempotency held keys";
const REGION_NAME: &std::ffi::CStr = c"idempotency held keys";

/// One held key; free while `xid` is 0 (InvalidTransactionId).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Slot {
    pub hash: u64,
    pub db: u32,
    pub xid: u32,
}

/// The table in shared memory: `SHARDS` counts, then `SHARDS` runs of `cap` slots (an open-addressed
/// table per shard, linear probing), each holding at most `limit` keys (three quarters of `cap`).
#[repr(C)]
struct Header {
    cap: u32,
    limit: u32,
    counts: [Count; SHARDS],
}

/// A shard's count, alone on its cache line (PostgreSQL's `PG_CACHE_LINE_SIZE`, as its padded LWLocks): every
/// insert and removal writes it, and every lookup of a key of its shard reads it ([`shard_empty`]), so that
/// neighbours sharing a line would make each shard's writes cost the others' readers a cache miss. The
/// region is aligned as much: shared memory is handed out in whole cache lines.
#[repr(C, align(128))]
struct Count(u32);

static mut REGION: *mut Header = std::ptr::null_mut();
static mut LOCKS: *mut pg_sys::LWLockPadded = std::ptr::null_mut();
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// The keys a shard holds at most, for `keys` in all (`idempotency.held_keys`).
fn shard_limit(keys: usize) -> usize {
    keys.div_ceil(SHARDS)
}

/// Slots per shard: a quarter more than it holds, so that searches stay short.
fn shard_capacity(keys: usize) -> usize {
    (shard_limit(keys) * 4).div_ceil(3) + 1
}

fn region_size(keys: usize) -> usize {
    std::mem::size_of::<Header>() + SHARDS * shard_capacity(keys) * std::mem::size_of::<Slot>()
}


/// `_PG_init`, while preloading: asks for the table's memory and locks (sized by `idempotency.held_keys`).
///
/// # Safety
/// Called once, from `_PG_init` in the postmaster while shared_preload_libraries are loaded.
pub unsafe fn request() {
    PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
    pg_sys::shmem_request_hook = Some(request_memory);
    PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
    pg_sys::shmem_startup_hook = Some(set_up_memory);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_memory() {
    if let Some(prev) = PREV_REQUEST_HOOK {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(region_size(crate::gucs::held_keys()));
    pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), SHARDS as i32);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn set_up_memory() {
    if let Some(prev) = PREV_STARTUP_HOOK {
        prev();
    }
    let keys = crate::gucs::held_keys();
    let size = region_size(keys);
    let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
    pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let region = pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found) as *mut Header;
    // (ShmemAllocRaw aligns every allocation on PG_CACHE_LINE_SIZE, 128 bytes: what `Count` needs.)
    debug_assert_eq!(region as usize % std::mem::align_of::<Header>(), 0, "the held keys' region is aligned");
    if !found {
        // All zeroes: no key held.
        std::ptr::write_bytes(region as *mut u8, 0, size);
        (*region).cap = shard_capacity(keys) as u32;
        (*region).limit = shard_limit(keys) as u32;
    }
    LOCKS = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
    REGION = region;
    pg_sys::LWLockRelease(init_lock);
}


/// One shard, locked while this lives.
pub struct Shard {
    index: usize,
    pub table: Slots<'static>,
}

impl Shard {
    /// The shard of `hash`, locked; None without the table.
    pub fn lock(hash: u64, db: u32, mode: pg_sys::LWLockMode::Type) -> Option<Shard> {
        // SAFETY: REGION and LOCKS are set once at startup (inherited by every backend) and never freed;
        // the shard's LWLock guards its slots and count, which only this value uses while it lives.
        unsafe {
            let region = REGION;
            if region.is_null() {
                return None;
            }
            let index = shard_of(hash, db);
            pg_sys::LWLockAcquire(&raw mut (*LOCKS.add(index)).lock, mode);
            let cap = (*region).cap as usize;
            let first = (region.add(1) as *mut Slot).add(index * cap);
            let table = Slots {
                slots: std::slice::from_raw_parts_mut(first, cap),
                count: &mut (*region).counts[index].0,
                limit: (*region).limit,
            };
            Some(Shard { index, table })
        }
    }
}

/// Whether the shard of `hash` holds no key: its count, read without the shard's lock (a lookup of a key
/// nobody holds past its budget, the common case, then takes no LWLock on a cache line every backend shares).
/// Only a caller that holds the key's lock may take "empty" to mean "the key is not held here": an entry is
/// added under the shard's lock before its transaction gives the key's lock back, and the caller took that
/// lock afterwards, which orders this read after the addition (the lock manager's LWLocks are barriers).
/// True without the table.
pub fn shard_empty(hash: u64, db: u32) -> bool {
    // SAFETY: REGION is set once at startup (inherited by every backend) and never freed; the count is an
    // aligned u32, read atomically while a holder of the shard's lock may write it: the old or the new count,
    // either of which is right for the caller (see above).
    unsafe {
        let region = REGION;
        if region.is_null() {
            return true;
        }
        let count = &raw mut (*region).counts[shard_of(hash, db)].0;
        std::sync::atomic::AtomicU32::from_ptr(count).load(std::sync::atomic::Ordering::Relaxed) == 0
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        // SAFETY: releases the lock `Shard::lock` took.
        unsafe { pg_sys::LWLockRelease(&raw mut (*LOCKS.add(self.index)).lock) };
    }
}

/// A shard's open-addressed table (linear probing; a free slot ends every search).
pub struct Slots<'a> {
    pub slots: &'a mut [Slot],
    count: &'a mut u32,
    limit: u32,
}

impl Slots<'_> {
    fn home(&self, hash: u64, db: u32) -> usize {
        ((mix(hash, db) / SHARDS as u64) % self.slots.len() as u64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot of `(hash, db)`, or the free slot where the search for it ended.
    pub fn find(&self, hash: u64, db: u32) -> Result<usize, usize> {
        let mut i = self.home(hash, db);
        loop {
            let slot = self.slots[i];
            if slot.xid == 0 {
                return Err(i);
            }
            if slot.hash == hash && slot.db == db {
                return Ok(i);
            }
            i = self.next(i);
        }
    }

    /// Puts a new key into free slot `at` (where [`Slots::find`] ended); false when the shard is full.
    pub fn insert(&mut self, at: usize, slot: Slot) -> bool {
        if self.full() {
            return false;
        }
        self.slots[at] = slot;
        *self.count += 1;
        true
    }

    pub fn full(&self) -> bool {
        *self.count >= self.limit
    }

    /// Drops every entry whose transaction `running` says has ended (one pass; an entry that a removal
    /// moves into a slot already passed may stay until the next).
    pub fn evict(&mut self, running: impl Fn(u32) -> bool) {
        let (mut i, mut passed) = (0, 0);
        while passed < self.slots.len() {
            if self.slots[i].xid != 0 && !running(self.slots[i].xid) {
                // Slot i now holds the next entry of its run, if any: look at it again.
                self.remove(i);
            } else {
                i = self.next(i);
                passed += 1;
            }
        }
    }

    /// Frees slot `i` and moves later slots of its run back, so that every search still finds them.
    pub fn remove(&mut self, mut i: usize) {
        let mut j = i;
        loop {
            j = self.next(j);
            let slot = self.slots[j];
            if slot.xid == 0 {
                break;
            }
            let home = self.home(slot.hash, slot.db);
            // Whether `home` lies cyclically in (i, j]: then slot j stays where it is.
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.slots[i] = slot;
                i = j;
            }
        }
        self.slots[i] = Slot::default();
        *self.count -= 1;
    }
}

/// The shard that holds `(hash, db)`.
pub fn shard_of(hash: u64, db: u32) -> usize {
    (mix(hash, db) % SHARDS as u64) as usize
}

/// Spreads the key hash and the database over shards and slots.
fn mix(hash: u64, db: u32) -> u64 {
    (hash ^ (db as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd) >> 7
}

#[cfg(test)]
mod tests {
    use super::{Slot, Slots};

    /// Random inserts and removes against a map: every key present is found, every key removed is not,
    /// whatever runs and wrap-arounds the removals shift back, and the limit holds.
    #[test]
    fn the_table_finds_what_it_holds_after_any_removals() {
        let mut slots = vec![Slot::default(); 13];
        let mut count = 0;
        let mut table = Slots { slots: &mut slots, count: &mut count, limit: 9 };
        let mut held = std::collections::HashMap::new();
        let mut evictions = 0;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Few distinct keys, so that runs collide, wrap around the end and shift back often.
            let (hash, db) = (seed % 24, (seed >> 40) as u32 % 2);
            match table.find(hash, db) {
                Ok(i) => {
                    assert_eq!(held.remove(&(hash, db)), Some(table.slots[i].xid), "step {step}");
                    table.remove(i);
                }
                Err(free) => {
                    let fits = held.len() < 9;
                    assert_eq!(table.insert(free, Slot { hash, db, xid: step + 1 }), fits, "step {step}");
                    if fits {
                        held.insert((hash, db), step + 1);
                    }
                }
            }
            assert_eq!(*table.count as usize, held.len());
            for (&(h, d), &xid) in &held {
                let i = table.find(h, d).expect("a held key is found");
                assert_eq!(table.slots[i].xid, xid);
            }
            // Now and then, the transactions of odd xids end and a full table drops their entries.
            if step % 97 == 0 && table.full() {
                table.evict(|xid| xid % 2 == 0);
                evictions += 1;
                held.retain(|_, xid| *xid % 2 == 0);
                assert_eq!(*table.count as usize, held.len(), "step {step}");
                assert!(table.slots.iter().all(|s| s.xid % 2 == 0), "step {step}: an ended entry stayed");
            }
        }
        assert!(evictions > 10, "the table was full {evictions} times when checked");
    }
}

