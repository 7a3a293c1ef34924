"""One-transaction mode: IdempotentCall / @idempotent against a real cluster."""
import threading
import time

import psycopg
import pytest
from psycopg import errors as pgerr

from idempotency_client import (Failed, InProgress, LeaseLost, Mismatch, TerminalError, idempotent, idempotent_call,
                                is_transient, retry)

from conftest import count, status


def make_handler(table, calls, delay=0.0, gate=None):
    def place(conn, value):
        calls.append(value)
        if gate is not None:
            gate.wait(10)
        if delay:
            time.sleep(delay)
        (rid,) = conn.execute(f"INSERT INTO {table} (v) VALUES (%s) RETURNING id", (psycopg.types.json.Jsonb(value),)).fetchone()
        return {"id": rid, "value": value}
    return place


def test_decorator_runs_once_and_replays(connect, table, scope):
    conn, calls = connect(), []
    place = idempotent(scope)(make_handler(table, calls))
    first = place(conn, "order-1", {"amount": 5})
    again = place(conn, "order-1", {"amount": 5})
    assert first == ({"id": 1, "value": {"amount": 5}}, False)
    assert again == ({"id": 1, "value": {"amount": 5}}, True)
    assert len(calls) == 1 and count(conn, table) == 1
    assert status(conn, "order-1", scope)["status"] == "completed"
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed


def test_decorator_with_key_function_and_fingerprint(connect, table, scope):
    conn, calls = connect(), []
    from idempotency_client import fingerprint as fp

    place = idempotent(scope, key=lambda order: f"order:{order['id']}",
                       fingerprint=lambda order: fp(order, ["/id", "/amount"]))(
        lambda conn, order: make_handler(table, calls)(conn, order))
    assert place(conn, {"id": 7, "amount": 3, "trace": "a"})[1] is False
    assert place(conn, {"id": 7, "amount": 3, "trace": "b"})[1] is True  # same request, other trace
    with pytest.raises(Mismatch) as ei:
        place(conn, {"id": 7, "amount": 4})
    assert ei.value.key == "order:7" and ei.value.outcome == "mismatch"
    assert len(calls) == 1


def test_context_manager_inside_the_callers_transaction(connect, table, scope):
    conn = connect(autocommit=False)
    conn.execute("SELECT 1")  # psycopg began the caller's transaction
    with idempotent_call(conn, "k1", scope=scope) as call:
        assert not call.owns_transaction
        conn.execute(f"INSERT INTO {table} (k) VALUES ('k1')")
        call.result = {"ok": 1}
    # nothing committed yet: the caller's transaction is open
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    other = connect()
    assert status(other, "k1", scope) is None
    conn.rollback()  # the caller's choice: no trace, the key can be claimed again
    assert status(other, "k1", scope) is None and count(other, table) == 0
    with idempotent_call(conn, "k1", scope=scope) as call:  # idle: this one begins and commits its own
        assert call.owns_transaction and not call.replayed
        call.result = {"ok": 2}
    assert status(other, "k1", scope)["payload"] == {"ok": 2}


def test_failure_rolls_back_to_the_savepoint_and_records_a_retryable_failure(connect, table, scope):
    conn = connect()

    @idempotent(scope)
    def flaky(conn, n):
        conn.execute(f"INSERT INTO {table} (k) VALUES ('written before the error')")
        raise TimeoutError(f"provider timeout {n}")

    with pytest.raises(TimeoutError):
        flaky(conn, "m-1", 1)
    st = status(conn, "m-1", scope)
    assert count(conn, table) == 0  # the work was rolled back ...
    assert st["status"] == "pending" and st["token"] is None  # ... the failure committed: released
    assert st["error"] == {"error": "TimeoutError", "message": "provider timeout 1"}
    # a retry claims it again (attempt 2) and can succeed
    ok = idempotent(scope)(lambda conn: "done")
    assert ok(conn, "m-1") == ("done", False)
    assert status(conn, "m-1", scope)["attempts"] == 2


def test_terminal_failure_then_failed_outcome(connect, table, scope):
    conn = connect()

    class BadInput(Exception):
        pass

    @idempotent(scope, terminal=(BadInput,))
    def handler(conn, kind):
        conn.execute(f"INSERT INTO {table} (k) VALUES ('x')")
        if kind == "bad":
            raise BadInput("amount is negative")
        raise TerminalError("card declined", payload={"code": "declined"})

    with pytest.raises(BadInput):
        handler(conn, "k-bad", "bad")
    with pytest.raises(TerminalError):
        handler(conn, "k-declined", "declined")
    assert count(conn, table) == 0
    assert status(conn, "k-bad", scope)["status"] == "failed"
    with pytest.raises(Failed) as ei:
        handler(conn, "k-declined", "declined")
    assert ei.value.error == {"error": "TerminalError", "message": "card declined", "detail": {"code": "declined"}}


def test_retryable_failures_become_terminal_after_max_attempts(connect, scope):
    conn = connect()  # the test cluster runs with idempotency.max_attempts = 3
    answers = []

    def boom(conn):
        raise RuntimeError("always")

    for _ in range(3):
        with pytest.raises(RuntimeError):
            with idempotent_call(conn, "poison", scope=scope) as call:
                boom(conn)
        answers.append(call.failure)
    assert answers == ["released", "released", "failed"]
    with pytest.raises(Failed):
        with idempotent_call(conn, "poison", scope=scope):
            pass


def test_commit_failure_false_leaves_no_trace(connect, table, scope):
    conn = connect()
    with pytest.raises(ValueError):
        with idempotent_call(conn, "nf", scope=scope, commit_failure=False):
            conn.execute(f"INSERT INTO {table} (k) VALUES ('x')")
            raise ValueError("nope")
    assert status(conn, "nf", scope) is None and count(conn, table) == 0


def test_failure_inside_the_callers_transaction_is_the_callers_to_commit(connect, table, scope):
    conn = connect()
    with conn.transaction():
        conn.execute(f"INSERT INTO {table} (k) VALUES ('before')")
        try:
            with idempotent_call(conn, "in-caller", scope=scope):
                conn.execute(f"INSERT INTO {table} (k) VALUES ('work')")
                raise KeyError("missing field")
        except KeyError:
            pass  # the caller keeps its transaction, with the failure recorded in it
    assert [r[0] for r in conn.execute(f"SELECT k FROM {table}")] == ["before"]
    assert status(conn, "in-caller", scope)["error"]["error"] == "KeyError"


def test_in_progress_with_wait_false(connect, scope):
    holder, other = connect(autocommit=False), connect()
    holder.execute("SELECT idem_claim(%s, scope => %s)", ("busy", scope))  # open transaction holds the key
    with pytest.raises(InProgress) as ei:
        with idempotent_call(other, "busy", scope=scope, wait=False):
            pytest.fail("the body must not run")
    assert ei.value.outcome == "in_progress"
    assert other.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    holder.rollback()


def test_two_workers_race_one_key_the_handler_runs_once(connect, table, scope):
    calls, results, errors = [], [], []
    place = idempotent(scope)(make_handler(table, calls, delay=0.3))
    barrier = threading.Barrier(4)

    def worker():
        conn = connect()
        barrier.wait()
        try:
            results.append(place(conn, "race-1", {"n": 1}))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(calls) == 1 and count(connect(), table) == 1
    assert sorted(r[1] for r in results) == [False, True, True, True]
    assert len({str(r[0]) for r in results}) == 1  # everybody got the same result


def _hold_then_commit(connect, scope, key, started, release):
    conn = connect()
    with idempotent_call(conn, key, scope=scope) as call:
        started.set()
        release.wait(10)
        call.result = {"by": "A"}


def test_serializable_40001_is_retried_then_replays(connect, table, scope):
    started, release = threading.Event(), threading.Event()
    a = threading.Thread(target=_hold_then_commit, args=(connect, scope, "ser-1", started, release))
    a.start()
    assert started.wait(10)
    conn, attempts = connect(), []

    def attempt():
        attempts.append(1)
        if len(attempts) == 1:  # let A commit while this attempt waits on the key
            threading.Timer(0.5, release.set).start()
        with idempotent_call(conn, "ser-1", scope=scope, isolation="serializable") as call:
            if not call.replayed:
                call.result = {"by": "B"}
        return call.result, call.replayed

    assert retry(attempt, attempts=3, conn=conn) == ({"by": "A"}, True)
    a.join(10)
    assert len(attempts) == 2  # the first raised 40001, the second replayed


def test_serialization_failure_is_psycopgs_error_not_lease_lost(connect, scope):
    started, release = threading.Event(), threading.Event()
    a = threading.Thread(target=_hold_then_commit, args=(connect, scope, "ser-2", started, release))
    a.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()
    conn = connect()
    with pytest.raises(pgerr.SerializationFailure) as ei:
        with idempotent_call(conn, "ser-2", scope=scope, isolation="repeatable read"):
            pass
    a.join(10)
    assert is_transient(ei.value) and not isinstance(ei.value, LeaseLost)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_decorator_retries_on_serialization_failure(connect, table, scope):
    started, release = threading.Event(), threading.Event()
    a = threading.Thread(target=_hold_then_commit, args=(connect, scope, "ser-3", started, release))
    a.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()
    calls = []
    place = idempotent(scope, isolation="serializable", retries=3)(make_handler(table, calls))
    assert place(connect(), "ser-3", {"n": 3}) == ({"by": "A"}, True)
    a.join(10)
    assert calls == []


def test_decorator_retries_serialization_failures_by_default(connect, table, scope):
    """No retries= given: the decorator owns the transaction and re-runs it on 40001 (like Go's Wrapper
    and Node's guard, 5 attempts in all by default)."""
    started, release = threading.Event(), threading.Event()
    a = threading.Thread(target=_hold_then_commit, args=(connect, scope, "ser-4", started, release))
    a.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()
    calls = []
    place = idempotent(scope, isolation="repeatable read")(make_handler(table, calls))
    try:
        assert place(connect(), "ser-4", {"n": 4}) == ({"by": "A"}, True)
    finally:
        a.join(10)
    assert calls == []


def test_default_attempts_match_go_and_node():
    import idempotency_client

    assert (idempotency_client.DEFAULT_ATTEMPTS, idempotency_client.DEFAULT_RETRIES) == (5, 4)


def test_decorator_retries_0_raises_the_serialization_failure(connect, table, scope):
    started, release = threading.Event(), threading.Event()
    a = threading.Thread(target=_hold_then_commit, args=(connect, scope, "ser-5", started, release))
    a.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()
    calls = []
    place = idempotent(scope, isolation="repeatable read", retries=0)(make_handler(table, calls))
    try:
        with pytest.raises(pgerr.SerializationFailure):
            place(connect(), "ser-5", {"n": 5})
    finally:
        a.join(10)
    assert calls == []


def test_database_errors_reach_the_caller_unchanged(connect, scope):
    conn = connect()
    with pytest.raises(pgerr.InvalidParameterValue):  # 22023: empty key
        with idempotent_call(conn, "", scope=scope):
            pass

    @idempotent(scope)
    def huge(conn):
        return {"blob": "x" * (2 << 20)}  # beyond idempotency.max_payload_bytes (1MB)

    with pytest.raises(pgerr.ProgramLimitExceeded):  # 54000, from idem_complete: all rolled back
        huge(conn, "big")
    assert status(conn, "big", scope) is None


def test_transaction_errors_from_the_handler_are_not_recorded(connect, scope):
    conn = connect()

    @idempotent(scope)
    def deadlocked(conn):
        raise pgerr.DeadlockDetected("simulated 40P01 from the work")

    with pytest.raises(pgerr.DeadlockDetected):
        deadlocked(conn, "dl")
    assert status(conn, "dl", scope) is None  # rolled back as a whole, for a retry
