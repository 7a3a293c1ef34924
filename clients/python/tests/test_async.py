"""The asyncio forms (psycopg.AsyncConnection), each test body run with asyncio.run."""
import asyncio
import time

import psycopg
import pytest
from psycopg import errors as pgerr
from psycopg.types.json import Jsonb

from idempotency_client import Failed, Fenced, LeaseLost, TerminalError, aio

from conftest import aconnect, count, status


def arun(coro):
    return asyncio.run(coro)


def test_async_decorator_race_runs_once(cluster, connect, table, scope):
    calls = []

    @aio.idempotent(scope)
    async def place(conn, value):
        calls.append(value)
        await asyncio.sleep(0.3)
        cur = await conn.execute(f"INSERT INTO {table} (v) VALUES (%s) RETURNING id", (Jsonb(value),))
        return {"id": (await cur.fetchone())[0]}

    async def main():
        conns = [await aconnect(cluster) for _ in range(3)]
        try:
            return await asyncio.gather(*(place(c, "a-1", {"n": 1}) for c in conns))
        finally:
            for c in conns:
                await c.close()

    results = arun(main())
    assert len(calls) == 1 and count(connect(), table) == 1
    assert sorted(r[1] for r in results) == [False, True, True] and len({str(r[0]) for r in results}) == 1


def test_async_failure_savepoint_and_terminal(cluster, connect, table, scope):
    async def main():
        conn = await aconnect(cluster)
        try:
            with pytest.raises(ZeroDivisionError):
                async with aio.idempotent_call(conn, "af-1", scope=scope) as call:
                    await conn.execute(f"INSERT INTO {table} (k) VALUES ('x')")
                    1 / 0
            assert call.failure == "released"
            with pytest.raises(TerminalError):
                async with aio.idempotent_call(conn, "af-2", scope=scope):
                    raise TerminalError("no")
            with pytest.raises(Failed):
                async with aio.idempotent_call(conn, "af-2", scope=scope):
                    pass
            async with aio.idempotent_call(conn, "af-1", scope=scope) as call:
                call.result = "second attempt"
            async with aio.idempotent_call(conn, "af-1", scope=scope) as call:
                assert call.replayed and call.result == "second attempt"
        finally:
            await conn.close()

    arun(main())
    c = connect()
    assert count(c, table) == 0 and status(c, "af-1", scope)["attempts"] == 2
    assert status(c, "af-2", scope)["status"] == "failed"


def test_async_lease_heartbeats_and_lease_lost(cluster, connect, scope):
    other = connect()

    async def main():
        conn = await aconnect(cluster)
        try:
            async with aio.lease(conn, "al-1", scope=scope, ttl=0.5, heartbeat=0.1) as l:
                await asyncio.sleep(1.2)
                assert other.execute("SELECT outcome FROM idem_claim(%s, scope => %s)",
                                     ("al-1", scope)).fetchone()[0] == "in_progress"
                l.result = {"ok": True}
            assert l.beats >= 5
            with pytest.raises(LeaseLost) as ei:
                async with aio.lease(conn, "al-2", scope=scope, ttl=0.3, heartbeat=0):
                    await asyncio.sleep(0.5)
                    assert other.execute("SELECT outcome FROM idem_claim(%s, scope => %s)",
                                         ("al-2", scope)).fetchone()[0] == "claimed"
            assert ei.value.sqlstate == "55006" and isinstance(ei.value.__cause__, pgerr.ObjectInUse)
        finally:
            await conn.close()

    arun(main())
    assert status(other, "al-1", scope)["payload"] == {"ok": True}


def test_async_retry_on_serialization_failure(cluster, scope):
    async def main():
        a, b = await aconnect(cluster), await aconnect(cluster)
        attempts = []
        try:
            async def holder():
                async with aio.idempotent_call(a, "as-1", scope=scope) as call:
                    await asyncio.sleep(0.6)
                    call.result = "A"

            async def contender():
                await asyncio.sleep(0.2)

                async def once():
                    attempts.append(1)
                    async with aio.idempotent_call(b, "as-1", scope=scope, isolation="serializable") as call:
                        if not call.replayed:
                            call.result = "B"
                    return call.result, call.replayed

                return await aio.retry(once, attempts=3, conn=b)

            _, got = await asyncio.gather(holder(), contender())
            return got, len(attempts)
        finally:
            await a.close()
            await b.close()

    assert arun(main()) == (("A", True), 2)


def test_async_batch(cluster, connect, table, scope):
    async def apply(conn, m):
        await conn.execute(f"INSERT INTO {table} (k) VALUES (%s)", (m[1],))
        return m[1]

    async def main():
        conn = await aconnect(cluster)
        try:
            msgs = [("t", 0, 1, "k1"), ("t", 0, 2, "k2"), ("t", 0, 3, "k1")]
            kw = dict(key=lambda m: m[3], scope=scope, group="g" + scope, position=lambda m: m[:3], generation=1)
            first = await aio.process_batch(conn, msgs, apply, **kw)
            second = await aio.process_batch(conn, msgs, apply, **kw)
            offs = await aio.offsets(conn, "g" + scope)
            with pytest.raises(Fenced):
                await aio.process_batch(conn, [("t", 0, 4, "k4")], apply, **{**kw, "generation": 0})
            return [i.outcome for i in first], [i.outcome for i in second], offs
        finally:
            await conn.close()

    first, second, offs = arun(main())
    assert first == ["processed", "processed", "duplicate"]
    assert second == ["replayed", "replayed", "duplicate"]
    assert offs == {("t", 0): 4} and count(connect(), table) == 2


def test_async_lease_lost_carries_the_last_heartbeat_error(cluster, connect, scope):
    other, admin = connect(), connect()

    async def main():
        conn, hb = await aconnect(cluster), await aconnect(cluster)
        try:
            with pytest.raises(LeaseLost) as ei:
                async with aio.lease(conn, "ahb-1", scope=scope, ttl=0.5, heartbeat=0.1, heartbeat_conn=hb) as l:
                    admin.execute("SELECT pg_terminate_backend(%s)", (hb.info.backend_pid,))
                    for _ in range(100):
                        if l.heartbeat_error is not None:
                            break
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.7)
                    assert other.execute("SELECT outcome FROM idem_claim(%s, scope => %s)",
                                         ("ahb-1", scope)).fetchone()[0] == "claimed"
                    l.result = "late"
            return ei.value, l.heartbeat_error
        finally:
            await conn.close()
            await hb.close()

    e, hb_error = arun(main())
    assert isinstance(hb_error, psycopg.OperationalError) and e.heartbeat_error is hb_error
    assert e.sqlstate == "55006" and "last heartbeat error: " in str(e)


def test_async_batch_retries_a_real_serialization_failure(cluster, connect, table, scope):
    async def apply(conn, m):
        await conn.execute(f"INSERT INTO {table} (k) VALUES (%s)", (m,))
        return m

    async def main():
        a, b = await aconnect(cluster), await aconnect(cluster)
        attempts = []

        async def counted(conn, m):
            attempts.append(m)
            return await apply(conn, m)

        try:
            async def holder():
                async with aio.idempotent_call(a, "ab-1", scope=scope) as call:
                    await asyncio.sleep(0.6)
                    call.result = "A"

            async def batch():
                await asyncio.sleep(0.2)
                return await aio.process_batch(b, ["ab-1", "ab-2"], counted, key=lambda m: m, scope=scope,
                                               isolation="repeatable read")

            _, out = await asyncio.gather(holder(), batch())
            return [(i.key, i.outcome, i.result) for i in out], attempts
        finally:
            await a.close()
            await b.close()

    out, attempts = arun(main())
    assert out == [("ab-1", "replayed", "A"), ("ab-2", "processed", "ab-2")] and attempts == ["ab-2"]
    assert count(connect(), table) == 1
