"""Two-transaction mode: lease, heartbeats, fencing tokens, LeaseLost."""
import threading
import time

import psycopg
import pytest
from psycopg import errors as pgerr

from idempotency_client import Failed, InProgress, LeaseLost, TerminalError, is_transient, lease

from conftest import count, status


def claim_outcome(conn, key, scope, ttl="10 seconds"):
    return conn.execute("SELECT outcome, token FROM idem_claim(%s, ttl => %s::interval, scope => %s)",
                        (key, ttl, scope)).fetchone()


def test_lease_heartbeats_keep_it_alive_then_complete(connect, table, scope):
    conn, other = connect(), connect()
    with lease(conn, "job-1", scope=scope, ttl=0.6, heartbeat=0.15) as l:
        assert l.outcome == "claimed" and l.token > 0
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # the claim committed
        time.sleep(1.5)  # 2.5 ttls: alive only thanks to the heartbeats
        assert claim_outcome(other, "job-1", scope)[0] == "in_progress"
        l.complete({"rendered": True}, write=lambda c: c.execute(f"INSERT INTO {table} (k) VALUES ('job-1')"))
    assert l.beats >= 5 and l.heartbeat_error is None and not l.lost
    assert status(other, "job-1", scope)["payload"] == {"rendered": True} and count(other, table) == 1
    with lease(conn, "job-1", scope=scope, ttl=5) as again:
        assert again.replayed and again.result == {"rendered": True}


def test_lost_lease_raises_lease_lost_and_rolls_back_the_write(connect, table, scope):
    conn, other = connect(), connect()
    with pytest.raises(LeaseLost) as ei:
        with lease(conn, "job-2", scope=scope, ttl=0.3, heartbeat=0) as l:  # no heartbeats: a stalled worker
            time.sleep(0.6)
            outcome, token = claim_outcome(other, "job-2", scope)  # B takes it over
            assert outcome == "claimed" and token > l.token
            l.complete({"by": "A"}, write=lambda c: c.execute(f"INSERT INTO {table} (k) VALUES ('A')"))
    e = ei.value
    assert e.sqlstate == "55006" and isinstance(e.__cause__, pgerr.ObjectInUse) and e.pgerror is e.__cause__
    assert e.token == l.token and not is_transient(e) and not isinstance(e, psycopg.Error)
    assert count(other, table) == 0  # A's result row went with its refused completion
    other.execute("SELECT idem_complete(%s, %s, scope => %s, token => %s)", ("job-2", '{"by": "B"}', scope, token))
    assert status(other, "job-2", scope)["payload"] == {"by": "B"}


def test_heartbeat_notices_the_takeover(connect, scope):
    conn, other = connect(), connect()
    with pytest.raises(LeaseLost):
        with lease(conn, "job-3", scope=scope, ttl=0.3, heartbeat=0.8) as l:
            time.sleep(0.5)
            assert claim_outcome(other, "job-3", scope)[0] == "claimed"
            deadline = time.monotonic() + 5
            while not l.lost and time.monotonic() < deadline:
                time.sleep(0.05)
            assert l.lost
            l.check()  # raises LeaseLost: the body stops early
    # the exit did not try to fail the key with the old token: B still holds it
    assert status(other, "job-3", scope)["status"] == "pending"


def test_body_failure_is_recorded_with_the_token(connect, scope):
    conn = connect()
    with pytest.raises(ConnectionError):
        with lease(conn, "job-4", scope=scope, ttl=5, heartbeat=0):
            raise ConnectionError("provider unreachable")
    st = status(conn, "job-4", scope)
    assert st["status"] == "pending" and st["token"] is None and st["error"]["error"] == "ConnectionError"
    with pytest.raises(TerminalError):
        with lease(conn, "job-4", scope=scope, ttl=5, heartbeat=0) as l:
            raise TerminalError("invalid account")
    assert l.failure == "failed"
    with pytest.raises(Failed):
        with lease(conn, "job-4", scope=scope, ttl=5):
            pass


def test_live_lease_means_in_progress(connect, scope):
    conn, other = connect(), connect()
    claim_outcome(other, "job-5", scope, ttl="30 seconds")
    with pytest.raises(InProgress) as ei:
        with lease(conn, "job-5", scope=scope, ttl=5):
            pytest.fail("must not run")
    assert ei.value.expires_at is not None


def test_lease_needs_an_idle_connection(connect, scope):
    conn = connect(autocommit=False)
    conn.execute("SELECT 1")
    with pytest.raises(ValueError):
        with lease(conn, "job-6", scope=scope):
            pass
    conn.rollback()


def test_two_leases_race_the_handler_runs_once(connect, scope):
    runs, results = [], []
    barrier = threading.Barrier(3)

    def worker():
        conn = connect()
        barrier.wait()
        try:
            with lease(conn, "job-7", scope=scope, ttl=5, heartbeat=0.5) as l:
                if not l.replayed:
                    runs.append(1)
                    time.sleep(0.3)
                    l.result = "charged"
            results.append(("done", l.replayed))
        except InProgress:
            results.append(("in_progress", None))

    ts = [threading.Thread(target=worker) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(runs) == 1 and len(results) == 3
    assert ("done", False) in results


def test_lease_lost_carries_the_last_heartbeat_error(connect, scope, caplog):
    """The heartbeat connection dies (its backend terminated): the beats fail, the lease expires under a
    live holder, another worker takes the key over, and the completion's LeaseLost says why."""
    conn, other, admin, hb = connect(), connect(), connect(), connect()
    with caplog.at_level("WARNING", logger="idempotency_client"):
        with pytest.raises(LeaseLost) as ei:
            with lease(conn, "job-hb", scope=scope, ttl=0.5, heartbeat=0.1, heartbeat_conn=hb) as l:
                admin.execute("SELECT pg_terminate_backend(%s)", (hb.info.backend_pid,))
                deadline = time.monotonic() + 5
                while l.heartbeat_error is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert isinstance(l.heartbeat_error, psycopg.OperationalError)
                time.sleep(0.7)  # past the ttl: nothing extended the lease
                assert claim_outcome(other, "job-hb", scope)[0] == "claimed"
                l.result = {"by": "A"}  # completed at the exit: refused
    e = ei.value
    assert e.sqlstate == "55006" and isinstance(e.__cause__, pgerr.ObjectInUse) and e.pgerror is e.__cause__
    assert e.heartbeat_error is l.heartbeat_error and isinstance(e.heartbeat_error, psycopg.OperationalError)
    assert "last heartbeat error: " in str(e) and not l.lost
    assert any("heartbeat of key 'job-hb'" in r.getMessage() for r in caplog.records)
    assert status(other, "job-hb", scope)["status"] == "pending"  # B's claim stands


def test_lease_lost_without_heartbeat_errors_has_none(connect, scope):
    conn, other = connect(), connect()
    with pytest.raises(LeaseLost) as ei:
        with lease(conn, "job-hb2", scope=scope, ttl=0.3, heartbeat=0.8) as l:
            time.sleep(0.5)
            assert claim_outcome(other, "job-hb2", scope)[0] == "claimed"
            deadline = time.monotonic() + 5
            while not l.lost and time.monotonic() < deadline:
                time.sleep(0.05)
            l.check()
    assert ei.value.heartbeat_error is None and "last heartbeat error" not in str(ei.value)


def test_lease_complete_reruns_a_deadlocked_write(connect, table, scope):
    """complete(write=) owns its transaction: a real deadlock (40P01) in it runs write and idem_complete
    again, by default."""
    conn, b, watch = connect(), connect(autocommit=False), connect()
    conn.execute(f"INSERT INTO {table} (id, k) VALUES (1, 'one'), (2, 'two')")
    b.execute("SET deadlock_timeout = '10s'")  # the lease's session (100 ms) is the one that detects it
    b.execute(f"UPDATE {table} SET k = 'b' WHERE id = 2")  # B holds row 2, in an open transaction
    b_pid, attempts, threads = b.info.backend_pid, [], []

    def b_takes_row_1():
        b.execute(f"UPDATE {table} SET k = 'b' WHERE id = 1")
        b.commit()

    def write(c):
        attempts.append(1)
        c.execute(f"UPDATE {table} SET k = 'lease' WHERE id = 1")
        if len(attempts) == 1:
            t = threading.Thread(target=b_takes_row_1)
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not watch.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (b_pid,)).fetchone()[0]:
                time.sleep(0.02)
        c.execute(f"UPDATE {table} SET k = 'lease' WHERE id = 2")  # B waits for row 1: a deadlock

    with lease(conn, "job-dl", scope=scope, ttl=5, heartbeat=0) as l:
        l.complete({"ok": True}, write=write)
    for t in threads:
        t.join(10)
    assert len(attempts) == 2
    assert status(conn, "job-dl", scope)["payload"] == {"ok": True}
    assert conn.execute(f"SELECT array_agg(k ORDER BY id) FROM {table}").fetchone()[0] == ["lease", "lease"]


def test_lease_complete_retries_0_raises_the_deadlock(connect, table, scope):
    conn, b, watch = connect(), connect(autocommit=False), connect()
    conn.execute(f"INSERT INTO {table} (id, k) VALUES (1, 'one'), (2, 'two')")
    b.execute("SET deadlock_timeout = '10s'")
    b.execute(f"UPDATE {table} SET k = 'b' WHERE id = 2")
    b_pid, threads = b.info.backend_pid, []

    def b_takes_row_1():
        b.execute(f"UPDATE {table} SET k = 'b' WHERE id = 1")
        b.commit()

    def write(c):
        c.execute(f"UPDATE {table} SET k = 'lease' WHERE id = 1")
        t = threading.Thread(target=b_takes_row_1)
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not watch.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (b_pid,)).fetchone()[0]:
            time.sleep(0.02)
        c.execute(f"UPDATE {table} SET k = 'lease' WHERE id = 2")

    with pytest.raises(pgerr.DeadlockDetected):
        with lease(conn, "job-dl0", scope=scope, ttl=5, heartbeat=0, retries=0) as l:
            l.complete({"ok": True}, write=write)
    for t in threads:
        t.join(10)
    assert status(conn, "job-dl0", scope)["status"] == "pending"  # not completed; the lease is still ours
