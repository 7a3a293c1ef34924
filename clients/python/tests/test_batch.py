"""Batch processing of a poll: idem_claim_batch, idem_complete_batch and offsets in one transaction."""
from collections import namedtuple

import psycopg
import pytest
from psycopg.types.json import Jsonb

from idempotency_client import Fenced, LeaseLost, TerminalError, next_offset, offsets, process_batch, record_offset

from conftest import count, status

Msg = namedtuple("Msg", "topic partition offset key value")


def poll(*specs):
    return [Msg("payments", p, o, k, v) for p, o, k, v in specs]


def run(conn, msgs, table, scope, calls, group="billing", generation=3, **kw):
    def apply(conn, m):
        calls.append(m.key)
        if m.value == "terminal":
            raise TerminalError("bad payment", payload={"offset": m.offset})
        if m.value == "flaky":
            raise TimeoutError("ledger busy")
        conn.execute(f"INSERT INTO {table} (k, v) VALUES (%s, %s)", (m.key, Jsonb(m.value)))
        return {"applied": m.key}

    return process_batch(conn, msgs, apply, key=lambda m: m.key, scope=scope, group=group + scope,
                         position=lambda m: (m.topic, m.partition, m.offset), generation=generation, **kw)


def test_a_poll_in_one_transaction(connect, table, scope):
    conn, calls = connect(), []
    msgs = poll((0, 10, "a", 1), (0, 11, "b", 2), (1, 5, "c", 3), (0, 12, "a", 1), (1, 6, "d", 4))
    out = run(conn, msgs, table, scope, calls)
    assert [i.outcome for i in out] == ["processed", "processed", "processed", "duplicate", "processed"]
    assert calls == ["a", "b", "c", "d"] and count(conn, table) == 4
    assert offsets(conn, "billing" + scope) == {("payments", 0): 13, ("payments", 1): 7}
    assert status(conn, "c", scope)["payload"] == {"applied": "c"}
    # the same poll again (a redelivery): everything replays, nothing runs, the offsets stay
    calls.clear()
    out = run(conn, msgs, table, scope, calls)
    assert [i.outcome for i in out] == ["replayed", "replayed", "replayed", "duplicate", "replayed"]
    assert out[0].result == {"applied": "a"} and out[0].replayed
    assert calls == [] and count(conn, table) == 4
    assert next_offset(conn, "billing" + scope, "payments", 1) == 7


def test_terminal_failure_is_dead_lettered_and_the_batch_goes_on(connect, table, scope):
    conn, calls = connect(), []
    out = run(conn, poll((0, 1, "x", 1), (0, 2, "poison", "terminal"), (0, 3, "y", 2)), table, scope, calls)
    assert [i.outcome for i in out] == ["processed", "failed", "processed"]
    assert out[1].error == {"error": "TerminalError", "message": "bad payment", "detail": {"offset": 2}}
    assert count(conn, table) == 2 and status(conn, "poison", scope)["status"] == "failed"
    assert offsets(conn, "billing" + scope) == {("payments", 0): 4}
    out = run(conn, poll((0, 2, "poison", "terminal")), table, scope, calls)
    assert out[0].outcome == "failed" and calls.count("poison") == 1


def test_retryable_failure_rolls_back_the_whole_poll(connect, table, scope):
    conn, calls = connect(), []
    msgs = poll((0, 1, "p", 1), (0, 2, "flaky", "flaky"), (0, 3, "q", 2))
    for attempt in (1, 2, 3):
        with pytest.raises(TimeoutError):
            run(conn, msgs, table, scope, calls)
        assert count(conn, table) == 0 and offsets(conn, "billing" + scope) == {}
        assert status(conn, "p", scope) is None  # its claim went with the batch
        st = status(conn, "flaky", scope)
        assert st["attempts"] == attempt and st["error"]["error"] == "TimeoutError"
    # max_attempts (3) reached: the key is terminal and the poll goes through without it
    assert status(conn, "flaky", scope)["status"] == "failed"
    out = run(conn, msgs, table, scope, calls)
    assert [i.outcome for i in out] == ["processed", "failed", "processed"]
    assert offsets(conn, "billing" + scope) == {("payments", 0): 4}


def test_a_zombie_generation_is_fenced(connect, table, scope):
    conn, calls = connect(), []
    group = "billing" + scope
    with conn.transaction():
        assert record_offset(conn, group, "payments", 0, 100, generation=5)
    with pytest.raises(Fenced) as ei:
        run(conn, poll((0, 101, "late", 1)), table, scope, calls, generation=4)
    e = ei.value
    assert isinstance(e, LeaseLost) and e.sqlstate == "55006" and e.generation == 4
    assert isinstance(e.__cause__, psycopg.errors.ObjectInUse)
    assert count(conn, table) == 0 and status(conn, "late", scope) is None
    assert next_offset(conn, group, "payments", 0) == 101


def test_batch_inside_the_callers_transaction(connect, table, scope):
    conn, calls = connect(), []
    with conn.transaction():
        conn.execute(f"INSERT INTO {table} (k) VALUES ('mine')")
        run(conn, poll((2, 0, "m1", 1)), table, scope, calls)
    assert count(conn, table) == 2
    assert offsets(conn, "billing" + scope) == {("payments", 2): 1}
