//! The maintenance background worker.
//!
//! A launcher, registered when the library is in `shared_preload_libraries`, wakes every
//! `idempotency.maintenance_interval` and, for each database of `idempotency.database`, starts a
//! short-lived worker connected to it that runs one round ([`maintenance::round`]) in one
//! transaction and exits. A worker connects to one database for life, hence one per round and
//! database; the launcher itself never opens a transaction. SIGHUP re-reads the GUCs, SIGTERM
//! stops the launcher; the postmaster restarts it after a crash.
use crate::gucs;
use crate::stats;
use crate::storage;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::Duration;

pub fn register() {
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    BackgroundWorkerBuilder::new("idempotency launcher")
        .set_type("idempotency launcher")
        .set_library("idempotency")
        .set_function("idem_launcher_main")
        // Only workers flagged for database access get PostgreSQL's SIGUSR1 handler, which is
        // how the postmaster tells us that a maintenance worker finished. We never connect.
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn idem_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // Connected to no database (as PostgreSQL's logical replication launcher is), only so that it
    // shows in pg_stat_activity, where a DBA looks first. It never opens a transaction.
    BackgroundWorker::connect_worker_to_spi(None, None);
    log!(
        "idempotency launcher started: maintaining {:?} every {:?}",
        gucs::databases(),
        gucs::maintenance_interval()
    );
    loop {
        for db in gucs::databases() {
            maintain(&db);
        }
        if !BackgroundWorker::wait_latch(Some(gucs::maintenance_interval())) {
            break; // SIGTERM or postmaster death
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: re-reads the configuration files in the launcher's own process, as PostgreSQL's
            // own background processes do after a SIGHUP; no transaction is open.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
    log!("idempotency launcher stopping");
}

/// Runs one round on `db` in a worker of its own and waits for it to finish.
fn maintain(db: &str) {
    let started = BackgroundWorkerBuilder::new(&format!("idempotency maintenance {db}"))
        .set_type("idempotency maintenance")
        .set_library("idempotency")
        .set_function("idem_maintenance_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .set_extra(db)
        // SAFETY: reads this process's pid, set at process start.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic();
    match started {
        Ok(worker) => {
            let _ = worker.wait_for_shutdown();
        }
        Err(_) => {
            warning!("idempotency: could not start a maintenance worker for {db:?} (max_worker_processes?)")
        }
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn idem_maintenance_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db = BackgroundWorker::get_extra().to_string();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    let round = BackgroundWorker::transaction(|| {
        // The worker is a superuser; the database's own settings (ALTER DATABASE ... SET, its owner's
        // to choose) must not steer it: a search_path naming a schema the owner writes would let an
        // operator planted there run as the superuser. Pinned for this session before any statement.
        storage::pin_session_settings();
        let installed = Spi::get_one::<bool>(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'idempotency')",
        );
        if installed != Ok(Some(true)) {
            return None;
        }
        // Left alone: a database whose record table has no partition yet (its first claim or a
        // manual round makes them), and one with a table in our schema not attached to the record
        // table, which is what a restore looks like until it attached its partitions. Partitions
        // made meanwhile would collide with those the dump brings (or their indexes with the
        // dump's).
        let started = Spi::get_one::<bool>(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_inherits WHERE inhparent = 'idempotency.records'::pg_catalog.regclass::pg_catalog.oid)",
        );
        if started != Ok(Some(true)) {
            return None;
        }
        let stray = Spi::get_one::<String>(
            "SELECT relname::text FROM pg_catalog.pg_class
              WHERE relnamespace = 'idempotency'::pg_catalog.regnamespace::pg_catalog.oid AND relkind = 'r'
                AND NOT relispartition AND relname::pg_catalog.text LIKE 'records%' LIMIT 1",
        );
        if let Ok(Some(table)) = stray {
            // Said at LOG level: a table a DBA detached and left here stops the rounds too.
            log!(
                "idempotency maintenance of {db:?}: skipped: table idempotency.{table} is not a partition of idempotency.records (a restore under way? move a detached partition out of the schema)"
            );
            return None;
        }
        stats::rounds::observe(|| storage::maintenance_round(storage::transaction_start(), false), |r| r.error())
    });
    // A round reclaims at most RECLAIM_PER_ROUND stuck leases; more go in transactions of their own (a few
    // per round, so a round stays short).
    let mut reclaimed = round.as_ref().map_or(0, |r| r.reclaimed);
    let mut more = 0;
    while reclaimed == storage::RECLAIM_PER_ROUND && more < 9 {
        reclaimed = BackgroundWorker::transaction(|| {
            storage::pin_session_settings();
            storage::reclaim_more(storage::transaction_start()).unwrap_or(0)
        });
        more += 1;
        log!("idempotency maintenance of {db:?}: {reclaimed} more stuck leases reclaimed");
    }
    match round {
        Some(r) if r.did_something() => log!(
            "idempotency maintenance of {db:?}: {} partitions created, {} dropped, {} deferred (lock busy), {} stuck leases reclaimed",
            r.created,
            r.dropped,
            r.deferred,
            r.reclaimed
        ),
        Some(_) => debug1!("idempotency maintenance of {db:?}: nothing to do"),
        None => debug1!(
            "idempotency maintenance of {db:?}: skipped (extension not installed, no partition yet, a restore under way, or a round is running)"
        ),
    }
}
