//! The storage's own statements are planned without JIT compilation.
//!
//! At a week of partitions the estimate of the partition-coverage statement (over `idempotency.partitions`)
//! passed `jit_above_cost`, and compiling it made the first call of every new connection take 45 ms instead of
//! 13 on PostgreSQL 15 (`benches/first-call`); none of the storage's statements runs long enough to win a
//! compilation back. A planner hook clears the JIT flags of every plan made while the storage's SPI connection
//! is open (`spi::in_storage`), which is where the storage plans its statements. The session's `jit` is never
//! touched, so nothing has to be given back after an ERROR, and a plan made for the caller elsewhere compiles as
//! the caller's settings say. (A trigger a DBA put on a partition, planned inside the storage's statement,
//! is planned without JIT too.)
use super::spi;
use pgrx::pg_sys;

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: std::ffi::c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    let plan = match PREV_PLANNER {
        Some(prev) => prev(parse, query_string, cursor_options, bound_params),
        None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
    };
    if spi::in_storage() && !plan.is_null() {
        (*plan).jitFlags = pg_sys::PGJIT_NONE as std::ffi::c_int;
    }
    plan
}

/// Process start: chains the planner hook in front of the one installed before, which it calls.
pub fn init() {
    // SAFETY: a static function that lives as long as the process, installed once per process (`_PG_init`).
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
    }
}
