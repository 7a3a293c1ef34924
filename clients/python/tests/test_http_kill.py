"""kill -9 of the uvicorn server in the middle of a handler, then a restart, in both modes (the server of
test_http.py); each prints its counts: requests sent, handler runs, business rows, replays (and 409s). Then a
server frozen (SIGSTOP) in a two-transaction handler past its lease, while a second server takes the key over:
thawed, its completion is refused by the fencing token and its writes roll back (and, before the freeze, its
heartbeats keep the lease past its first end)."""
import threading


import httpx
import psycopg
import pytest

from http_server import counts, new_key, poll, record, sf
from test_http import assert_problem


def kill_in_handler(server, db, path, key):
    """Sends a request whose handler blocks (on a thread), waits until the handler runs, kills the server, and
    checks that the request got no answer."""
    outcome = {}

    def run():
        try:
            outcome["response"] = httpx.post(server.url + path, json={"item": "book"}, timeout=60,
                                             headers={"Idempotency-Key": sf(key), "X-Test-Block": "1"})
        except httpx.TransportError as e:
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    poll("the handler to start", lambda: counts(db, key)[0] == 1)
    server.kill(db)
    t.join()
    assert "error" in outcome, outcome  # the client saw the connection die, no answer


def report(capsys, mode, **n):
    with capsys.disabled():
        print(f"\n  kill -9 ({mode}, python): " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in n.items()))


def test_kill_in_one_transaction_mode_then_a_retry_runs_the_handler_once(server, db, capsys):
    key = new_key("kill1")
    kill_in_handler(server, db, "/orders", key)
    assert record(db, key) is None and counts(db, key) == (1, 0)  # the claim went with the transaction
    server.start()
    first = httpx.post(server.url + "/orders", json={"item": "book"}, headers={"Idempotency-Key": sf(key)}, timeout=30)
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = httpx.post(server.url + "/orders", json={"item": "book"}, headers={"Idempotency-Key": sf(key)}, timeout=30)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true" and again.content == first.content
    runs, rows = counts(db, key)
    assert (runs, rows) == (2, 1)  # the killed run and the retry's; one business row
    report(capsys, "one transaction", requests=3, handler_runs=runs, business_rows=rows, replays=1)


def pay(srv, key):
    return httpx.post(srv.url + "/payments", json={"item": "book"}, headers={"Idempotency-Key": sf(key)}, timeout=30)


def test_kill_in_two_transaction_mode_409_until_the_lease_ends_then_a_new_token(server, other, db, capsys):
    key = new_key("kill2")
    kill_in_handler(server, db, "/payments", key)
    lease = record(db, key)
    old_token, ends = lease["token"], lease["expires_at"]
    assert lease["status"] == "pending" and old_token is not None and counts(db, key) == (1, 0)

    def lease_on():
        return db.execute("SELECT clock_timestamp() < %s", (ends,)).fetchone()[0]

    # The retry reaches the other instance at once, while the killed one restarts: 409 while the lease is on.
    r = pay(other, key)
    requests, conflicts = 2, 0
    if lease_on():  # still on after the answer: it was on throughout
        assert_problem(r, 409, "idempotency-key-in-use")
        assert 1 <= int(r.headers["retry-after"]) <= 3  # from the lease's end
        conflicts += 1
    server.start()
    while r.status_code == 409:
        assert_problem(r, 409, "idempotency-key-in-use")
        poll("the lease to end", lambda: not lease_on(), timeout=10, every=0.05)
        r = pay(server, key)
        requests += 1
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers, r.text
    (new_token, started), = db.execute("SELECT token, started_at FROM http_runs WHERE idem_key = %s AND token <> %s",
                                       (key, old_token)).fetchall()
    assert new_token > old_token and started >= ends  # a new token, after the old lease ended
    with pytest.raises(psycopg.errors.ObjectInUse):  # 55006: the old token's completion is refused
        db.execute("SELECT idem_complete(%s, '{}'::jsonb, scope => 'http', token => %s)", (key, old_token))
    again = pay(server, key)
    requests += 1
    assert again.headers["idempotent-replayed"] == "true" and again.content == r.content
    runs, rows = counts(db, key)
    assert (runs, rows) == (2, 1)
    rec = record(db, key)
    assert rec["status"] == "completed" and rec["token"] == new_token and rec["attempts"] == 2
    report(capsys, "two transactions", requests=requests, handler_runs=runs, business_rows=rows, replays=1,
           conflicts_409=conflicts)


def test_frozen_server_past_its_lease_is_fenced_off(server, other, db):
    key = new_key("zombie")
    outcome = {}

    def first():
        outcome["response"] = httpx.post(server.url + "/payments", json={"item": "book"}, timeout=60,
                                         headers={"Idempotency-Key": sf(key), "X-Test-Gate": key})

    t = threading.Thread(target=first)
    t.start()
    poll("the handler to start", lambda: counts(db, key)[0] == 1)
    claimed_until = record(db, key)["expires_at"]
    poll("the first lease to have run out", lambda: db.execute(
        "SELECT clock_timestamp() > %s", (claimed_until,)).fetchone()[0], timeout=10, every=0.05)
    assert_problem(pay(other, key), 409, "idempotency-key-in-use")  # heartbeats extend it while the handler runs
    assert record(db, key)["expires_at"] > claimed_until
    server.freeze()  # no heartbeats: the lease runs out
    try:
        poll("the frozen server's lease to end", lambda: db.execute(
            "SELECT expires_at < clock_timestamp() FROM idem_status(%s, scope => 'http')", (key,)).fetchone()[0],
            timeout=10, every=0.05)
        taken = pay(other, key)
        assert taken.status_code == 201 and "idempotent-replayed" not in taken.headers
    finally:
        server.thaw()
    httpx.post(server.url + f"/_test/gates/{key}", timeout=30)
    t.join()
    assert_problem(outcome["response"], 409, "idempotency-lease-lost")
    assert "location" not in outcome["response"].headers  # nothing of the handler's response
    assert counts(db, key) == (2, 1)  # the frozen run's business row went with its refused completion
    again = pay(server, key)
    assert again.headers["idempotent-replayed"] == "true" and again.content == taken.content
