"""Typed errors of idempotency_client.

Two families, kept apart on purpose:

* outcomes of a claim that the caller must route (``InProgress``, ``Failed``, ``Mismatch``), raised by the
  helpers instead of running the handler, and ``LeaseLost`` / ``Fenced`` (SQLSTATE 55006: a fencing token
  or a consumer-group generation that is no longer current). Retrying the same transaction cannot fix
  these, so ``retry`` never retries them. The database error behind ``LeaseLost`` is its ``__cause__``
  (and ``.pgerror``); the last error a heartbeat of the lease met before (often why the lease expired: the
  heartbeat connection broke, the database was unreachable) is ``.heartbeat_error``.
* transient database errors (``40001`` serialization_failure, ``40P01`` deadlock_detected): psycopg's own
  exceptions, raised unchanged; ``retry`` / ``run_transaction`` re-run the whole transaction on them.

Every other database error is psycopg's, raised unchanged.
"""
from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "IdempotencyError", "OutcomeError", "InProgress", "Failed", "Mismatch", "LeaseLost", "Fenced",
    "TerminalError", "RETRY_SQLSTATES", "DEFAULT_ATTEMPTS", "DEFAULT_RETRIES", "is_transient",
]

# What a client answers by running the whole transaction again.
RETRY_SQLSTATES = ("40001", "40P01")

# Attempts in all of a transaction the helpers own, on 40001 / 40P01 (the Go and Node libraries' default
# too): ``retries=DEFAULT_RETRIES`` re-runs it at most 4 times after the first.
DEFAULT_ATTEMPTS = 5
DEFAULT_RETRIES = DEFAULT_ATTEMPTS - 1


class IdempotencyError(Exception):
    """Base class of the errors this package raises itself."""


class OutcomeError(IdempotencyError):
    """idem_claim answered something other than claimed / completed. Nothing was run or written."""

    outcome = ""

    def __init__(self, key: str, scope: str, attempts: Optional[int] = None, payload: Any = None,
                 expires_at: Any = None):
        self.key, self.scope, self.attempts, self.payload, self.expires_at = key, scope, attempts, payload, expires_at
        super().__init__(self._describe())

    def _describe(self) -> str:
        return f"key {self.key!r} (scope {self.scope!r}): {self.outcome}"


class InProgress(OutcomeError):
    """Another holder has the key now (a live lease, or, with wait=False, an open transaction).
    Try again later (``expires_at`` says when the lease ends, when known)."""

    outcome = "in_progress"

    def _describe(self):
        until = f" until {self.expires_at}" if self.expires_at is not None else ""
        return f"key {self.key!r} (scope {self.scope!r}) is in progress elsewhere{until}"


class Failed(OutcomeError):
    """The key failed terminally (idem_fail with retryable=false, or max_attempts). ``error`` is the
    stored error: route the message to a dead-letter queue."""

    outcome = "failed"

    @property
    def error(self):
        return self.payload

    def _describe(self):
        return f"key {self.key!r} (scope {self.scope!r}) failed terminally after {self.attempts} attempts: " \
               f"{self.payload!r}"


class Mismatch(OutcomeError):
    """The key exists with another request fingerprint: same key, different request."""

    outcome = "mismatch"

    def _describe(self):
        return f"key {self.key!r} (scope {self.scope!r}) was used with a different request fingerprint"


class LeaseLost(IdempotencyError):
    """SQLSTATE 55006 on idem_complete / idem_fail / idem_heartbeat: the token is no longer the key's current
    one (the lease expired and another worker took the key over), so this holder's result is refused and
    its transaction rolled back. Also raised, with sqlstate 'P0002', when a two-transaction holder's key no
    longer exists at all (its lease expired long ago and maintenance reclaimed it). ``pgerror`` and
    ``__cause__`` are psycopg's error.

    ``heartbeat_error``: raised by a ``lease``, the last error one of its heartbeats met before (a psycopg
    error such as a broken heartbeat connection or a statement timeout: the reason the lease could expire
    while its holder was alive), or None when every heartbeat went through (or none ran)."""

    def __init__(self, message: str, *, key: Optional[str] = None, scope: Optional[str] = None,
                 token: Optional[int] = None, pgerror: Optional[BaseException] = None,
                 heartbeat_error: Optional[BaseException] = None):
        super().__init__(message)
        self.key, self.scope, self.token, self.pgerror = key, scope, token, pgerror
        self.sqlstate = getattr(pgerror, "sqlstate", None)
        self.heartbeat_error = heartbeat_error


class Fenced(LeaseLost):
    """SQLSTATE 55006 on idem_record_offset: the stored generation of the partition is newer than ours,
    i.e. a rebalance gave the partition to another consumer and this one is a zombie. Its transaction
    (writes and offset) is rolled back; stop processing the partition."""

    def __init__(self, message: str, *, group: str, topic: str, partition: int, generation: Optional[int],
                 pgerror: Optional[BaseException] = None):
        super().__init__(message, pgerror=pgerror)
        self.group, self.topic, self.partition, self.generation = group, topic, partition, generation


class TerminalError(Exception):
    """Raise it (or a subclass) from a handler for a failure that retrying cannot fix: the key is marked
    failed (idem_fail retryable => false) and later deliveries get ``Failed``. ``payload`` (JSON) is
    stored as the error when given."""

    def __init__(self, message: str = "", payload: Any = None):
        super().__init__(message)
        self.payload = payload


def is_transient(exc: BaseException) -> bool:
    """True for the errors that re-running the whole transaction may cure: 40001, 40P01."""
    return getattr(exc, "sqlstate", None) in RETRY_SQLSTATES
