"""The ASGI middleware (idempotency_client.asgi) in real uvicorn servers (FastAPI; plain Starlette in the last
test), driven by httpx over TCP, against the test cluster: concurrency, replays, 400 / 409 / 413 / 422, rollback
of failed handlers, scopes. The kill -9 runs are in test_http_kill.py."""
import asyncio
import json

import httpx
import pytest

from http_server import counts, new_key, poll, record, sf


def post(server, path, key=None, body=None, headers=(), **kw):
    h = dict(headers)
    if key is not None:
        h["Idempotency-Key"] = sf(key)
    return httpx.post(server.url + path, json=body if body is not None else {"item": "book"}, headers=h,
                      timeout=30, **kw)


def assert_problem(r, status, code):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert doc["status"] == status and doc["code"] == code and doc["type"] == "about:blank" and doc["title"]
    return doc


def test_fifty_concurrent_requests_with_one_key(server, db):
    key = new_key("fifty")

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=60)) as c:
            send = [asyncio.ensure_future(c.post("/orders", json={"item": "book"}, headers={
                "Idempotency-Key": sf(key), "X-Test-Gate": key})) for _ in range(50)]
            early, pending = [], set(send)
            while len(early) < 49:  # the holder waits at its gate: the 49 others answer first
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                early += [t.result() for t in done]
            assert len(early) == 49, [r.status_code for r in early]
            await c.post(f"/_test/gates/{key}")
            rest = [await t for t in pending]
            retries = await asyncio.gather(*[c.post("/orders", json={"item": "book"},
                                                    headers={"Idempotency-Key": sf(key)}) for _ in range(5)])
            return early, rest, retries

    early, rest, retries = asyncio.run(main())
    for r in early:
        assert_problem(r, 409, "idempotency-key-in-use")
        assert int(r.headers["retry-after"]) >= 1
    [first] = rest
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    for r in retries:
        assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true" and r.content == first.content
    assert counts(db, key) == (1, 1)  # one handler run, one business row


def test_sequential_retries_replay_status_headers_and_body(server, db):
    key = new_key("seq")
    first = post(server, "/orders", key)
    assert first.status_code == 201 and first.headers["x-custom"] == "first-run-only"
    for _ in range(3):
        r = post(server, "/orders", key)
        assert r.status_code == 201 and r.content == first.content
        assert r.headers["idempotent-replayed"] == "true"
        assert r.headers["location"] == first.headers["location"]
        assert r.headers["content-type"] == first.headers["content-type"]
        assert "x-custom" not in r.headers  # not among the kept headers
    assert counts(db, key) == (1, 1)
    assert record(db, key)["status"] == "completed"


def test_reused_key_with_another_request_is_422(server, db):
    key = new_key("reuse")
    assert post(server, "/orders", key, {"item": "book"}).status_code == 201
    assert_problem(post(server, "/orders", key, {"item": "lamp"}), 422, "idempotency-key-reused")
    assert_problem(post(server, "/notes", key, {"item": "book"}), 422, "idempotency-key-reused")  # another path
    assert counts(db, key) == (1, 1)


def test_key_missing_invalid_or_repeated_is_400_and_the_handler_does_not_run(server, db):
    before = db.execute("SELECT count(*) FROM http_runs").fetchone()[0]
    assert_problem(post(server, "/orders"), 400, "idempotency-key-missing")
    for field in ("abc", '"a" "b"', '""', '"' + "k" * 256 + '"'):
        doc = assert_problem(post(server, "/orders", headers={"Idempotency-Key": field}), 400,
                             "idempotency-key-invalid")
        assert doc["detail"]
    two = httpx.post(server.url + "/orders", json={"item": "x"}, timeout=30,
                     headers=[("Idempotency-Key", '"a"'), ("Idempotency-Key", '"b"')])
    assert_problem(two, 400, "idempotency-key-invalid")
    assert db.execute("SELECT count(*) FROM http_runs").fetchone()[0] == before
    # on a route where the key is optional, a request without one runs each time (no idempotency)
    a, b = post(server, "/notes"), post(server, "/notes")
    assert a.status_code == b.status_code == 201 and a.json()["id"] != b.json()["id"]


@pytest.mark.parametrize("how", ["raise", "500"])
def test_failed_handler_leaves_no_row_and_no_key_then_a_retry_succeeds(server, db, how):
    key = new_key(f"fail-{how}")
    r = post(server, "/orders", key, headers={"X-Test-Fail": how})
    assert r.status_code == 500
    assert counts(db, key) == (1, 0) and record(db, key) is None  # rolled back together
    r = post(server, "/orders", key)
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers
    assert counts(db, key) == (2, 1)


def test_body_over_the_limit_is_413_before_the_handler(server, db):
    key = new_key("big")
    assert_problem(post(server, "/orders", key, {"item": "x" * 2000}), 413, "request-too-large")

    def chunks():  # no Content-Length: counted while read
        for _ in range(10):
            yield b" " * 200

    r = httpx.post(server.url + "/orders", content=chunks(), timeout=30,
                   headers={"Idempotency-Key": sf(key), "Content-Type": "application/json"})
    assert_problem(r, 413, "request-too-large")
    assert counts(db, key) == (0, 0) and record(db, key) is None


def test_scopes_keep_tenants_apart(server, db):
    key = new_key("tenant")
    a = post(server, "/orders", key, headers={"X-Tenant": "acme"})
    b = post(server, "/orders", key, headers={"X-Tenant": "globex"})
    assert a.status_code == b.status_code == 201 and a.json()["id"] != b.json()["id"]
    again = post(server, "/orders", key, headers={"X-Tenant": "acme"})
    assert again.headers["idempotent-replayed"] == "true" and again.content == a.content
    assert counts(db, key, "acme") == (1, 1) and counts(db, key, "globex") == (1, 1) and counts(db, key) == (0, 0)


def test_two_transactions_failure_releases_the_key_and_409_tells_the_lease(server, db):
    key = new_key("two-fail")
    r = post(server, "/payments", key, headers={"X-Test-Fail": "raise"})
    assert r.status_code == 500
    rec = record(db, key)
    assert counts(db, key) == (1, 0) and rec["status"] == "pending" and rec["token"] is None  # released
    assert rec["error"] == {"error": "RuntimeError", "message": "the handler failed"}

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            held = asyncio.ensure_future(c.post("/payments", json={"item": "book"},
                                                headers={"Idempotency-Key": sf(key), "X-Test-Gate": key}))
            await asyncio.to_thread(poll, "the second run to start", lambda: counts(db, key)[0] == 2)
            busy = await c.post("/payments", json={"item": "book"}, headers={"Idempotency-Key": sf(key)})
            await c.post(f"/_test/gates/{key}")
            return busy, await held

    busy, held = asyncio.run(main())
    assert_problem(busy, 409, "idempotency-key-in-use")
    assert 1 <= int(busy.headers["retry-after"]) <= 3  # the lease's end, not a guess
    assert held.status_code == 201 and counts(db, key) == (2, 1)
    assert record(db, key)["attempts"] == 2


def test_plain_starlette_app(other, db):
    key = new_key("starlette")
    first = post(other, "/orders", key)
    again = post(other, "/orders", key)
    assert first.status_code == again.status_code == 201 and again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert_problem(post(other, "/orders", key, {"item": "other"}), 422, "idempotency-key-reused")
    assert_problem(post(other, "/orders"), 400, "idempotency-key-missing")
    assert_problem(post(other, "/orders", key, {"item": "x" * 2000}), 413, "request-too-large")
    assert counts(db, key) == (1, 1)
    assert json.loads(first.content)["item"] == "book"
