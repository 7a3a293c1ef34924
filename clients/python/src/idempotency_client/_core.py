"""What the sync and asyncio forms share: SQL text, argument conversion, outcome mapping, failure policy,
BatchItem."""
from __future__ import annotations

import datetime as _dt
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Tuple, Type, Union

from psycopg.types.json import Jsonb

from .errors import Failed, InProgress, LeaseLost, Mismatch, TerminalError, RETRY_SQLSTATES

TTL = Union[None, int, float, _dt.timedelta]

CLAIM_SQL = ("SELECT outcome, token, attempts, payload, expires_at FROM idem_claim("
             "%s, ttl => %s, scope => %s, fingerprint => %s, wait => %s)")
COMPLETE_SQL = "SELECT idem_complete(%s, %s, scope => %s, token => %s)"
FAIL_SQL = "SELECT idem_fail(%s, %s, retryable => %s, scope => %s, token => %s)"
HEARTBEAT_SQL = "SELECT idem_heartbeat(%s, ttl => %s, scope => %s, token => %s)"
CLAIM_BATCH_SQL = ("SELECT key, outcome, token, attempts, payload, expires_at "
                   "FROM idem_claim_batch(%s::text[], ttl => %s, scope => %s)")
COMPLETE_BATCH_SQL = "SELECT idem_complete_batch(%s::text[], %s::jsonb[], scope => %s)"
RECORD_OFFSET_SQL = "SELECT idem_record_offset(%s, %s, %s, %s, generation => %s)"
NEXT_OFFSET_SQL = "SELECT idem_next_offset(%s, %s, %s)"
OFFSETS_SQL = "SELECT topic, partition, next_offset, generation, updated_at FROM idem_offsets(%s, %s)"

ISOLATION_LEVELS = {"read committed": "READ COMMITTED", "repeatable read": "REPEATABLE READ",
                    "serializable": "SERIALIZABLE"}


def jsonb(value):
    """A JSON argument: None stays SQL NULL."""
    return None if value is None else Jsonb(value)


def interval(ttl: TTL) -> Optional[_dt.timedelta]:
    """None (the server's idempotency.lease_ttl), a timedelta, or seconds."""
    if ttl is None or isinstance(ttl, _dt.timedelta):
        return ttl
    return _dt.timedelta(seconds=float(ttl))


def seconds(ttl: TTL, default: float) -> float:
    if ttl is None:
        return default
    return ttl.total_seconds() if isinstance(ttl, _dt.timedelta) else float(ttl)


def set_isolation_sql(isolation: Optional[str]) -> Optional[str]:
    if isolation is None:
        return None
    level = ISOLATION_LEVELS.get(str(isolation).lower().replace("_", " "))
    if level is None:
        raise ValueError(f"isolation must be one of {sorted(ISOLATION_LEVELS)}, not {isolation!r}")
    return f"SET TRANSACTION ISOLATION LEVEL {level}"


def outcome_error(outcome: str, key: str, scope: str, attempts, payload, expires_at):
    """The exception for an outcome the helpers do not run the handler for (None for claimed/completed)."""
    if outcome == "in_progress":
        return InProgress(key, scope, attempts, payload, expires_at)
    if outcome == "failed":
        return Failed(key, scope, attempts, payload, expires_at)
    if outcome == "mismatch":
        return Mismatch(key, scope, attempts, payload, expires_at)
    if outcome in ("claimed", "completed"):
        return None
    raise RuntimeError(f"idem_claim answered an unknown outcome {outcome!r} for key {key!r}")


def lease_lost(e: BaseException, what: str, key: str, scope: str, token,
               heartbeat_error: Optional[BaseException] = None) -> LeaseLost:
    """LeaseLost for psycopg's error ``e`` (the caller raises it ``from e``); ``heartbeat_error``: the last
    error a heartbeat of the lease met, attached and named in the message."""
    hb = ""
    if heartbeat_error is not None:
        hb = (f" (last heartbeat error: {type(heartbeat_error).__name__}"
              f" [{getattr(heartbeat_error, 'sqlstate', None)}] {str(heartbeat_error).strip()})")
    return LeaseLost(f"{what} of key {key!r} (scope {scope!r}, token {token}): lease lost "
                     f"[{getattr(e, 'sqlstate', None)}] {str(e).strip()}{hb}", key=key, scope=scope, token=token,
                     pgerror=e, heartbeat_error=heartbeat_error)


def is_lease_lost(e: BaseException, with_token: bool) -> bool:
    """55006; with a token (two-transaction mode) also P0002: the key was reclaimed after its lease expired."""
    code = getattr(e, "sqlstate", None)
    return code == "55006" or (with_token and code == "P0002")


@dataclass
class FailurePolicy:
    """Which handler exceptions are terminal, and what error document idem_fail stores.

    ``terminal``: exception types that are terminal (besides TerminalError, always terminal).
    ``retryable``: a function exc -> bool that decides alone when given.
    ``error_payload``: a function exc -> JSON value; default {"error": type name, "message": str(exc)}
    (plus "detail": TerminalError.payload when set).
    """

    terminal: Tuple[Type[BaseException], ...] = ()
    retryable: Optional[Callable[[BaseException], bool]] = None
    error_payload: Optional[Callable[[BaseException], Any]] = None

    def is_retryable(self, exc: BaseException) -> bool:
        if self.retryable is not None:
            return bool(self.retryable(exc))
        return not isinstance(exc, (TerminalError, *self.terminal))

    def payload(self, exc: BaseException) -> Any:
        if self.error_payload is not None:
            return self.error_payload(exc)
        doc = {"error": type(exc).__name__, "message": str(exc)}
        if isinstance(exc, TerminalError) and exc.payload is not None:
            doc["detail"] = exc.payload
        return doc


def policy(terminal: Iterable[Type[BaseException]] = (), retryable=None, error_payload=None) -> FailurePolicy:
    if isinstance(terminal, type):
        terminal = (terminal,)
    return FailurePolicy(tuple(terminal), retryable, error_payload)


def records_failure(exc: BaseException, conn) -> bool:
    """Whether a handler exception is recorded with idem_fail, or only rolls the transaction back.

    Not recorded: BaseExceptions that are not Exceptions (KeyboardInterrupt, SystemExit, cancellation),
    lost leases, and database errors the transaction itself suffered (class 40: serialization failure,
    deadlock; class 08 and a broken connection) -- those roll everything back, to be retried as a whole.
    """
    if not isinstance(exc, Exception) or isinstance(exc, LeaseLost):
        return False
    code = getattr(exc, "sqlstate", None) or ""
    if code[:2] in ("40", "08") or code in RETRY_SQLSTATES:
        return False
    if getattr(conn, "broken", False) or getattr(conn, "closed", False):
        return False
    return True


def backoff_delay(attempt: int, base: float, cap: float = 2.0) -> float:
    """Exponential backoff with jitter: base * 2**attempt * [0.5, 1.5), at most cap."""
    return min(cap, base * (2 ** attempt)) * (0.5 + random.random())


def heartbeat_interval(ttl: TTL, heartbeat: Optional[float]) -> float:
    if heartbeat is not None:
        return float(heartbeat)
    return max(0.05, seconds(ttl, 300.0) / 3.0)


@dataclass
class BatchItem:
    """What process_batch did with one item. outcome: ``processed`` (the handler ran, result stored),
    ``replayed`` (completed before: ``result`` is the stored payload), ``failed`` (terminal: stored before,
    or the handler raised a terminal error now; ``error`` is the stored error: dead-letter it), or
    ``duplicate`` (the same key earlier in this batch)."""

    item: Any
    key: str
    outcome: str
    result: Any = None
    error: Any = None

    @property
    def replayed(self) -> bool:
        return self.outcome == "replayed"


def last_offsets(items, position) -> "OrderedDict[Tuple[str, int], int]":
    """{(topic, partition): the largest offset} over the items, ``position(item) -> (topic, partition, offset)``."""
    last: "OrderedDict[Tuple[str, int], int]" = OrderedDict()
    for it in items:
        topic, partition, offset = position(it)
        if (topic, partition) not in last or offset > last[(topic, partition)]:
            last[(topic, partition)] = offset
    return last
