//! Running as the record table's owner, with `pg_catalog` as the only search path, for the length
//! of one call.
//!
//! This is what `SECURITY DEFINER ... SET search_path` would do for the consumer functions, without
//! its cost: that wrapper saves and restores the GUC state and invalidates the cached search path
//! at every call (measured: 10-17% of `idem_once`'s throughput). Consumers hold no privilege on the
//! storage, and a caller's schemas never shadow an operator or function of our statements.
//! (PostgreSQL 17 dropped override search paths: there the section sets `search_path` at a GUC nest
//! level, as 17's own maintenance commands do, and pays part of that cost; see `compat`.)
use pgrx::pg_sys;

/// The switch to the owner, undone when dropped. On an ERROR, PostgreSQL's (sub)transaction abort
/// restores the role and the search path itself, so nothing is done while unwinding. The search path
/// section is `compat`'s: an override search path up to PostgreSQL 16, `search_path` set at a GUC nest
/// level from 17 on.
pub struct AsOwner {
    caller: pg_sys::Oid,
    caller_context: i32,
    /// What ends the search path section (`compat::end_catalog_search_path`).
    search_path: i32,
}

impl AsOwner {
    pub fn switch() -> AsOwner {
        let mut caller = pg_sys::InvalidOid;
        let mut caller_context = 0;
        let owner = super::catalog::records_owner();
        // SAFETY: both out-pointers point to locals that outlive the call; the role set is a valid
        // role oid from the catalog, with SECURITY_LOCAL_USERID_CHANGE added to the caller's flags
        // as SECURITY DEFINER functions do; neither call raises an ERROR (unguarded).
        unsafe {
            super::unguarded::GetUserIdAndSecContext(&mut caller, &mut caller_context);
            super::unguarded::SetUserIdAndSecContext(
                owner,
                caller_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            );
        }
        let search_path = super::compat::begin_catalog_search_path();
        AsOwner { caller, caller_context, search_path }
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: undoes exactly what `switch` did, in reverse order, in the same transaction
            // (an abort in between would have unwound instead); sections opened inside this one
            // (SPI connections, pinned settings) were dropped before it; the role switch raises no ERROR.
            unsafe {
                super::compat::end_catalog_search_path(self.search_path);
                super::unguarded::SetUserIdAndSecContext(self.caller, self.caller_context);
            }
        }
    }
}
