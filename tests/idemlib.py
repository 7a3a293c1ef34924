"""Thin client wrappers around the extension's SQL API, as the tests use it.

Every wrapper takes an open psycopg connection in autocommit mode: a call outside BEGIN ... COMMIT is a
transaction of its own (two-transaction mode), a call inside one is part of the caller's transaction.
"""
import datetime as dt
import threading
import time
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb


@dataclass
class Claim:
    outcome: str
    token: object
    attempts: object
    payload: object
    expires_at: object
    at: dt.datetime  # server clock just after the claim ran


def ms(n):
    return dt.timedelta(milliseconds=n)


def _jsonb(value):
    return None if value is None else Jsonb(value)


def claim(conn, key, scope, ttl=None, wait=True, fingerprint=None):
    rows = conn.execute(
        "SELECT c.outcome, c.token, c.attempts, c.payload, c.expires_at, clock_timestamp() "
        "FROM idem_claim(%s, ttl => %s::interval, scope => %s, fingerprint => %s::text, "
        "wait => %s) AS c",
        (key, ttl, scope, fingerprint, wait),
    ).fetchall()
    assert len(rows) == 1, f"idem_claim returned {len(rows)} rows, expected one"
    return Claim(*rows[0])


def complete(conn, key, scope, token=None, payload=None):
    conn.execute(
        "SELECT idem_complete(%s, payload => %s::jsonb, scope => %s, token => %s::bigint)",
        (key, _jsonb(payload), scope, token),
    )


def fail(conn, key, scope, token=None, error=None, retryable=True):
    return conn.execute(
        "SELECT idem_fail(%s, error => %s::jsonb, retryable => %s, scope => %s, token => %s::bigint)",
        (key, _jsonb(error), retryable, scope, token),
    ).fetchone()[0]


def heartbeat(conn, key, scope, token=None, ttl=None):
    return conn.execute(
        "SELECT idem_heartbeat(%s, ttl => %s::interval, scope => %s, token => %s::bigint)",
        (key, ttl, scope, token),
    ).fetchone()[0]


def once(conn, key, scope):
    return conn.execute("SELECT idem_once(%s, scope => %s)", (key, scope)).fetchone()[0]


STATUS_COLUMNS = ("status", "attempts", "token", "payload", "error", "created_at", "updated_at",
                  "expires_at")


def status(conn, key, scope):
    rows = conn.execute(
        "SELECT status, attempts, token, payload, error, created_at, updated_at, expires_at "
        "FROM idem_status(%s, scope => %s)",
        (key, scope),
    ).fetchall()
    assert len(rows) <= 1, f"idem_status returned {len(rows)} rows, expected zero or one"
    return dict(zip(STATUS_COLUMNS, rows[0])) if rows else None


def sqlstate_of(fn, *args, **kwargs):
    """Run fn; return None if it succeeded, else the SQLSTATE of the error it raised."""
    try:
        fn(*args, **kwargs)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def rollback_quietly(conn):
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass


def run_threads(n, target, timeout):
    """Run target(i) for i in range(n) on n threads; return their results; raise the first error."""
    results = [None] * n
    errors = []

    def wrap(i):
        try:
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append((i, e))

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True, name=f"session-{i}")
               for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        i, e = errors[0]
        raise AssertionError(f"session {i} failed: {type(e).__name__}: {e}") from e
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"{len(alive)} sessions still running after {timeout}s: {alive[:5]}"
    return results


# What a client must never find in an error: traces of the extension's Rust internals (a pgrx
# backtrace appended to DETAIL, a panic message, a source location). Matched case-insensitively.
RUST_INTERNALS = ("pgrx", "panic", "backtrace", ".rs:", "rust_begin_unwind", "core::", "std::")
DIAG_FIELDS = ("message_primary", "message_detail", "message_hint", "context")


def rust_internals(e):
    """Problems with a psycopg error as a client sees it: every field of e.diag that contains Rust
    internals, and SQLSTATE XX000 (an internal error). An empty list when the error is clean."""
    found = []
    diag = getattr(e, "diag", None)
    for name in DIAG_FIELDS:
        value = getattr(diag, name, None) if diag is not None else None
        if not value:
            continue
        low = value.lower()
        hits = [m for m in RUST_INTERNALS if m in low]
        if hits:
            at = low.index(hits[0])
            excerpt = value[max(0, at - 40):at + 60].replace("\n", "\\n")
            found.append(f"{name} contains {', '.join(repr(h) for h in hits)}: ...{excerpt}...")
    if getattr(e, "sqlstate", None) == "XX000":
        found.append(f"SQLSTATE XX000 (internal error): {getattr(diag, 'message_primary', None)!r}")
    return found
