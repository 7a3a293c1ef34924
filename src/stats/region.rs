//! The shared memory of the statistics, as laid out: a header, the maintenance state of each database
//! ([`super::rounds`]) and a fixed table of counter slots, one per (database, scope)
//! ([`super::slots`]); its size; and where it is in this process.
//!
//! Every type laid out in the region is here, with the few methods that need their private parts, so
//! that the files which use the region (slots, rounds, the shutdown file) and the one that sets it up
//! ([`super::shmem`]) all import from this file, and it imports from none of them.
use super::counters::COUNTERS;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The longest scope name kept. A longer scope is counted under its full name (the slot's key is
/// its hash) and shown cut, with a hash of the full name (see [`super::names::shown_name`]).
pub(super) const NAME_BYTES: usize = 128;
/// Databases whose maintenance rounds are remembered.
pub const MAX_DATABASES: usize = 64;
/// The longest error message of a round kept.
pub(super) const ERROR_BYTES: usize = 256;

#[repr(C)]
pub(super) struct Header {
    /// Slots in the table that follows the header.
    pub(super) slots: u32,
    /// Scopes that may get a slot of their own, and how many have one.
    pub(super) max_scopes: u32,
    pub(super) scopes: AtomicU32,
    pub(super) rounds: [Round; MAX_DATABASES],
}

/// 296 bytes: the GUC's description and docs/reference.md give the memory a scope takes, two slots (see
/// [`slot_count`]); the assertion below keeps them in step with a change of the layout.
#[repr(C)]
pub(super) struct Slot {
    /// 0 while free; else the hash of (database, scope, shared).
    pub(super) key: AtomicU64,
    /// Set once the fields below `key` are written.
    pub(super) ready: AtomicU32,
    pub(super) db: AtomicU32,
    /// 1 for the slot shared by the scopes beyond `max_scopes`.
    pub(super) shared: AtomicU32,
    pub(super) name_len: AtomicU32,
    pub(super) name: [AtomicU64; NAME_BYTES / 8],
    pub(super) reset_at: AtomicI64,
    pub(super) counts: [AtomicU64; COUNTERS],
}

const _: () = assert!(std::mem::size_of::<Slot>() == 296, "update the figures in gucs.rs and docs/reference.md");

/// The maintenance state of one database, in shared memory.
#[repr(C)]
pub struct Round {
    /// The database's oid; 0 while the place is free.
    db: AtomicU32,
    /// A spin lock over `state` (rounds of one database never overlap, but readers may come any time).
    busy: AtomicU32,
    state: UnsafeCell<RoundState>,
}

/// A copy of a database's maintenance state.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RoundState {
    pub started_at: i64,
    /// 0 while the first round runs.
    pub finished_at: i64,
    pub duration_us: i64,
    pub rounds: u64,
    pub failed: u64,
    pub error_at: i64,
    pub(super) error_len: u32,
    pub(super) error: [u8; ERROR_BYTES],
}

impl RoundState {
    pub fn last_error(&self) -> Option<String> {
        (self.error_len > 0).then(|| String::from_utf8_lossy(&self.error[..self.error_len as usize]).into_owned())
    }
}

impl Round {
    /// Whether this place is `db`'s; with `create`, takes a free place for it.
    pub(super) fn belongs_to(&self, db: u32, create: bool) -> bool {
        let owner = self.db.load(Ordering::Acquire);
        owner == db || (create && owner == 0 && self.db.compare_exchange(0, db, Ordering::AcqRel, Ordering::Acquire).is_ok())
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut RoundState) -> T) -> T {
        while self.busy.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock gives this process the only access to the state until released;
        // `f` neither raises an ERROR nor panics (it only copies plain values).
        let result = f(unsafe { &mut *self.state.get() });
        self.busy.store(0, Ordering::Release);
        result
    }
}

/// The region in this process; null until [`super::shmem`]'s start-up hook sets it.
pub(super) static mut REGION: *mut Header = std::ptr::null_mut();

/// Whether this process has the shared memory (the library was preloaded).
pub fn attached() -> bool {
    // SAFETY: a pointer set once in the postmaster before any backend forks; read-only after.
    !unsafe { REGION }.is_null()
}

pub(super) fn header() -> &'static Header {
    // SAFETY: only called when attached(); the region lives as long as the server.
    unsafe { &*REGION }
}

pub(super) fn slot(i: usize) -> &'static Slot {
    let h = header();
    assert!(i < h.slots as usize, "slot index in range");
    // SAFETY: the slots follow the header in the region, `slots` of them; i is in range.
    unsafe { &*((REGION as *mut u8).add(std::mem::size_of::<Header>()) as *const Slot).add(i) }
}

pub(super) fn region_size(max_scopes: usize) -> usize {
    std::mem::size_of::<Header>() + slot_count(max_scopes) * std::mem::size_of::<Slot>()
}

pub(super) fn slot_count(max_scopes: usize) -> usize {
    2 * max_scopes + MAX_DATABASES
}
