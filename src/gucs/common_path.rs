//! `idempotency.edition_common_path`: a read-only setting that tells the SQL edition, in one read,
//! whether this session's transaction lets its calls take their common path (issue 32). Where this
//! library is loaded, the edition's calls must apply the `idempotency.*` limits a session set, and
//! before 0.9.5 each call read them one by one, with the isolation level and the read-only flag:
//! eleven function calls in every call's first expression, about 25,000 instructions of a claim.
//!
//! Its value is computed when it is read (a show hook, [`show`]): which groups of the limits the
//! edition's calls read are at their defaults, under READ COMMITTED and read-write, else `off`. Nobody
//! sets it (`PGC_INTERNAL`: `SET`, `ALTER ROLE ... SET` and `ALTER SYSTEM` are refused; not in files). A session without this
//! library has at most a placeholder of that name, whose value it may choose, so the edition also
//! checks that the setting is this one (`pg_settings_get_flags` gives a placeholder's flags, and
//! `'{}'` for this one).
use pgrx::pg_sys;
use std::ffi::{c_char, CStr};
use std::ptr::addr_of_mut;

const NAME: &CStr = c"idempotency.edition_common_path";

/// Where PostgreSQL keeps the setting's own value, which the show hook replaces when it is read.
static mut VALUE: *mut c_char = std::ptr::null_mut();

/// The value: `off` unless the transaction is READ COMMITTED and read-write and `max_key_bytes` and
/// `require_scope_grants` (which every call reads) have their defaults; then `keys`, followed by
/// `,lease`, `,payload` and `,batch` for each of those groups of limits at its defaults (`lease_ttl` and
/// `max_lease_ttl`; `max_payload_bytes`; `max_batch_keys`), in that order, so that a call tests only what
/// it reads (`keys,lease%` for a claim, `keys%payload%` for a completion). Reads only flags and
/// integers (no allocation, no call into PostgreSQL): it runs inside `current_setting`, `SHOW` and
/// `pg_settings`.
unsafe extern "C-unwind" fn show() -> *const c_char {
    // SAFETY: PostgreSQL's transaction flags, read on the backend's only thread.
    let (read_committed, read_only) =
        unsafe { (pg_sys::XactIsoLevel == pg_sys::XACT_READ_COMMITTED as i32, pg_sys::XactReadOnly) };
    let keys = super::MAX_KEY_BYTES.value.get() == super::MAX_KEY_BYTES_DEFAULT && !super::REQUIRE_SCOPE_GRANTS.get();
    if !(read_committed && !read_only && keys) {
        return c"off".as_ptr();
    }
    let lease = super::LEASE_TTL.value.get() == super::LEASE_TTL_DEFAULT
        && super::MAX_LEASE_TTL.value.get() == super::MAX_LEASE_TTL_DEFAULT;
    let payload = super::MAX_PAYLOAD_BYTES.value.get() == super::MAX_PAYLOAD_BYTES_DEFAULT;
    let batch = super::MAX_BATCH_KEYS.value.get() == super::MAX_BATCH_KEYS_DEFAULT;
    match (lease, payload, batch) {
        (true, true, true) => c"keys,lease,payload,batch",
        (true, true, false) => c"keys,lease,payload",
        (true, false, true) => c"keys,lease,batch",
        (true, false, false) => c"keys,lease",
        (false, true, true) => c"keys,payload,batch",
        (false, true, false) => c"keys,payload",
        (false, false, true) => c"keys,batch",
        (false, false, false) => c"keys",
    }
    .as_ptr()
}

pub(super) fn register() {
    // SAFETY: defined once, while the library loads; PostgreSQL keeps the address of VALUE, a static.
    unsafe {
        pg_sys::DefineCustomStringVariable(
            NAME.as_ptr(),
            c"Which of the SQL edition's calls may take their common path in this transaction (read-only).".as_ptr(),
            c"off, or keys followed by lease, payload and batch: under READ COMMITTED, read-write, the groups of idempotency.* limits at their defaults. Computed when read; nobody sets it.".as_ptr(),
            addr_of_mut!(VALUE),
            c"off".as_ptr(),
            pg_sys::GucContext::PGC_INTERNAL,
            pg_sys::GUC_DISALLOW_IN_FILE as i32,
            None,
            None,
            Some(show),
        );
    }
}
