# GENERATED FILE, DO NOT EDIT: written by clients/python/tools/gen_sync.py (unasync) from _async.py, the source
# of the synchronous and the asyncio helpers. Edit _async.py (or _sync_backend.py, for what only the synchronous
# form has), then run clients/python/tools/gen_sync.py; clients/python/test fails while this file is stale.
"""The helpers, written once: _async.py (psycopg.AsyncConnection, the asyncio form, exported by
idempotency_client.aio) is the source, and _sync.py (psycopg.Connection, exported by the package's top level) is
generated from it by tools/gen_sync.py with unasync (``async`` / ``await`` dropped, ``AsyncConnection`` ->
``Connection``, _async_backend -> _sync_backend). What differs besides lives in _async_backend (asyncio.sleep,
heartbeats in a task) and _sync_backend (time.sleep, heartbeats in a thread). The docstrings are the same in
both and use the synchronous spelling (``with``, ``handler(conn, ...)``); in the asyncio form read ``async
with``, ``await`` and ``async def`` handlers and callbacks. See the package README for the whole story.
"""
from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus

from . import _core
from ._sync_backend import HEARTBEAT_KEEPS, Heartbeats, sleep
from ._core import TTL, BatchItem, FailurePolicy, jsonb as _jsonb
from .errors import DEFAULT_RETRIES, Fenced, LeaseLost, is_transient

logger = logging.getLogger("idempotency_client")

__all__ = ["IdempotentCall", "idempotent_call", "idempotent", "Lease", "lease", "retry", "run_transaction",
           "BatchItem", "process_batch", "claim_batch", "complete_batch", "record_offset", "next_offset",
           "offsets"]


# ---------------------------------------------------------------------------------------------------
# One-transaction mode


class IdempotentCall:
    """Context manager: claim ``key`` in the caller's connection, run the body as the work, complete.

    ::

        with idempotent_call(conn, key, scope="orders") as call:       # asyncio: async with
            if not call.replayed:
                call.result = place_order(conn, order)      # the business writes, same transaction
        result, replayed = call.result, call.replayed

    Transactions. When ``conn`` is idle (no transaction open), the helper opens one (``conn.transaction()``:
    BEGIN, optionally SET TRANSACTION ISOLATION LEVEL ``isolation``) and commits it on success. When a
    transaction is already open (yours), everything happens inside it under a savepoint, and you commit.

    Outcomes. ``claimed``: the body runs; on a normal exit the key is completed with ``call.result`` (any
    JSON value; None stores no payload). ``completed``: ``call.replayed`` is True and ``call.result`` is the
    stored payload; the body runs too (test ``call.replayed``), nothing is written. ``in_progress``,
    ``failed``, ``mismatch``: ``InProgress`` / ``Failed`` / ``Mismatch`` are raised by ``with`` itself.

    Failure. When the body raises, the work is rolled back to a savepoint taken after the claim, the failure
    is recorded with ``idem_fail`` (retryable, or terminal for ``TerminalError`` and the ``terminal`` types),
    ``call.failure`` says what idem_fail answered (``released`` / ``failed``), and the exception propagates.
    With ``commit_failure=True`` (default) the failure is kept: committed when the helper owns the
    transaction, left in yours otherwise (commit it, or lose it by rolling back). With ``commit_failure=False``
    the claim and the failure are rolled back as well. Transaction-level database errors from the body
    (40001, 40P01, a broken connection) and BaseExceptions are not recorded: the whole transaction rolls
    back (``retry`` re-runs it).
    """

    def __init__(self, conn: psycopg.Connection, key: str, *, scope: str = "default",
                 fingerprint: Optional[str] = None, ttl: TTL = None, wait: bool = True,
                 commit_failure: bool = True, isolation: Optional[str] = None,
                 failure_policy: Optional[FailurePolicy] = None, terminal=(), retryable=None, error_payload=None):
        self.conn, self.key, self.scope = conn, key, scope
        self.fingerprint, self.ttl, self.wait = fingerprint, ttl, wait
        self.commit_failure = commit_failure
        self.isolation_sql = _core.set_isolation_sql(isolation)
        self.policy = failure_policy or _core.policy(terminal, retryable, error_payload)
        self.outcome: Optional[str] = None
        self.token = self.attempts = self.expires_at = None
        self.replayed = False
        self.result: Any = None
        self.failure: Optional[str] = None
        self.owns_transaction = False
        self._tx = self._sp = None

    def __enter__(self) -> "IdempotentCall":
        conn = self.conn
        self.owns_transaction = conn.info.transaction_status == TransactionStatus.IDLE
        if self.isolation_sql and not self.owns_transaction:
            raise ValueError("isolation= needs an idle connection: the helper must begin the transaction")
        self._tx = conn.transaction()
        self._tx.__enter__()
        try:
            if self.isolation_sql and self.owns_transaction:
                conn.execute(self.isolation_sql)
            cur = conn.execute(_core.CLAIM_SQL, (self.key, _core.interval(self.ttl), self.scope,
                                                       self.fingerprint, self.wait))
            self.outcome, self.token, self.attempts, payload, self.expires_at = cur.fetchone()
            err = _core.outcome_error(self.outcome, self.key, self.scope, self.attempts, payload, self.expires_at)
            if err is not None:
                raise err
            if self.outcome == "completed":
                self.replayed, self.result = True, payload
            else:
                self._sp = conn.transaction()  # SAVEPOINT: the work is rolled back to here on failure
                self._sp.__enter__()
        except BaseException:
            self._tx.__exit__(*sys.exc_info())
            raise
        return self

    def complete(self, result: Any = None) -> None:
        """Sets the result stored at the end of the block (same as assigning ``call.result``)."""
        self.result = result

    def __exit__(self, exc_type, exc, tb) -> bool:
        conn = self.conn
        if self._sp is None:  # replayed: nothing was written
            return bool(self._tx.__exit__(exc_type, exc, tb))
        if exc is None:
            try:
                self._sp.__exit__(None, None, None)  # RELEASE SAVEPOINT
                try:
                    conn.execute(_core.COMPLETE_SQL, (self.key, _jsonb(self.result), self.scope, None))
                except psycopg.Error as e:
                    if _core.is_lease_lost(e, with_token=False):
                        raise _core.lease_lost(e, "idem_complete", self.key, self.scope, None) from e
                    raise
            except BaseException:
                self._tx.__exit__(*sys.exc_info())
                raise
            self._tx.__exit__(None, None, None)  # COMMIT (or RELEASE inside the caller's transaction)
            return False
        # The body raised: roll the work back to the savepoint.
        self._sp.__exit__(exc_type, exc, tb)
        if not _core.records_failure(exc, conn):
            self._tx.__exit__(exc_type, exc, tb)
            return False
        try:
            cur = conn.execute(_core.FAIL_SQL, (self.key, _jsonb(self.policy.payload(exc)),
                                                      self.policy.is_retryable(exc), self.scope, None))
            (self.failure,) = cur.fetchone()
        except BaseException:
            self._tx.__exit__(*sys.exc_info())
            raise
        if self.commit_failure:
            self._tx.__exit__(None, None, None)  # keep the failure: COMMIT (ours) / RELEASE (yours)
        else:
            self._tx.__exit__(exc_type, exc, tb)
        return False


def idempotent_call(conn, key, **options) -> IdempotentCall:
    """``with idempotent_call(conn, key, scope=..., ...) as call:`` (asyncio: ``async with``) -- see
    IdempotentCall."""
    return IdempotentCall(conn, key, **options)


def idempotent(scope: str = "default", *, key: Optional[Callable[..., str]] = None,
               fingerprint: Optional[Callable[..., Optional[str]]] = None, retries: int = DEFAULT_RETRIES,
               backoff: float = 0.05, **options):
    """Decorator for ``handler(conn, *args, **kwargs) -> JSON result`` (asyncio: an ``async def`` handler),
    run at most once per key.

    The decorated function is called ``f(conn, key, *args, **kwargs)`` (or ``f(conn, *args, **kwargs)``
    when ``key=`` derives the key from the arguments) and returns ``(result, replayed)``: the handler's
    result, or on a duplicate the result stored the first time (the handler does not run). ``fingerprint``
    derives the request fingerprint from the arguments. ``retries``: how many times the whole transaction
    is run again on 40001 / 40P01 (default DEFAULT_RETRIES = 4: 5 attempts in all; 0: none), with the
    handler, when the helper owns the transaction; inside yours the error is raised at once (roll back and
    re-run your transaction). Other options are those of IdempotentCall (ttl, wait, commit_failure,
    isolation, terminal, retryable, error_payload).
    """

    def decorate(handler):
        @functools.wraps(handler)
        def wrapper(conn, *args, **kwargs):
            if key is None:
                if not args:
                    raise TypeError(f"{handler.__name__}: called without a key (f(conn, key, *args))")
                k, args = args[0], args[1:]
            else:
                k = key(*args, **kwargs)
            fp = fingerprint(*args, **kwargs) if fingerprint is not None else None

            def attempt():
                with IdempotentCall(conn, k, scope=scope, fingerprint=fp, **options) as call:
                    if not call.replayed:
                        call.result = handler(conn, *args, **kwargs)
                return call.result, call.replayed

            if retries:
                return retry(attempt, attempts=retries + 1, backoff=backoff, conn=conn)
            return attempt()

        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------------
# Retries of whole transactions


def retry(fn: Callable[[], Any], *, attempts: int = 5, backoff: float = 0.05, conn=None):
    """Calls ``fn()`` (which runs one whole transaction; asyncio: awaits it) until it does not raise 40001 /
    40P01, at most ``attempts`` times, sleeping with exponential backoff between; the last error is raised
    unchanged. With ``conn``, an error that leaves a transaction open on it (the caller's: it cannot be re-run
    from here) is raised at once. Nothing else is retried: LeaseLost, Fenced and outcome errors propagate."""
    for attempt in range(attempts):
        try:
            return fn()
        except psycopg.Error as e:
            if not is_transient(e) or attempt == attempts - 1:
                raise
            if conn is not None and conn.info.transaction_status != TransactionStatus.IDLE:
                raise
            sleep(_core.backoff_delay(attempt, backoff))
    raise AssertionError("unreachable")


def run_transaction(conn: psycopg.Connection, fn: Callable[[psycopg.Connection], Any], *,
                          attempts: int = 5, isolation: Optional[str] = None, backoff: float = 0.05):
    """Runs ``fn(conn)`` in a transaction of its own (BEGIN [ISOLATION LEVEL] ... COMMIT), re-running it on
    40001 / 40P01 (see retry). ``conn`` must be idle."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("run_transaction needs an idle connection (no transaction open)")
    set_iso = _core.set_isolation_sql(isolation)

    def once():
        with conn.transaction():
            if set_iso:
                conn.execute(set_iso)
            return fn(conn)

    return retry(once, attempts=attempts, backoff=backoff, conn=conn)


# ---------------------------------------------------------------------------------------------------
# Two-transaction mode: a lease, heartbeats, a fencing token


class Lease:
    """Context manager for work outside the database: claim and COMMIT a lease with a fencing token, keep it
    alive with heartbeats from a background thread (asyncio: a task) while the body runs, then complete (or
    fail) with the token in a transaction of its own.

    ::

        with lease(conn, key, ttl=30) as l:                              # asyncio: async with
            if not l.replayed:
                l.result = provider.charge(order, idempotency_key=key)   # outside the database
        # completed with l.result (or, given l.complete(result, write=fn), fn(conn) in the same transaction)

    ``conn`` must be idle (the claim must commit before the work). Heartbeats run every ``heartbeat``
    seconds (default ttl/3) on ``heartbeat_conn``, or on a second connection opened with ``conn``'s
    parameters and closed at the end. A heartbeat that meets 55006 (the lease was taken over) stops and
    marks the lease lost: ``l.lost`` is True and ``l.check()`` raises LeaseLost, so a long body can stop
    early; completion would raise LeaseLost anyway. Other heartbeat errors are kept in
    ``l.heartbeat_error`` (the last one; logged as warnings on the ``idempotency_client`` logger) and the
    next beat tries again; a LeaseLost raised later by this lease (heartbeat, ``check``, ``complete``,
    ``fail``) carries that error as its ``heartbeat_error``: when the heartbeats failed, it says why the
    lease could expire under a live holder.

    The claim, the completion and the failure are transactions of the helper's own: 40001 / 40P01 in them
    re-run that transaction (``retries``, default 4; ``write`` runs again too).

    On a body exception the failure is recorded (idem_fail with the token, retryable unless terminal; see
    IdempotentCall) and committed, and the exception propagates. Outcomes other than claimed / completed
    raise InProgress / Failed / Mismatch from ``with``.
    """

    def __init__(self, conn: psycopg.Connection, key: str, *, ttl: TTL = None, scope: str = "default",
                 fingerprint: Optional[str] = None, wait: bool = True, heartbeat: Optional[float] = None,
                 heartbeat_conn: Optional[psycopg.Connection] = None, retries: int = DEFAULT_RETRIES,
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
        self._heartbeats: Optional[Heartbeats] = None
        self._settled = False

    # ---- claim

    def __enter__(self) -> "Lease":
        conn = self.conn
        if conn.info.transaction_status != TransactionStatus.IDLE:
            raise ValueError("lease needs an idle connection: its claim must commit before the work")

        def claim():
            cur = conn.execute(_core.CLAIM_SQL, (self.key, _core.interval(self.ttl), self.scope,
                                                       self.fingerprint, self.wait))
            return cur.fetchone()

        row = self._transaction(claim)
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
                    self._hb_conn = psycopg.Connection.connect(
                        make_conninfo(info.dsn, password=info.password or None), autocommit=True)
                    self._own_hb_conn = True
            except BaseException:
                self._release_after_error(*sys.exc_info())
                raise
            self._heartbeats = Heartbeats(self._beat, self.interval, name=f"idem-heartbeat-{self.key}")
        return self

    def _transaction(self, fn):
        """fn() in a transaction of the helper's own on conn, re-run on 40001 / 40P01."""
        def once():
            with self.conn.transaction():
                return fn()
        return retry(once, attempts=self.retries + 1, backoff=self.backoff, conn=self.conn)

    def _lease_lost(self, e: BaseException, what: str) -> LeaseLost:
        return _core.lease_lost(e, what, self.key, self.scope, self.token, heartbeat_error=self.heartbeat_error)

    # ---- heartbeats

    def _beat(self) -> bool:
        """One heartbeat, every ``interval`` seconds (Heartbeats); False ends them: the lease was taken over."""
        try:
            with self._hb_conn.transaction():
                cur = self._hb_conn.execute(
                    _core.HEARTBEAT_SQL, (self.key, _core.interval(self.ttl), self.scope, self.token))
                (self.expires_at,) = cur.fetchone()
            self.beats += 1
        except psycopg.Error as e:
            if _core.is_lease_lost(e, with_token=True):
                self._lost = self._lease_lost(e, "idem_heartbeat")
                self._lost.__cause__ = e
                return False
            self.heartbeat_error = e
            logger.warning("heartbeat of key %r (scope %r, token %s) failed, next in %.2f s: %s",
                           self.key, self.scope, self.token, self.interval, e)
        except HEARTBEAT_KEEPS as e:  # sync: any Exception (a thread has no caller); asyncio: none (backends)
            self.heartbeat_error = e
            logger.warning("heartbeat of key %r (scope %r, token %s) failed: %r", self.key, self.scope,
                           self.token, e)
        return True

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def check(self) -> None:
        """Raises LeaseLost when a heartbeat found the lease taken over (its ``heartbeat_error``: the last
        heartbeat error before)."""
        if self._lost is not None:
            raise self._lost

    def _stop_heartbeats(self):
        if self._heartbeats is not None:
            self._heartbeats.stop()
            self._heartbeats = None
        if self._own_hb_conn and self._hb_conn is not None:
            self._hb_conn.close()
            self._hb_conn, self._own_hb_conn = None, False

    # ---- settle

    def complete(self, result: Any = None, *,
                       write: Optional[Callable[[psycopg.Connection], Any]] = None):
        """Stops the heartbeats and, in one transaction, runs ``write(conn)`` (your result rows, an offset)
        and idem_complete with the token; commits (re-run on 40001 / 40P01, ``write`` included). LeaseLost
        (and the rollback of ``write``'s rows) when the lease was taken over."""
        if self._settled:
            raise RuntimeError(f"lease of {self.key!r} is already settled")
        self._stop_heartbeats()
        self.result = result
        self._settled = True

        def once():
            if write is not None:
                write(self.conn)
            self.conn.execute(_core.COMPLETE_SQL, (self.key, _jsonb(result), self.scope, self.token))

        try:
            self._transaction(once)
        except psycopg.Error as e:
            if _core.is_lease_lost(e, with_token=True):
                raise self._lease_lost(e, "idem_complete") from e
            raise

    def fail(self, error: Any, *, retryable: bool = True) -> str:
        """Stops the heartbeats, records the failure with the token and commits; returns idem_fail's answer
        (``released`` or ``failed``)."""
        if self._settled:
            raise RuntimeError(f"lease of {self.key!r} is already settled")
        self._stop_heartbeats()
        self._settled = True

        def once():
            cur = self.conn.execute(_core.FAIL_SQL, (self.key, _jsonb(error), retryable, self.scope,
                                                           self.token))
            return cur.fetchone()

        try:
            (self.failure,) = self._transaction(once)
        except psycopg.Error as e:
            if _core.is_lease_lost(e, with_token=True):
                raise self._lease_lost(e, "idem_fail") from e
            raise
        return self.failure

    def _release_after_error(self, exc_type, exc, tb):
        self._stop_heartbeats()
        if self._settled:
            return
        if _core.records_failure(exc, self.conn) and self.conn.info.transaction_status == TransactionStatus.IDLE:
            self.fail(self.policy.payload(exc), retryable=self.policy.is_retryable(exc))

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self._stop_heartbeats()
            if not self._settled:
                self.complete(self.result)
            return False
        try:
            self._release_after_error(exc_type, exc, tb)
        finally:
            self._stop_heartbeats()
        return False


def lease(conn, key, **options) -> Lease:
    """``with lease(conn, key, ttl=30) as l:`` (asyncio: ``async with``) -- see Lease."""
    return Lease(conn, key, **options)


# ---------------------------------------------------------------------------------------------------
# Batches and offsets


def claim_batch(conn, keys: Sequence[str], *, ttl: TTL = None, scope: str = "default") -> List[tuple]:
    """idem_claim_batch: one (key, outcome, token, attempts, payload, expires_at) per key, in order."""
    cur = conn.execute(_core.CLAIM_BATCH_SQL, (list(keys), _core.interval(ttl), scope))
    return cur.fetchall()


def complete_batch(conn, keys: Sequence[str], payloads: Optional[Sequence[Any]] = None, *,
                         scope: str = "default") -> int:
    """idem_complete_batch (in this transaction's claims); returns the number of keys completed."""
    if not keys:
        return 0
    docs = None if payloads is None else [_jsonb(p) for p in payloads]
    cur = conn.execute(_core.COMPLETE_BATCH_SQL, (list(keys), docs, scope))
    row = cur.fetchone()
    return row[0]


def record_offset(conn, group: str, topic: str, partition: int, offset: int,
                        generation: Optional[int] = None) -> bool:
    """idem_record_offset: True when the stored position advanced. Fenced (a LeaseLost) on 55006: a newer
    generation owns the partition."""
    try:
        cur = conn.execute(_core.RECORD_OFFSET_SQL, (group, topic, partition, offset, generation))
        row = cur.fetchone()
        return row[0]
    except psycopg.Error as e:
        if e.sqlstate == "55006":
            raise Fenced(f"idem_record_offset({group!r}, {topic!r}, {partition}, {offset}, generation {generation}):"
                         f" fenced by a newer generation: {e}", group=group, topic=topic, partition=partition,
                         generation=generation, pgerror=e) from e
        raise


def next_offset(conn, group: str, topic: str, partition: int) -> Optional[int]:
    """idem_next_offset: last processed + 1, None when nothing is stored."""
    cur = conn.execute(_core.NEXT_OFFSET_SQL, (group, topic, partition))
    row = cur.fetchone()
    return row[0]


def offsets(conn, group: str, topic: Optional[str] = None) -> Dict[Tuple[str, int], int]:
    """idem_offsets as {(topic, partition): next_offset}."""
    cur = conn.execute(_core.OFFSETS_SQL, (group, topic))
    return {(t, p): n for t, p, n, _g, _u in cur.fetchall()}


def process_batch(conn: psycopg.Connection, items: Sequence[Any],
                        handler: Callable[[psycopg.Connection, Any], Any],
                        *, key: Callable[[Any], str], scope: str = "default", ttl: TTL = None,
                        group: Optional[str] = None, position: Optional[Callable[[Any], Tuple[str, int, int]]] = None,
                        generation: Optional[int] = None, isolation: Optional[str] = None,
                        retries: int = DEFAULT_RETRIES, backoff: float = 0.05,
                        failure_policy: Optional[FailurePolicy] = None, terminal=(), retryable=None,
                        error_payload=None) -> List[BatchItem]:
    """One poll in one transaction: idem_claim_batch over the items' keys, ``handler(conn, item)`` for each
    claimed item (under a savepoint), idem_complete_batch with the results, and, with ``group`` and
    ``position(item) -> (topic, partition, offset)``, idem_record_offset of each partition's last offset
    with ``generation``. Commits when it opened the transaction (conn idle), else leaves it to you.

    A terminal handler failure (TerminalError, ``terminal`` types) is rolled back to the item's savepoint
    and recorded (idem_fail retryable => false); the item comes back ``failed`` and the batch goes on. A
    retryable failure rolls the whole batch back (no offset moves), then -- when the helper owns the
    transaction -- records one attempt for that key in a short transaction of its own (claim + idem_fail,
    so that a message that always fails reaches max_attempts and becomes terminal), and re-raises: redeliver
    the poll. Fenced (55006 on the offset) and database errors roll everything back and propagate.

    Serialization failures and deadlocks (40001 / 40P01, from the claims, a handler or the commit): when the
    helper owns the transaction, the whole batch runs again, handlers included, at most ``retries`` times
    (default 4: 5 attempts in all; 0: none); inside yours they propagate at once.
    """
    items = list(items)
    if not items:
        return []
    pol = failure_policy or _core.policy(terminal, retryable, error_payload)
    owns = conn.info.transaction_status == TransactionStatus.IDLE
    set_iso = _core.set_isolation_sql(isolation)
    keys = [key(it) for it in items]
    retry_failure: Optional[Tuple[str, BaseException]] = None

    def once() -> List[BatchItem]:
        nonlocal retry_failure
        retry_failure = None
        with conn.transaction():
            if set_iso and owns:
                conn.execute(set_iso)
            rows = claim_batch(conn, keys, ttl=ttl, scope=scope)
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
                        with conn.transaction():  # SAVEPOINT per item
                            result = handler(conn, it)
                    except Exception as e:
                        if not _core.records_failure(e, conn) or pol.is_retryable(e):
                            if _core.records_failure(e, conn):
                                retry_failure = (k, e)
                            raise
                        error = pol.payload(e)
                        conn.execute(_core.FAIL_SQL, (k, _jsonb(error), False, scope, None))
                        out.append(BatchItem(it, k, "failed", error=error))
                        continue
                    done_keys.append(k)
                    done_payloads.append(result)
                    out.append(BatchItem(it, k, "processed", result=result))
                else:  # in_progress for a key not repeated in this batch: a live lease elsewhere; mismatch
                    raise _core.outcome_error(outcome, k, scope, attempts, payload, expires_at)
            complete_batch(conn, done_keys, done_payloads, scope=scope)
            if group is not None and position is not None:
                for (topic, partition), offset in _core.last_offsets(items, position).items():
                    record_offset(conn, group, topic, partition, offset, generation)
        return out

    try:
        if owns and retries > 0:
            return retry(once, attempts=retries + 1, backoff=backoff, conn=conn)
        return once()
    except Exception:
        if retry_failure is not None and owns and conn.info.transaction_status == TransactionStatus.IDLE:
            k, e = retry_failure
            _record_attempt(conn, k, scope, ttl, pol.payload(e))
        raise


def _record_attempt(conn, key, scope, ttl, error):
    """Counts one failed attempt of a key whose batch rolled back: claim it and release it with the error."""
    with conn.transaction():
        cur = conn.execute(_core.CLAIM_SQL, (key, _core.interval(ttl), scope, None, True))
        row = cur.fetchone()
        if row[0] == "claimed":
            conn.execute(_core.FAIL_SQL, (key, _jsonb(error), True, scope, None))
