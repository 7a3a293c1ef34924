"""Idempotency-Key for HTTP APIs: ASGI middleware (Starlette, FastAPI, any ASGI app) whose stored response
commits in the same transaction as the handler's writes.

    from psycopg_pool import AsyncConnectionPool
    from idempotency_client.asgi import IdempotencyMiddleware, Route, current

    pool = AsyncConnectionPool("dbname=app", open=False)        # open it at startup
    app.add_middleware(IdempotencyMiddleware, pool=pool, routes=[Route("POST", "/orders", require=True)])

    @app.post("/orders")
    async def create(request: Request):
        idem = current(request)                                   # idem.conn: the request's transaction
        await idem.conn.execute("INSERT INTO orders ...")
        return JSONResponse({...}, status_code=201)

One-transaction mode (the default): BEGIN, idem_claim, the handler on that connection, idem_complete with the
response, COMMIT; a handler that raises or answers 5xx rolls it all back. Two-transaction mode (``mode=
TWO_TRANSACTIONS``, or per route): the claim commits a lease (``lease`` seconds, heartbeats every third of it) and
a fencing token (``current(request).token``); the handler's transaction is completed with that token, and a
lease taken over meanwhile rolls it back. What it answers, stores and keeps: docs/http.md.
"""
from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Tuple

from . import _core
from ._async import Lease
from ._http import (DEFAULT_ROUTES, DEFAULT_SCOPE, KEEP_HEADERS, MAX_BODY_BYTES, MAX_KEY_LENGTH, MODES,
                    ONE_TRANSACTION, TWO_TRANSACTIONS, KeyFieldError, Route, find_route, parse_key, problem,
                    replayed_response, request_fingerprint, retry_after_seconds, stored_response)
from .errors import Failed, InProgress, LeaseLost, Mismatch, OutcomeError

__all__ = ["IdempotencyMiddleware", "Idempotency", "Route", "current", "ONE_TRANSACTION", "TWO_TRANSACTIONS"]

Response = Tuple[int, List[Tuple[str, str]], bytes]


@dataclass
class Idempotency:
    """What the handler gets (``current(request)``): ``conn``, the psycopg.AsyncConnection whose transaction
    commits with the stored response (write there; never commit or roll back); ``key`` (None: the request came
    without one, and only the transaction applies); ``scope``; ``mode``; in two-transaction mode ``token`` (the
    fencing token: pass it, or the key, on to an outside service) and ``lease`` (``lease.check()`` raises
    LeaseLost once a heartbeat found the key taken over)."""

    conn: Any
    key: Optional[str]
    scope: str
    mode: str
    fingerprint: Optional[str] = None
    token: Optional[int] = None
    lease: Optional[Lease] = None


def current(request) -> Optional[Idempotency]:
    """The Idempotency of a request (a Starlette/FastAPI Request, or an ASGI scope), None outside the routes."""
    scope = getattr(request, "scope", request)
    return (scope.get("state") or {}).get("idempotency")


_GONE = b"<gone>"


class _RolledBack(Exception):
    """The handler answered 5xx (or nothing): its transaction is rolled back."""

    def __init__(self, status):
        super().__init__(f"the handler answered {status}")
        self.status = status


def _failure(exc: BaseException):
    """What idem_fail stores (two-transaction mode) for a failed request."""
    if isinstance(exc, _RolledBack):
        return {"error": "status", "status": exc.status}
    return {"error": type(exc).__name__, "message": str(exc)}


class _Capture:
    """An ASGI ``send`` that keeps the response until its transaction is settled."""

    def __init__(self):
        self.status: Optional[int] = None
        self.headers: List[Tuple[bytes, bytes]] = []
        self.chunks: List[bytes] = []
        self.done = False

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], list(message.get("headers") or [])
        elif message["type"] == "http.response.body":
            self.chunks.append(bytes(message.get("body") or b""))
            self.done = not message.get("more_body", False)

    def check(self):
        """Raises _RolledBack unless the handler answered in full with a status below 500."""
        if self.status is None or self.status >= 500 or not self.done:
            raise _RolledBack(self.status)

    def stored(self, keep) -> dict:
        return stored_response(self.status, [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self.headers],
                               b"".join(self.chunks), keep)


async def _send(send, status: int, headers: Iterable[Tuple[str, str]], body: bytes):
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_capture(send, cap: _Capture):
    await send({"type": "http.response.start", "status": cap.status, "headers": cap.headers})
    await send({"type": "http.response.body", "body": b"".join(cap.chunks)})


class IdempotencyMiddleware:
    """ASGI middleware. ``pool``: anything whose ``connection()`` is an async context manager of a
    psycopg.AsyncConnection (psycopg_pool.AsyncConnectionPool). ``routes``: the Routes it handles (default: POST
    and PATCH on every path, key optional). ``scope(asgi_scope)``: the tenant or user whose keys these are (None:
    ``default_scope``). ``fingerprint(asgi_scope, body)``: replaces the default (method, target, body); None
    turns the check off for that request. ``keep_headers``: the headers a replay gives back. ``wait``: a
    concurrent request waits for the holder's transaction and replays it instead of getting 409 at once (one
    pool connection each meanwhile). ``retry_after``: Retry-After (seconds) of a 409 whose lease end is
    unknown (one-transaction mode). ``problem_base``: a URI the problem ``type`` is made of. ``isolation``: of
    the handler's transaction (one-transaction mode)."""

    def __init__(self, app, *, pool, routes: Iterable[Route] = DEFAULT_ROUTES, mode: str = ONE_TRANSACTION,
                 lease: float = 30.0, heartbeat: Optional[float] = None,
                 scope: Optional[Callable[[dict], Optional[str]]] = None, default_scope: str = DEFAULT_SCOPE,
                 fingerprint: Optional[Callable[[dict, bytes], Optional[str]]] = None,
                 keep_headers: Iterable[str] = KEEP_HEADERS, max_body_bytes: int = MAX_BODY_BYTES,
                 max_key_length: int = MAX_KEY_LENGTH, wait: bool = False, retry_after: int = 1,
                 problem_base: Optional[str] = None, isolation: Optional[str] = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.app, self.pool, self.routes, self.mode = app, pool, tuple(routes), mode
        self.lease, self.heartbeat, self.scope_of, self.default_scope = lease, heartbeat, scope, default_scope
        self.fingerprint = fingerprint
        self.keep_headers = tuple(h.lower() for h in keep_headers)
        self.max_body_bytes, self.max_key_length = max_body_bytes, max_key_length
        self.wait, self.retry_after, self.problem_base = wait, retry_after, problem_base
        self.set_isolation = _core.set_isolation_sql(isolation)

    async def __call__(self, scope, receive, send):
        route = find_route(self.routes, scope["method"], scope["path"]) if scope["type"] == "http" else None
        if route is None:
            return await self.app(scope, receive, send)
        fields = [v for n, v in scope["headers"] if n.lower() == b"idempotency-key"]
        key = None
        try:
            if len(fields) > 1:
                raise KeyFieldError("more than one Idempotency-Key field")
            if fields:
                key = parse_key(fields[0].decode("latin-1"), self.max_key_length)
        except KeyFieldError as e:
            return await _send(send, *self._problem("idempotency-key-invalid", str(e)))
        if key is None and route.require:
            return await _send(send, *self._problem("idempotency-key-missing"))
        body = await self._read_body(scope, receive)
        if body is _GONE:
            return
        if body is None:
            return await _send(send, *self._problem(
                "request-too-large", f"The request body is larger than {self.max_body_bytes} bytes."))
        receive = _replay(body, receive)
        sc = (self.scope_of(scope) if self.scope_of else None) or self.default_scope
        if self.fingerprint is not None:
            fp = self.fingerprint(scope, body)
        else:
            raw = scope.get("raw_path") or scope["path"].encode()
            target = raw.decode("latin-1") + ("?" + scope["query_string"].decode("latin-1")
                                              if scope.get("query_string") else "")
            fp = request_fingerprint(scope["method"], target, body)
        state = scope.setdefault("state", {})
        mode = route.mode or self.mode
        async with self.pool.connection() as conn:
            ctx = Idempotency(conn, key, sc, mode, fp)
            state["idempotency"] = ctx
            if key is None:
                answer = await self._plain(ctx, scope, receive)
            elif mode == ONE_TRANSACTION:
                answer = await self._one_transaction(ctx, scope, receive)
            else:
                answer = await self._two_transactions(ctx, scope, receive)
        if isinstance(answer, _Capture):
            await _send_capture(send, answer)
        else:
            await _send(send, *answer)

    def _problem(self, code: str, detail: Optional[str] = None, retry_after: Optional[int] = None) -> Response:
        return problem(code, self.problem_base, detail, retry_after)

    def _refused(self, e: OutcomeError) -> Response:
        if isinstance(e, Mismatch):
            return self._problem("idempotency-key-reused")
        if isinstance(e, Failed):
            return self._problem("idempotency-key-failed")
        assert isinstance(e, InProgress), e
        now = _dt.datetime.now(_dt.timezone.utc)
        return self._problem("idempotency-key-in-use", retry_after=retry_after_seconds(e.expires_at, now,
                                                                                        self.retry_after))

    async def _read_body(self, scope, receive) -> Optional[bytes]:
        """The whole body; None when it is over max_body_bytes (Content-Length says so, or the bytes do); _GONE
        (compared by identity) when the client left before sending it."""
        for n, v in scope["headers"]:
            if n.lower() == b"content-length" and v.isdigit() and int(v) > self.max_body_bytes:
                return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE  # the client disconnected before sending its whole request
            chunk = message.get("body") or b""
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _plain(self, ctx, scope, receive):
        """A request without a key: the handler's transaction only."""
        cap = _Capture()
        try:
            async with ctx.conn.transaction():
                await self.app(scope, receive, cap)
                cap.check()
        except _RolledBack:
            pass
        return cap

    async def _one_transaction(self, ctx, scope, receive):
        cap = _Capture()
        try:
            async with ctx.conn.transaction():
                if self.set_isolation:
                    await ctx.conn.execute(self.set_isolation)
                cur = await ctx.conn.execute(_core.CLAIM_SQL, (ctx.key, None, ctx.scope, ctx.fingerprint, self.wait))
                outcome, _token, attempts, payload, expires_at = await cur.fetchone()
                refused = _core.outcome_error(outcome, ctx.key, ctx.scope, attempts, payload, expires_at)
                if refused is not None:
                    return self._refused(refused)
                if outcome == "completed":
                    return replayed_response(payload)
                await self.app(scope, receive, cap)
                cap.check()
                await ctx.conn.execute(_core.COMPLETE_SQL, (ctx.key, _core.jsonb(cap.stored(self.keep_headers)),
                                                            ctx.scope, None))
        except _RolledBack:
            pass  # the key and the handler's writes are gone: a retry runs the handler again
        return cap

    async def _two_transactions(self, ctx, scope, receive):
        lease = Lease(ctx.conn, ctx.key, ttl=self.lease, scope=ctx.scope, fingerprint=ctx.fingerprint,
                      wait=self.wait, heartbeat=self.heartbeat, error_payload=_failure)
        try:
            await lease.__aenter__()  # the claim commits; heartbeats start on a connection of their own
        except OutcomeError as e:
            return self._refused(e)
        if lease.replayed:
            await lease.__aexit__(None, None, None)
            return replayed_response(lease.result)
        ctx.token, ctx.lease = lease.token, lease
        cap = _Capture()
        try:
            async with ctx.conn.transaction():
                await self.app(scope, receive, cap)
                cap.check()
                await lease.complete(cap.stored(self.keep_headers))  # with the token, in this transaction
        except LeaseLost:
            await lease.__aexit__(None, None, None)
            return self._problem("idempotency-lease-lost", retry_after=self.retry_after)
        except BaseException:
            exc_info = sys.exc_info()
            try:
                await lease.__aexit__(*exc_info)  # idem_fail with the token: released for a retry
            except LeaseLost:
                pass
            if not isinstance(exc_info[1], _RolledBack):
                raise
            return cap
        await lease.__aexit__(None, None, None)
        return cap


def _replay(body: bytes, receive):
    """An ASGI ``receive`` that hands the app the body read already, then waits for the disconnect."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
