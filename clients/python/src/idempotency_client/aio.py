"""The asyncio (psycopg.AsyncConnection) API: the same helpers as the package's top level, awaited.

    from idempotency_client import aio

    async with aio.idempotent_call(conn, key, scope="orders") as call: ...
    @aio.idempotent("orders")            # async def handler(conn, ...)
    async with aio.lease(conn, key, ttl=30) as l: ...   # heartbeats from an asyncio task
    await aio.retry(fn) / aio.run_transaction(conn, fn) / aio.process_batch(conn, items, handler, key=...)
"""
from __future__ import annotations

import asyncio
import functools
import logging
import sys
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus

from . import _core
from ._core import TTL, FailurePolicy
from ._sync import BatchItem, _jsonb, _last_offsets
from .errors import DEFAULT_RETRIES, Fenced, LeaseLost, is_transient

logger = logging.getLogger("idempotency_client")

__all__ = ["IdempotentCall", "idempotent_call", "idempotent", "Lease", "lease", "retry", "run_transaction",
           "BatchItem", "process_batch", "claim_batch", "complete_batch", "record_offset", "next_offset", "offsets"]


class IdempotentCall:
    """``async with idempotent_call(conn, key, ...) as call:`` -- the asyncio form of
    idempotency_client.IdempotentCall (same transactions, outcomes, savepoint and failure rules)."""

    def __init__(self, conn: psycopg.AsyncConnection, key: str, *, scope: str = "default",
                 fingerprint: Optional[str] = None, ttl: TTL = None, wait: bool = True,
                 commit_failure: bool = True, isolation: Optional[str] = None,
                 failure_policy: Optional[FailurePolicy] = None, terminal=(), retryable=None, error_payload=None):
        self.conn, self.key, self.scope = conn, key, scope
        self.fingerprint, self.ttl, self.wait = fingerprint, ttl, wait
        self.commit_failure = commit_failure
        self.isolation_sql = _core.set_isolation_sql(isolation)
        self.policy = failure_policy or _core.policy(terminal, retryable, error_payload)
        self.outcome = self.token = self.attempts = self.expires_at = None
        self.replayed = False
        self.result: Any = None
        self.failure: Optional[str] = None
        self.owns_transaction = False
        self._tx = self._sp = None

    async def __aenter__(self) -> "IdempotentCall":
        conn = self.conn
        self.owns_transaction = conn.info.transaction_status == TransactionStatus.IDLE
        if self.isolation_sql and not self.owns_transaction:
            raise ValueError("isolation= needs an idle connection: the helper must begin the transaction")
        self._tx = conn.transaction()
        await self._tx.__aenter__()
        try:
            if self.isolation_sql and self.owns_transaction:
                await conn.execute(self.isolation_sql)
            cur = await conn.execute(_core.CLAIM_SQL, (self.key, _core.interval(self.ttl), self.scope,
                                                       self.fingerprint, self.wait))
            self.outcome, self.token, self.attempts, payload, self.expires_at = await cur.fetchone()
            err = _core.outcome_error(self.outcome, self.key, self.scope, self.attempts, payload, self.expires_at)
            if err is not None:
                raise err
            if self.outcome == "completed":
                self.replayed, self.result = True, payload
            else:
                self._sp = conn.transaction()
                await self._sp.__aenter__()
        except BaseException:
            await self._tx.__aexit__(*sys.exc_info())
            raise
        return self

    def complete(self, result: Any = None) -> None:
        self.result = result

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        conn = self.conn
        if self._sp is None:
            return bool(await self._tx.__aexit__(exc_type, exc, tb))
        if exc is None:
            try:
                await self._sp.__aexit__(None, None, None)
                try:
                    await conn.execute(_core.COMPLETE_SQL, (self.key, _jsonb(self.result), self.scope, None))
                except psycopg.Error as e:
                    if _core.is_lease_lost(e, with_token=False):
                        raise _core.lease_lost(e, "idem_complete", self.key, self.scope, None) from e
                    raise
            except BaseException:
                await self._tx.__aexit__(*sys.exc_info())
                raise
            await self._tx.__aexit__(None, None, None)
            return False
        await self._sp.__aexit__(exc_type, exc, tb)
        if not _core.records_failure(exc, conn):
            await self._tx.__aexit__(exc_type, exc, tb)
            return False
        try:
            cur = await conn.execute(_core.FAIL_SQL, (self.key, _jsonb(self.policy.payload(exc)),
                                                      self.policy.is_retryable(exc), self.scope, None))
            (self.failure,) = await cur.fetchone()
        except BaseException:
            await self._tx.__aexit__(*sys.exc_info())
            raise
        if self.commit_failure:
            await self._tx.__aexit__(None, None, None)
        else:
            await self._tx.__aexit__(exc_type, exc, tb)
        return False


def idempotent_call(conn, key, **options) -> IdempotentCall:
    return IdempotentCall(conn, key, **options)


def idempotent(scope: str = "default", *, key: Optional[Callable[..., str]] = None,
               fingerprint: Optional[Callable[..., Optional[str]]] = None, retries: int = DEFAULT_RETRIES,
               backoff: float = 0.05, **options):
    """Decorator for ``async def handler(conn, *args, **kwargs)``; see idempotency_client.idempotent
    (``retries``: 40001 / 40P01 re-run the whole transaction, default 4 times, when the helper owns it)."""

    def decorate(handler):
        @functools.wraps(handler)
        async def wrapper(conn, *args, **kwargs):
            if key is None:
                if not args:
                    raise TypeError(f"{handler.__name__}: called without a key (f(conn, key, *args))")
                k, args = args[0], args[1:]
            else:
                k = key(*args, **kwargs)
            fp = fingerprint(*args, **kwargs) if fingerprint is not None else None

            async def attempt():
                async with IdempotentCall(conn, k, scope=scope, fingerprint=fp, **options) as call:
                    if not call.replayed:
                        call.result = await handler(conn, *args, **kwargs)
                return call.result, call.replayed

            if retries:
                return await retry(attempt, attempts=retries + 1, backoff=backoff, conn=conn)
            return await attempt()

        return wrapper

    return decorate


async def retry(fn: Callable[[], Awaitable[Any]], *, attempts: int = 5, backoff: float = 0.05, conn=None):
    """Awaits ``fn()`` again on 40001 / 40P01, at most ``attempts`` times; see idempotency_client.retry."""
    for attempt in range(attempts):
        try:
            return await fn()
        except psycopg.Error as e:
            if not is_transient(e) or attempt == attempts - 1:
                raise
            if conn is not None and conn.info.transaction_status != TransactionStatus.IDLE:
                raise
            await asyncio.sleep(_core.backoff_delay(attempt, backoff))
    raise AssertionError("unreachable")


async def run_transaction(conn: psycopg.AsyncConnection, fn, *, attempts: int = 5, isolation: Optional[str] = None,
                          backoff: float = 0.05):
    """Awaits ``fn(conn)`` in a transaction of its own, re-run on 40001 / 40P01."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("run_transaction needs an idle connection (no transaction open)")
    set_iso = _core.set_isolation_sql(isolation)

    async def once():
        async with conn.transaction():
            if set_iso:
                await conn.execute(set_iso)
            return await fn(conn)

    return await retry(once, attempts=attempts, backoff=backoff, conn=conn)


class Lease:
    """``async with lease(conn, key, ttl=30) as l:`` -- the asyncio form of idempotency_client.Lease;
    heartbeats run as an asyncio task on a connection of their own (``heartbeat_conn``, or one opened with
    ``conn``'s parameters). Same ``retries`` of its claim / complete / fail transactions, same
    ``heartbeat_error`` on the LeaseLost it raises."""

    def __init__(self, conn: psycopg.AsyncConnection, key: str, *, ttl: TTL = None, scope: str = "default",
                 fingerprint: Optional[str] = None, wait: bool = True, heartbeat: Optional[float] = None,
                 heartbeat_conn: Optional[psycopg.AsyncConnection] = None, retries: int = DEFAULT_RETRIES,
                 backoff: float = 0.05,
                 failure_policy: Optional[FailurePolicy] = None, terminal=(), retryable=None, error_payload=None):
        self.conn, self.key, self.scope, self.ttl = conn, key, scope, ttl
        self.retries, self.backoff = retries, backoff
        self.fingerprint, self.wait = fingerprint, wait
        self.interval = _core.heartbeat_interval(ttl, heartbeat)
        self.policy = failure_policy or _core.policy(terminal, retryable, error_payload)
        self.outcome = self.token = self.attempts = self.expires_at = None
        self.replayed = False
        self.result: Any = None
        self.failure: Optional[str] = None
        self.beats = 0
        self.heartbeat_error: Optional[BaseException] = None
        self._lost: Optional[LeaseLost] = None
        self._hb_conn, self._own_hb_conn = heartbeat_conn, False
        self._task: Optional[asyncio.Task] = None
        self._settled = False

    async def __aenter__(self) -> "Lease":
        conn = self.conn
        if conn.info.transaction_status != TransactionStatus.IDLE:
            raise ValueError("lease needs an idle connection: its claim must commit before the work")
        async def claim():
            cur = await conn.execute(_core.CLAIM_SQL, (self.key, _core.interval(self.ttl), self.scope,
                                                       self.fingerprint, self.wait))
            return await cur.fetchone()

        row = await self._transaction(claim)
        self.outcome, self.token, self.attempts, payload, self.expires_at = row
        err = _core.outcome_error(self.outcome, self.key, self.scope, self.attempts, payload, self.expires_at)
        if err is not None:
            raise err
        if self.outcome == "completed":
            self.replayed, self.result, self._settled = True, payload, True
            return self
        if self.interval > 0:
            try:
                if self._hb_conn is None:
                    info = conn.info
                    self._hb_conn = await psycopg.AsyncConnection.connect(
                        make_conninfo(info.dsn, password=info.password or None), autocommit=True)
                    self._own_hb_conn = True
            except BaseException:
                await self._release_after_error(*sys.exc_info())
                raise
            self._task = asyncio.ensure_future(self._beat_loop())
        return self

    async def _transaction(self, fn):
        """await fn() in a transaction of the helper's own on conn, re-run on 40001 / 40P01."""
        async def once():
            async with self.conn.transaction():
                return await fn()
        return await retry(once, attempts=self.retries + 1, backoff=self.backoff, conn=self.conn)

    def _lease_lost(self, e: BaseException, what: str) -> LeaseLost:
        return _core.lease_lost(e, what, self.key, self.scope, self.token, heartbeat_error=self.heartbeat_error)

    async def _beat_loop(self):
        while True:
            await asyncio.sleep(self.interval)
            try:
                async with self._hb_conn.transaction():
                    cur = await self._hb_conn.execute(
                        _core.HEARTBEAT_SQL, (self.key, _core.interval(self.ttl), self.scope, self.token))
                    (self.expires_at,) = await cur.fetchone()
                self.beats += 1
            except psycopg.Error as e:
                if _core.is_lease_lost(e, with_token=True):
                    self._lost = self._lease_lost(e, "idem_heartbeat")
                    self._lost.__cause__ = e
                    return
                self.heartbeat_error = e
                logger.warning("heartbeat of key %r (scope %r, token %s) failed, next in %.2f s: %s",
                               self.key, self.scope, self.token, self.interval, e)

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def check(self) -> None:
        if self._lost is not None:
            raise self._lost

    async def _stop_heartbeats(self):
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._own_hb_conn and self._hb_conn is not None:
            await self._hb_conn.close()
            self._hb_conn, self._own_hb_conn = None, False

    async def complete(self, result: Any = None, *, write=None):
        """Stops the heartbeats; in one transaction ``await write(conn)`` and idem_complete with the token."""
        if self._settled:
            raise RuntimeError(f"lease of {self.key!r} is already settled")
        await self._stop_heartbeats()
        self.result = result
        self._settled = True
        async def once():
            if write is not None:
                await write(self.conn)
            await self.conn.execute(_core.COMPLETE_SQL, (self.key, _jsonb(result), self.scope, self.token))

        try:
            await self._transaction(once)
        except psycopg.Error as e:
            if _core.is_lease_lost(e, with_token=True):
                raise self._lease_lost(e, "idem_complete") from e
            raise

    async def fail(self, error: Any, *, retryable: bool = True) -> str:
        if self._settled:
            raise RuntimeError(f"lease of {self.key!r} is already settled")
        await self._stop_heartbeats()
        self._settled = True
        async def once():
            cur = await self.conn.execute(_core.FAIL_SQL, (self.key, _jsonb(error), retryable, self.scope,
                                                           self.token))
            return (await cur.fetchone())[0]

        try:
            self.failure = await self._transaction(once)
        except psycopg.Error as e:
            if _core.is_lease_lost(e, with_token=True):
                raise self._lease_lost(e, "idem_fail") from e
            raise
        return self.failure

    async def _release_after_error(self, exc_type, exc, tb):
        await self._stop_heartbeats()
        if self._settled:
            return
        if _core.records_failure(exc, self.conn) and self.conn.info.transaction_status == TransactionStatus.IDLE:
            await self.fail(self.policy.payload(exc), retryable=self.policy.is_retryable(exc))

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            await self._stop_heartbeats()
            if not self._settled:
                await self.complete(self.result)
            return False
        try:
            await self._release_after_error(exc_type, exc, tb)
        finally:
            await self._stop_heartbeats()
        return False


def lease(conn, key, **options) -> Lease:
    return Lease(conn, key, **options)


async def claim_batch(conn, keys: Sequence[str], *, ttl: TTL = None, scope: str = "default") -> List[tuple]:
    cur = await conn.execute(_core.CLAIM_BATCH_SQL, (list(keys), _core.interval(ttl), scope))
    return await cur.fetchall()


async def complete_batch(conn, keys: Sequence[str], payloads=None, *, scope: str = "default") -> int:
    if not keys:
        return 0
    docs = None if payloads is None else [_jsonb(p) for p in payloads]
    cur = await conn.execute(_core.COMPLETE_BATCH_SQL, (list(keys), docs, scope))
    return (await cur.fetchone())[0]


async def record_offset(conn, group: str, topic: str, partition: int, offset: int,
                        generation: Optional[int] = None) -> bool:
    try:
        cur = await conn.execute(_core.RECORD_OFFSET_SQL, (group, topic, partition, offset, generation))
        return (await cur.fetchone())[0]
    except psycopg.Error as e:
        if e.sqlstate == "55006":
            raise Fenced(f"idem_record_offset({group!r}, {topic!r}, {partition}, {offset}, generation {generation}):"
                         f" fenced by a newer generation: {e}", group=group, topic=topic, partition=partition,
                         generation=generation, pgerror=e) from e
        raise


async def next_offset(conn, group: str, topic: str, partition: int) -> Optional[int]:
    cur = await conn.execute(_core.NEXT_OFFSET_SQL, (group, topic, partition))
    return (await cur.fetchone())[0]


async def offsets(conn, group: str, topic: Optional[str] = None) -> Dict[Tuple[str, int], int]:
    cur = await conn.execute(_core.OFFSETS_SQL, (group, topic))
    return {(t, p): n for t, p, n, _g, _u in await cur.fetchall()}


async def process_batch(conn, items, handler, *, key, scope: str = "default", ttl: TTL = None,
                        group: Optional[str] = None, position=None, generation: Optional[int] = None,
                        isolation: Optional[str] = None, retries: int = DEFAULT_RETRIES, backoff: float = 0.05,
                        failure_policy: Optional[FailurePolicy] = None,
                        terminal=(), retryable=None, error_payload=None) -> List[BatchItem]:
    """The asyncio form of idempotency_client.process_batch (``await handler(conn, item)``; the same
    re-runs of the whole batch on 40001 / 40P01 when the helper owns the transaction)."""
    items = list(items)
    if not items:
        return []
    pol = failure_policy or _core.policy(terminal, retryable, error_payload)
    owns = conn.info.transaction_status == TransactionStatus.IDLE
    set_iso = _core.set_isolation_sql(isolation)
    keys = [key(it) for it in items]
    retry_failure = None

    async def once() -> List[BatchItem]:
        nonlocal retry_failure
        retry_failure = None
        async with conn.transaction():
            if set_iso and owns:
                await conn.execute(set_iso)
            rows = await claim_batch(conn, keys, ttl=ttl, scope=scope)
            out: List[BatchItem] = []
            done_keys, done_payloads = [], []
            seen = set()
            for it, k, row in zip(items, keys, rows):
                _k, outcome, _token, attempts, payload, expires_at = row
                if k in seen:
                    out.append(BatchItem(it, k, "duplicate"))
                    continue
                seen.add(k)
                if outcome == "completed":
                    out.append(BatchItem(it, k, "replayed", result=payload))
                elif outcome == "failed":
                    out.append(BatchItem(it, k, "failed", error=payload))
                elif outcome == "claimed":
                    try:
                        async with conn.transaction():
                            result = await handler(conn, it)
                    except Exception as e:
                        if not _core.records_failure(e, conn) or pol.is_retryable(e):
                            if _core.records_failure(e, conn):
                                retry_failure = (k, e)
                            raise
                        error = pol.payload(e)
                        await conn.execute(_core.FAIL_SQL, (k, _jsonb(error), False, scope, None))
                        out.append(BatchItem(it, k, "failed", error=error))
                        continue
                    done_keys.append(k)
                    done_payloads.append(result)
                    out.append(BatchItem(it, k, "processed", result=result))
                else:
                    raise _core.outcome_error(outcome, k, scope, attempts, payload, expires_at)
            await complete_batch(conn, done_keys, done_payloads, scope=scope)
            if group is not None and position is not None:
                for (topic, partition), offset in _last_offsets(items, position).items():
                    await record_offset(conn, group, topic, partition, offset, generation)
        return out

    try:
        if owns and retries > 0:
            return await retry(once, attempts=retries + 1, backoff=backoff, conn=conn)
        return await once()
    except Exception:
        if retry_failure is not None and owns and conn.info.transaction_status == TransactionStatus.IDLE:
            k, e = retry_failure
            async with conn.transaction():
                cur = await conn.execute(_core.CLAIM_SQL, (k, _core.interval(ttl), scope, None, True))
                if (await cur.fetchone())[0] == "claimed":
                    await conn.execute(_core.FAIL_SQL, (k, _jsonb(pol.payload(e)), True, scope, None))
        raise
