"""The HTTP server of tests/test_http.py, run by uvicorn in a process of its own (which the tests kill -9 and
restart): FastAPI, or plain Starlette with IDEM_HTTP_FRAMEWORK=starlette, behind IdempotencyMiddleware.

    IDEM_HTTP_DSN=... python -m uvicorn http_app:app --app-dir clients/python/tests --port 54397

Routes: POST /orders (key required, one transaction), POST /payments (key required, two transactions, lease
IDEM_HTTP_LEASE seconds), POST /notes (key optional), POST /_test/gates/{name} (opens a gate), GET
/_test/health. The handler records each run in http_runs on a connection of its own (so that a run rolled back
or killed still counts), writes its business row in http_orders through the request's transaction, and obeys
the headers X-Test-Fail (raise | 500), X-Test-Gate (waits until the gate is opened) and X-Test-Block (waits
forever: the test kills the server). The scope is the X-Tenant header when given."""
import asyncio
import contextlib
import os

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

from idempotency_client.asgi import TWO_TRANSACTIONS, IdempotencyMiddleware, Route, current

pool = AsyncConnectionPool(os.environ["IDEM_HTTP_DSN"], min_size=2, max_size=20, open=False)
runs_pool = AsyncConnectionPool(os.environ["IDEM_HTTP_DSN"], min_size=1, max_size=5, open=False,
                                kwargs={"autocommit": True})
gates = {}


def gate(name):
    return gates.setdefault(name, asyncio.Event())


async def order(request: Request):
    idem = current(request)
    body = await request.json()
    async with runs_pool.connection() as c:
        backend = (await (await idem.conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
        await c.execute("INSERT INTO http_runs (idem_key, scope, mode, token, server_pid, backend_pid)"
                        " VALUES (%s, %s, %s, %s, %s, %s)",
                        (idem.key, idem.scope, idem.mode, idem.token, os.getpid(), backend))
    cur = await idem.conn.execute("INSERT INTO http_orders (idem_key, scope, item) VALUES (%s, %s, %s) RETURNING id",
                                  (idem.key, idem.scope, body["item"]))
    (order_id,) = await cur.fetchone()
    if request.headers.get("x-test-gate"):
        await gate(request.headers["x-test-gate"]).wait()
    if request.headers.get("x-test-block"):
        await asyncio.Event().wait()
    fail = request.headers.get("x-test-fail")
    if fail == "raise":
        raise RuntimeError("the handler failed")
    if fail == "500":
        return PlainTextResponse("failed on purpose", status_code=500)
    return JSONResponse({"id": order_id, "item": body["item"]}, status_code=201,
                        headers={"Location": f"/orders/{order_id}", "X-Custom": "first-run-only"})


async def open_gate(request: Request):
    gate(request.path_params["name"]).set()
    return PlainTextResponse("open")


async def health(request: Request):
    return PlainTextResponse("ok")


@contextlib.asynccontextmanager
async def lifespan(app):
    await pool.open(wait=True)
    await runs_pool.open(wait=True)
    yield
    await pool.close()
    await runs_pool.close()


ROUTES = [("/orders", order, ["POST"]), ("/payments", order, ["POST"]), ("/notes", order, ["POST"]),
          ("/_test/gates/{name}", open_gate, ["POST"]), ("/_test/health", health, ["GET"])]
OPTIONS = dict(
    pool=pool,
    routes=[Route("POST", "/orders", require=True), Route("POST", "/payments", require=True, mode=TWO_TRANSACTIONS),
            Route("POST", "/notes")],
    lease=float(os.environ.get("IDEM_HTTP_LEASE", "3")),
    scope=lambda s: dict(s["headers"]).get(b"x-tenant", b"").decode() or None,
    max_body_bytes=1024,
)

if os.environ.get("IDEM_HTTP_FRAMEWORK") == "starlette":
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route as Path

    app = Starlette(routes=[Path(p, f, methods=m) for p, f, m in ROUTES], lifespan=lifespan,
                    middleware=[Middleware(IdempotencyMiddleware, **OPTIONS)])
else:
    from fastapi import FastAPI

    app = FastAPI(lifespan=lifespan)
    for p, f, m in ROUTES:
        app.add_api_route(p, f, methods=m)
    app.add_middleware(IdempotencyMiddleware, **OPTIONS)
