//! Session settings pinned to fixed values where they would otherwise steer the storage.
//!
//! Partition DDL carries its bounds as text and creates relations; a maintenance round drops, seals and
//! reclaims. Run in a consumer's session (a claim that makes its partition) or as a superuser (the
//! worker), they must not read the caller's or the database's `DateStyle`, `TimeZone`, abbreviations,
//! `default_tablespace` or `default_table_access_method`: a legal `SET` would otherwise move a bound by
//! hours or put a partition in the caller's tablespace. A [`Pinned`] section sets the values below at a
//! new GUC nest level, as a function's `SET` clause does, and gives the caller's back when it ends; on an
//! ERROR, PostgreSQL's (sub)transaction abort restores them itself.
use pgrx::pg_sys;
use std::ffi::CStr;

/// The settings and the values the storage's own statements assume. Not the search path: the owner's
/// section overrides it already (`owner`), and pg_partman, which a handover calls, sets it at session
/// level and back to what it found, which would leave the pinned path in the caller's session.
const PINNED: [(&CStr, &CStr); 8] = [
    (c"DateStyle", c"ISO, YMD"),
    (c"IntervalStyle", c"postgres"),
    (c"TimeZone", c"UTC"),
    (c"timezone_abbreviations", c"Default"),
    (c"default_tablespace", c""),
    (c"default_table_access_method", c"heap"),
    (c"standard_conforming_strings", c"on"),
    (c"transform_null_equals", c"off"),
];

/// A section with [`PINNED`] in force; the caller's values come back when dropped.
pub struct Pinned {
    nest_level: i32,
}

impl Pinned {
    pub fn enter() -> Pinned {
        // SAFETY: opens a GUC nest level inside the current transaction, closed in `drop` or by the
        // (sub)transaction's abort, exactly as fmgr does around a function with SET clauses.
        let nest_level = unsafe { pg_sys::NewGUCNestLevel() };
        set_all(&PINNED, pg_sys::GucAction::GUC_ACTION_SAVE);
        Pinned { nest_level }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: closes the nest level `enter` opened, in the same transaction (an abort in
            // between would have unwound instead), restoring the values saved there.
            unsafe { pg_sys::AtEOXact_GUC(true, self.nest_level) };
        }
    }
}

/// Pins [`PINNED`] for the rest of this session: the maintenance worker's, whose database may carry
/// any of them from `ALTER DATABASE ... SET` (its owner's to choose).
pub fn pin_session() {
    set_all(&[(c"search_path", c"pg_catalog, pg_temp")], pg_sys::GucAction::GUC_ACTION_SET);
    set_all(&PINNED, pg_sys::GucAction::GUC_ACTION_SET);
}

fn set_all(settings: &[(&CStr, &CStr)], action: pg_sys::GucAction::Type) {
    for (name, value) in settings {
        // SAFETY: both strings are NUL-terminated constants; SUSET context and session source are
        // what a superuser's SET uses, and elevel ERROR raises (never returns) on a refused value.
        unsafe {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_SESSION,
                action,
                true,
                pgrx::PgLogLevel::ERROR as i32,
                false,
            );
        }
    }
}
