//! Setting up the shared memory of the statistics ([`super::region`]): `_PG_init` hooks it, sized at
//! server start from `idempotency.stats_max_scopes` (requested in `shmem_request_hook`, set up in
//! `shmem_startup_hook`, as pg_stat_statements does). The postmaster also takes back the counters of
//! the last clean shutdown there, and saves them when it exits ([`super::persist`]).
use super::counting;
use super::persist::{load, save_at_exit};
use super::region::{region_size, slot_count, Header, REGION};
use pgrx::pg_sys;

const REGION_NAME: &std::ffi::CStr = c"idempotency statistics";

static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// `_PG_init` while preloading: asks for the shared memory and hooks its set-up.
pub fn init() {
    counting::register_callback();
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    // SAFETY: chains our hooks in front of the previous ones, once, in the postmaster.
    unsafe {
        PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_memory);
        PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(set_up_memory);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_memory() {
    if let Some(prev) = PREV_REQUEST_HOOK {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(region_size(crate::gucs::stats_max_scopes()));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn set_up_memory() {
    if let Some(prev) = PREV_STARTUP_HOOK {
        prev();
    }
    let max_scopes = crate::gucs::stats_max_scopes();
    let size = region_size(max_scopes);
    let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
    pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let region = pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found) as *mut Header;
    if !found {
        // All zeroes is a valid empty state for every field (atomics, arrays, free slots).
        std::ptr::write_bytes(region as *mut u8, 0, size);
        (*region).slots = slot_count(max_scopes) as u32;
        (*region).max_scopes = max_scopes as u32;
    }
    REGION = region;
    pg_sys::LWLockRelease(init_lock);
    if !pg_sys::IsUnderPostmaster {
        if !found {
            load();
        }
        pg_sys::on_shmem_exit(Some(save_at_exit), pg_sys::Datum::from(0));
    }
}
