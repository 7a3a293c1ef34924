"""Retention and the maintenance worker, against a cluster with the library preloaded.

Its own cluster (tests/ports: "worker"): the worker's settings are cluster-wide, so these tests must not share
the multi-session cluster. Every check waits for the worker with a deadline and fails when it passes.
"""
import os
import re
import signal
import time

import psycopg
import pytest

import pgtools

pytestmark = pytest.mark.native_only("the background worker")

PORT = int(os.environ.get("IDEM_WORKER_TEST_PORT") or pgtools.port("worker"))
DB = "idem_worker"
PARTMAN_DB = "idem_partman"

CONF = [
    "shared_preload_libraries = 'idempotency'",
    "idempotency.maintenance_interval = '1s'",
    f"idempotency.database = '{DB},{PARTMAN_DB}'",
    "idempotency.reclaim_after = 0",
]

SERVER = pgtools.Cluster(PORT, CONF)
LOG = SERVER.logfile


def connect(dbname=DB):
    return SERVER.connect(dbname)


def one(conn, sql, *args):
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


def wait_for(what, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for: {what}")


def launcher_pid(conn):
    """The launcher as pg_stat_activity shows it (connected to no database)."""
    return one(conn, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher' "
                     "AND datname IS NULL")


def reload(conn, setting, value):
    conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
    conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="module")
def db():
    SERVER.init()
    try:
        SERVER.start()
        with connect("postgres") as admin:
            admin.execute(f"CREATE DATABASE {DB}")
            admin.execute(f"CREATE DATABASE {PARTMAN_DB}")
        with connect() as conn:
            pgtools.install_extension(conn)
            yield conn
    finally:
        SERVER.stop()


def test_worker_leaves_new_and_restoring_databases_alone(db):
    # CREATE EXTENSION made no partition: the worker waits for the first claim or manual round.
    time.sleep(3.5)  # three rounds at maintenance_interval = 1s
    assert one(db, "SELECT count(*) FROM idempotency.partitions") == 0
    assert one(db, "SELECT partitions_created FROM idem_maintenance()") == 5
    # A table of our schema not attached to the record table is what a restore looks like before
    # it attached its partitions: no round touches the database meanwhile.
    db.execute("CREATE TABLE idempotency.records_p2000_01_01 (LIKE idempotency.records)")
    newest = one(db, "SELECT partition::text FROM idempotency.partitions ORDER BY range_from DESC LIMIT 1")
    db.execute(f"DROP TABLE {newest}")
    time.sleep(3.5)
    assert one(db, "SELECT count(*) FROM idempotency.partitions WHERE partition::text = %s", newest) == 0
    assert "table idempotency.records_p2000_01_01 is not a partition of idempotency.records" in LOG.read_text()
    db.execute("DROP TABLE idempotency.records_p2000_01_01")
    wait_for(f"{newest} premade again once the stray table is gone", lambda: one(
        db, "SELECT count(*) FROM idempotency.partitions WHERE partition::text = %s", newest) == 1)


def test_worker_premakes_a_dropped_future_partition(db):
    newest = one(db, "SELECT partition::text FROM idempotency.partitions ORDER BY range_from DESC LIMIT 1")
    db.execute(f"DROP TABLE {newest}")
    wait_for(f"{newest} premade again", lambda: one(
        db, "SELECT count(*) FROM idempotency.partitions WHERE partition::text = %s", newest) == 1)
    wait_for("a LOG line for the round", lambda: re.search(
        r'idempotency maintenance of "idem_worker": [1-9]\d* partitions created', LOG.read_text()))


def test_retention_drops_old_partitions_and_keeps_recent_keys(db):
    # Partitions ten days back, one old key in them, and one key claimed now.
    created = one(db, "SELECT idempotency.premake_partitions(now() - interval '10 days')")
    assert created >= 3
    db.execute("""INSERT INTO idempotency.records (scope, key, status, attempts, created_at)
                  VALUES ('ret', 'old', 'completed', 1, now() - interval '10 days')""")
    db.execute("BEGIN")
    assert one(db, "SELECT outcome FROM idem_claim('recent', scope => 'ret')") == "claimed"
    db.execute("SELECT idem_complete('recent', '{\"n\": 1}', scope => 'ret')")
    db.execute("COMMIT")
    # The worker (retention 7 days) drops every partition that ended more than 7 days ago.
    wait_for("old partitions dropped", lambda: one(
        db, "SELECT count(*) FROM idempotency.partitions WHERE range_to <= now() - interval '7 days'") == 0)
    assert one(db, "SELECT outcome FROM idem_claim('old', scope => 'ret')") == "claimed"
    assert one(db, "SELECT outcome FROM idem_claim('recent', scope => 'ret')") == "completed"
    assert one(db, "SELECT count(*) FROM idempotency.partitions WHERE range_from <= now() AND range_to > now()") == 1


def test_maintenance_as_of_ages_data_without_waiting(db):
    db.execute("SELECT idem_once('aged', scope => 'asof')")
    row = db.execute("SELECT * FROM idem_maintenance(now() + interval '30 days')").fetchone()
    created, dropped, deferred, reclaimed = row
    assert dropped >= 1 and deferred == 0
    # The key's partition is gone: a redelivery now counts as new. The current partition comes back
    # on demand, so claims never fail for lack of one.
    assert one(db, "SELECT idem_once('aged', scope => 'asof')") is True


def test_expired_lease_is_reclaimed(db):
    db.execute("SELECT idem_claim('stuck', ttl => '100 milliseconds', scope => 'reclaim')")
    wait_for("stuck lease reclaimed", lambda: one(
        db, "SELECT count(*) FROM idem_status('stuck', scope => 'reclaim')") == 0)
    # A live lease is not touched.
    db.execute("SELECT idem_claim('live', ttl => '1 hour', scope => 'reclaim')")
    time.sleep(2.5)
    assert one(db, "SELECT status FROM idem_status('live', scope => 'reclaim')") == "pending"


def test_sighup_changes_take_effect_without_restart(db):
    pid = launcher_pid(db)
    assert pid is not None
    reload(db, "idempotency.reclaim_after", "1h")
    time.sleep(2.5)  # at least one round with the new setting
    db.execute("SELECT idem_claim('kept', ttl => '100 milliseconds', scope => 'hup')")
    time.sleep(3)
    assert one(db, "SELECT status FROM idem_status('kept', scope => 'hup')") == "pending"
    reload(db, "idempotency.reclaim_after", "0")
    wait_for("reclaimed after reload", lambda: one(
        db, "SELECT count(*) FROM idem_status('kept', scope => 'hup')") == 0)
    assert launcher_pid(db) == pid, "the launcher was not restarted by a reload"


# pg_partman is packaged for Debian's PostgreSQL 15 only (scripts/install-deps installs it there); the other
# majors' runs (scripts/test, "majors") have none, and say so.
@pytest.mark.skipif(not (pgtools.pg().sharedir / "extension" / "pg_partman.control").exists(),
                    reason="no pg_partman in this PostgreSQL installation")
def test_pg_partman_handover(db):
    with connect(PARTMAN_DB) as pm:
        pgtools.install_extension(pm)
        pm.execute("CREATE SCHEMA partman")
        pm.execute("CREATE EXTENSION pg_partman SCHEMA partman")
        with pytest.raises(psycopg.Error) as refused:
            pm.execute("SELECT idem_partman_handover()")
        assert refused.value.sqlstate == "55000"
        reload(pm, "idempotency.partition_manager", "pg_partman")
        wait_for("setting visible", lambda: one(pm, "SHOW idempotency.partition_manager") == "pg_partman")
        pm.execute("SELECT idem_partman_handover()")
        cfg = pm.execute("""SELECT partition_interval, premake, retention FROM partman.part_config
                             WHERE parent_table = 'idempotency.records'""").fetchone()
        assert cfg == (pytest.approx(cfg[0]), 4, "604800 seconds")
        # Old partitions are dropped by pg_partman, not by us.
        pm.execute("SELECT idempotency.premake_partitions(now() - interval '20 days')")
        time.sleep(2.5)  # worker rounds happen, but under pg_partman they must not drop
        old = "SELECT count(*) FROM idempotency.partitions WHERE range_to <= now() - interval '7 days'"
        assert one(pm, old) >= 3
        pm.execute("SELECT partman.run_maintenance('idempotency.records')")
        assert one(pm, old) == 0
        assert one(pm, "SELECT outcome FROM idem_claim('k', scope => 'pm')") == "claimed"
        # The worker still reclaims stuck leases there.
        pm.execute("SELECT idem_claim('stuck', ttl => '100 milliseconds', scope => 'pm')")
        wait_for("stuck lease reclaimed under pg_partman", lambda: one(
            pm, "SELECT count(*) FROM idem_status('stuck', scope => 'pm')") == 0)
    reload(db, "idempotency.partition_manager", "builtin")


def metrics(conn):
    """The database-wide columns of idem_metrics() (the same on every row)."""
    row = conn.execute("SELECT rounds, failed_rounds, last_round_at, last_error, last_error_at, worker_running, "
                       "last_round_duration FROM idem_metrics() LIMIT 1").fetchone()
    return dict(zip(("rounds", "failed_rounds", "last_round_at", "last_error", "last_error_at", "worker_running",
                     "last_round_duration"), row))


def test_rounds_and_their_failures_are_reported(db):
    first = metrics(db)
    assert first["worker_running"] is True
    wait_for("two more rounds reported", lambda: metrics(db)["rounds"] >= first["rounds"] + 2)
    m = metrics(db)
    assert m["last_round_at"] > first["last_round_at"] and m["last_round_duration"] is not None
    # A round that fails: a manual one stuck behind a lock until its statement_timeout.
    failed_before = m["failed_rounds"]
    with connect() as blocker, connect() as manual:
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE idempotency.records IN ACCESS EXCLUSIVE MODE")
        manual.execute("SET statement_timeout = '300ms'")
        try:
            manual.execute("SELECT idem_maintenance()")
            raise AssertionError("the round ran through an exclusive lock")
        except psycopg.errors.QueryCanceled:
            pass
        blocker.execute("COMMIT")
    m = metrics(db)
    assert m["failed_rounds"] == failed_before + 1
    assert "statement timeout" in m["last_error"] and m["last_error_at"] is not None
    # The worker goes on: later rounds succeed, the error stays until the next one.
    wait_for("a round after the failure", lambda: metrics(db)["last_round_at"] > m["last_error_at"])
    assert metrics(db)["failed_rounds"] == failed_before + 1


def test_a_round_skipped_behind_another_is_not_counted(db):
    # A manual round's transaction holds the database's maintenance lock until it ends; the worker's
    # rounds meanwhile find it busy and skip. Skipped rounds are no rounds: the count stays still.
    # The rounds are read from maintenance_state(), which touches no table: the holder's round may
    # have created a partition, whose lock on the record table lasts until its COMMIT too.
    def rounds():
        return db.execute("SELECT rounds, last_round_at FROM idempotency.maintenance_state()").fetchone()

    # Partitions first, committed: the worker leaves a database without any alone before its round.
    db.execute("SELECT FROM idem_maintenance()")
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT idem_maintenance()")
        held = rounds()
        time.sleep(3.0)  # three of the worker's rounds at maintenance_interval = 1s
        assert rounds() == held
        holder.execute("COMMIT")
    wait_for("the worker's rounds counted again", lambda: rounds()[0] > held[0])


def test_worker_restarts_after_kill_9_and_stops_on_sigterm(db):
    pid = launcher_pid(db)
    assert pid
    db.execute("SELECT idem_once('durable', scope => 'crash')")
    os.kill(pid, signal.SIGKILL)  # the postmaster treats this as a crash: crash recovery, restart
    def relaunched():
        try:
            with connect() as c:
                p = launcher_pid(c)
                return p if p and p != pid else None
        except psycopg.OperationalError:
            return None
    new_pid = wait_for("a new launcher after the crash", relaunched, timeout=60)
    with connect() as c:
        # Nothing committed was lost in the crash.
        assert one(c, "SELECT outcome FROM idem_claim('durable', scope => 'crash')") == "completed"
        start = one(c, "SELECT pg_postmaster_start_time()")
        os.kill(new_pid, signal.SIGTERM)  # what pg_terminate_backend(pid) sends
        wait_for("launcher gone after SIGTERM", lambda: launcher_pid(c) is None)
        assert "idempotency launcher stopping" in LOG.read_text()
    with connect() as c:
        # A clean stop, not a crash: no crash recovery, the same postmaster.
        assert one(c, "SELECT pg_postmaster_start_time()") == start


def test_statistics_survive_a_clean_restart_not_a_crash(db):
    def counted():
        with connect() as c:
            return dict(c.execute("SELECT scope, claims FROM idempotency.stats").fetchall())

    def all_zero():
        with connect() as c:
            return {r[0] for r in c.execute(
                "SELECT scope FROM idempotency.stats s WHERE (SELECT max(v) FROM jsonb_each_text("
                "to_jsonb(s) - 'scope' - 'stats_reset') AS e(k, v) WHERE v::float8 <> 0) IS NULL").fetchall()}

    # A scope over 128 bytes, whose row shows a cut name: the restart must bring it back under its key,
    # not as a second row hashed from the cut name. A scope reset to zero: the restart frees its row.
    long = "kept-long-".ljust(200, "l")
    with connect() as c:
        for i in range(3):
            c.execute("SELECT idem_once(%s, scope => 'kept')", (f"k{i}",))
        c.execute("SELECT idem_once('k0', scope => %s)", (long,))
        c.execute("SELECT idem_once('k0', scope => 'emptied')")
        c.execute("SELECT idem_stats_reset('emptied')")
    before = counted()
    assert before.get("kept") == 3 and before.get("emptied") == 0
    empty = all_zero()
    assert "emptied" in empty
    SERVER.stop("fast")
    SERVER.start()
    after = counted()
    assert after == {s: n for s, n in before.items() if s not in empty}, "a clean restart lost the counters, " \
        "or kept a row whose counters were all zero"
    with connect() as c:
        c.execute("SELECT idem_once('k1', scope => %s)", (long,))
        rows = c.execute("SELECT count(*), sum(claims) FROM idempotency.stats WHERE left(scope, 10) = 'kept-long-'"
                         ).fetchone()
    assert rows == (1, 2), f"the long scope after the restart: {rows} (rows, claims)"
    victim, watcher = connect(), connect()
    os.kill(one(victim, "SELECT pg_backend_pid()"), signal.SIGKILL)  # the postmaster resets shared memory

    def crash_seen():
        # The postmaster ends every other backend before it resets shared memory; until then a new
        # connection could still read the counters of before the crash.
        try:
            watcher.execute("SELECT 1")
            return False
        except psycopg.OperationalError:
            return True
    wait_for("the postmaster to notice the crash", crash_seen, timeout=60)

    def back():
        try:
            return counted() is not None
        except psycopg.OperationalError:
            return False
    wait_for("the server back after the crash", back, timeout=60)
    assert counted().get("kept", 0) == 0, "counters came back after a crash"
