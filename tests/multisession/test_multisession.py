"""Multi-session tests: real concurrent sessions (one thread, one connection each) on a real cluster.

Every test works in a scope of its own, so the tests share one database without seeing each other.
"""
import collections
import random
import threading
import time
import uuid

import psycopg
import pytest

from idemlib import claim, complete, fail, heartbeat, ms, once, rollback_quietly, run_threads, sqlstate_of, status
import pgtools
from pgtools import RETRY_SQLSTATES

ISOLATION_LEVELS = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
LOCK_OBJSUBID = 18756  # the extension's advisory-lock namespace, as documented


def new_scope(tag):
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def level_id(level):
    return level.lower().replace(" ", "_")


def records_columns(conn):
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = 'idempotency' AND table_name = 'records'").fetchall()
    return {r[0] for r in rows}


def records_count(conn):
    return conn.execute("SELECT count(*) FROM idempotency.records").fetchone()[0]


# --------------------------------------------------------------------------------------------------
# 1 + 2. Many sessions racing on the same keys, one transaction per message.
# --------------------------------------------------------------------------------------------------

RACE_SESSIONS = 16
RACE_KEYS = 100
RACE_ROLLBACK_P = 0.15      # share of transactions the consumer abandons (crash before commit)
RACE_PAIR_P = 0.3           # share of messages that touch two keys, in random order (deadlocks)
RACE_MAX_TRIES = 300        # tries of one message before the test gives up on it


def _race(cluster, isolation, mode):
    """16 sessions each deliver every key once (a message is one key or a pair of keys).

    mode "claim": BEGIN; idem_claim; if claimed: business row + idem_complete; COMMIT (or ROLLBACK).
    mode "once":  BEGIN; idem_once; if true: business row; COMMIT (or ROLLBACK).
    A rolled-back message, or one that hit 40001 / 40P01, is redelivered until a try commits.
    """
    scope = new_scope(f"{mode}-{level_id(isolation)}")
    keys = [f"msg-{i:03d}" for i in range(RACE_KEYS)]
    start = threading.Barrier(RACE_SESSIONS, timeout=30)
    guard = threading.Lock()
    winners = collections.Counter()   # key -> committed transactions that got to do the work
    unexpected = []                   # outcomes a one-transaction waiting claim must never give

    def session(w):
        rnd = random.Random(f"{scope}/{w}")
        order = keys[:]
        rnd.shuffle(order)
        messages, i = [], 0
        while i < len(order):
            n = 2 if (i + 1 < len(order) and rnd.random() < RACE_PAIR_P) else 1
            messages.append(order[i:i + n])
            i += n
        tally = collections.Counter()
        with cluster.connect() as conn:
            start.wait()
            for msg in messages:
                for _try in range(RACE_MAX_TRIES):
                    tally["deliveries"] += 1
                    seen = []
                    try:
                        conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
                        for key in msg:
                            if mode == "claim":
                                c = claim(conn, key, scope)
                                seen.append((key, c.outcome))
                                if c.outcome == "claimed":
                                    conn.execute(
                                        "INSERT INTO race_effects (scope, key, worker, token) "
                                        "VALUES (%s, %s, %s, %s)", (scope, key, w, c.token))
                                    complete(conn, key, scope,
                                             payload={"worker": w, "token": c.token})
                                elif c.outcome != "completed":
                                    with guard:
                                        unexpected.append((key, c))
                            else:
                                first = once(conn, key, scope)
                                seen.append((key, "first" if first else "duplicate"))
                                if first:
                                    conn.execute(
                                        "INSERT INTO race_effects (scope, key, worker) "
                                        "VALUES (%s, %s, %s)", (scope, key, w))
                        if rnd.random() < RACE_ROLLBACK_P:
                            conn.execute("ROLLBACK")
                            tally["rolled_back"] += 1
                            continue
                        conn.execute("COMMIT")
                    except psycopg.Error as e:
                        rollback_quietly(conn)
                        if e.sqlstate in RETRY_SQLSTATES:
                            tally[f"retry_{e.sqlstate}"] += 1
                            time.sleep(rnd.uniform(0, 0.004))
                            continue
                        raise
                    for key, outcome in seen:
                        tally[outcome] += 1
                        if outcome in ("claimed", "first"):
                            with guard:
                                winners[key] += 1
                    break
                else:
                    raise AssertionError(f"message {msg} did not commit in {RACE_MAX_TRIES} tries")
        return tally

    t0 = time.monotonic()
    tallies = run_threads(RACE_SESSIONS, session, timeout=90)
    elapsed = time.monotonic() - t0
    total = sum(tallies, collections.Counter())

    with cluster.connect() as conn:
        rows = conn.execute(
            "SELECT key, count(*), min(worker), min(token) FROM race_effects WHERE scope = %s "
            "GROUP BY key ORDER BY key", (scope,)).fetchall()
        effects = {r[0]: r for r in rows}
        statuses = {k: status(conn, k, scope) for k in keys}
        cols = records_columns(conn)
        pending_rows = None
        if {"scope", "status"} <= cols:
            pending_rows = conn.execute(
                "SELECT count(*) FROM idempotency.records WHERE scope = %s AND status <> 'completed'",
                (scope,)).fetchone()[0]

    return dict(scope=scope, keys=keys, total=total, elapsed=elapsed, effects=effects,
                statuses=statuses, winners=winners, unexpected=unexpected,
                pending_rows=pending_rows)


def _assert_exactly_once(r):
    keys, effects, statuses = r["keys"], r["effects"], r["statuses"]
    duplicated = {k: row[1] for k, row in effects.items() if row[1] != 1}
    assert duplicated == {}, f"side effect applied more than once: {duplicated}"
    missing = [k for k in keys if k not in effects]
    assert missing == [], f"side effect never applied: {missing}"
    assert len(effects) == len(keys)
    not_completed = {k: (s and s["status"]) for k, s in statuses.items()
                     if s is None or s["status"] != "completed"}
    assert not_completed == {}, f"keys not completed (pending or missing): {not_completed}"
    if r["pending_rows"] is not None:
        assert r["pending_rows"] == 0, "idempotency.records holds non-completed rows of the scope"
    wrong_winners = {k: n for k, n in r["winners"].items() if n != 1}
    assert wrong_winners == {}, f"committed winners per key must be exactly 1: {wrong_winners}"
    assert sorted(r["winners"]) == sorted(keys)


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS, ids=level_id)
def test_claim_race_one_transaction(cluster, report, isolation):
    r = _race(cluster, isolation, "claim")
    t = r["total"]
    _assert_exactly_once(r)
    assert r["unexpected"] == [], f"waiting claims gave other outcomes: {r['unexpected'][:5]}"
    # Every session committed every key once: one of them did the work, the rest saw `completed`.
    assert t["claimed"] == RACE_KEYS
    assert t["completed"] == RACE_SESSIONS * RACE_KEYS - RACE_KEYS
    # The stored payload is the one written by the transaction that wrote the business row.
    for key, (_k, _n, worker, token) in r["effects"].items():
        assert r["statuses"][key]["payload"] == {"worker": worker, "token": token}, key
    report(f"{RACE_SESSIONS} sessions x {RACE_KEYS} keys, {t['deliveries']} transactions, "
           f"{t['claimed']} claimed, {t['completed']} duplicates suppressed, "
           f"{t['rolled_back']} rolled back, retries 40001={t['retry_40001']} "
           f"40P01={t['retry_40P01']}, {r['elapsed']:.1f}s")


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS, ids=level_id)
def test_once_race(cluster, report, isolation):
    r = _race(cluster, isolation, "once")
    t = r["total"]
    _assert_exactly_once(r)
    assert t["first"] == RACE_KEYS
    assert t["duplicate"] == RACE_SESSIONS * RACE_KEYS - RACE_KEYS
    # idem_once writes `completed` directly, with no token.
    with_token = [k for k, s in r["statuses"].items() if s["token"] is not None]
    assert with_token == [], f"idem_once records carry a token: {with_token[:5]}"
    report(f"{RACE_SESSIONS} sessions x {RACE_KEYS} keys, {t['deliveries']} transactions, "
           f"{t['first']} true, {t['duplicate']} duplicates suppressed, "
           f"{t['rolled_back']} rolled back, retries 40001={t['retry_40001']} "
           f"40P01={t['retry_40P01']}, {r['elapsed']:.1f}s")


# --------------------------------------------------------------------------------------------------
# 3. Lease expiry and takeover, two-transaction mode.
# --------------------------------------------------------------------------------------------------

def test_lease_expiry_and_takeover(cluster, report):
    scope = new_scope("lease")
    key = "job-1"
    with cluster.connect() as old, cluster.connect() as new, cluster.connect() as third:
        c1 = claim(old, key, scope, ttl=ms(200))          # claim + commit (autocommit)
        assert c1.outcome == "claimed"
        assert c1.token is not None and c1.attempts == 1

        time.sleep(0.4)                                    # the 200 ms lease runs out
        c2 = claim(new, key, scope, ttl=ms(60000))
        assert c2.outcome == "claimed", c2
        assert c2.token > c1.token
        assert c2.attempts == 2
        assert c2.at >= c1.expires_at

        # The old holder comes back: every write with its token is fenced off.
        rejected = {
            "idem_complete": sqlstate_of(complete, old, key, scope, token=c1.token,
                                         payload={"by": "old"}),
            "idem_heartbeat": sqlstate_of(heartbeat, old, key, scope, token=c1.token,
                                          ttl=ms(60000)),
            "idem_fail": sqlstate_of(fail, old, key, scope, token=c1.token,
                                     error={"by": "old"}, retryable=True),
            "idem_fail(retryable=>false)": sqlstate_of(fail, old, key, scope, token=c1.token,
                                                       error={"by": "old"}, retryable=False),
        }
        assert rejected == {k: "55006" for k in rejected}

        # None of the rejected calls wrote anything: the new holder still holds the key.
        st = status(new, key, scope)
        assert st["status"] == "pending"
        assert st["token"] == c2.token
        assert st["attempts"] == 2
        assert st["payload"] is None

        # While the new lease is live, anybody else is turned away.
        c3 = claim(third, key, scope, ttl=ms(60000))
        assert c3.outcome == "in_progress", c3

        new_expiry = heartbeat(new, key, scope, token=c2.token, ttl=ms(120000))
        assert new_expiry > c2.expires_at
        complete(new, key, scope, token=c2.token, payload={"by": "new"})
        st = status(new, key, scope)
        assert st["status"] == "completed"
        assert st["payload"] == {"by": "new"}

        replay = claim(old, key, scope)
        assert replay.outcome == "completed"
        assert replay.payload == {"by": "new"}
    report(f"tokens {c1.token} -> {c2.token}, old holder fenced on {len(rejected)} calls (55006), "
           f"new holder completed")


# --------------------------------------------------------------------------------------------------
# 4. Stale tokens and tokens of another key.
# --------------------------------------------------------------------------------------------------

def test_stale_and_foreign_tokens_rejected(cluster, report):
    scope = new_scope("tokens")
    a, b = "key-a", "key-b"
    with cluster.connect() as s1, cluster.connect() as s2:
        a1 = claim(s1, a, scope, ttl=ms(60000))
        assert a1.outcome == "claimed"
        assert fail(s1, a, scope, token=a1.token, error={"e": "transient"}, retryable=True) \
            == "released"
        st = status(s1, a, scope)
        assert st["status"] == "pending" and st["token"] is None
        assert st["error"] == {"e": "transient"}
        now = s1.execute("SELECT clock_timestamp()").fetchone()[0]
        assert st["expires_at"] is None or st["expires_at"] <= now

        # Released: the old token no longer holds anything.
        assert sqlstate_of(complete, s1, a, scope, token=a1.token) == "55006"
        assert sqlstate_of(heartbeat, s1, a, scope, token=a1.token) == "55006"

        a2 = claim(s2, a, scope, ttl=ms(60000))
        assert a2.outcome == "claimed" and a2.token > a1.token and a2.attempts == 2

        # Stale token after the retry's claim.
        stale = [sqlstate_of(complete, s1, a, scope, token=a1.token),
                 sqlstate_of(heartbeat, s1, a, scope, token=a1.token),
                 sqlstate_of(fail, s1, a, scope, token=a1.token)]
        assert stale == ["55006"] * 3
        # A token nobody was given.
        assert sqlstate_of(complete, s1, a, scope, token=a2.token + 1000000) == "55006"

        # Key b: three claims (two short leases taken over), so its token differs from a's tokens
        # whether tokens are counted per key or globally.
        for i in range(3):
            bc = claim(s1, b, scope, ttl=ms(60000) if i == 2 else ms(100))
            assert bc.outcome == "claimed", (i, bc)
            if i < 2:
                time.sleep(0.25)
        assert bc.token not in (a1.token, a2.token)

        foreign = [sqlstate_of(complete, s1, a, scope, token=bc.token),
                   sqlstate_of(heartbeat, s1, a, scope, token=bc.token),
                   sqlstate_of(fail, s1, a, scope, token=bc.token),
                   sqlstate_of(complete, s2, b, scope, token=a2.token)]
        assert foreign == ["55006"] * 4

        # No token at all, while the claim was made by another transaction.
        assert sqlstate_of(complete, s2, a, scope, token=None) == "55006"
        assert sqlstate_of(heartbeat, s2, a, scope, token=None) == "55006"

        # Rejections wrote nothing.
        st = status(s2, a, scope)
        assert (st["status"], st["token"], st["attempts"]) == ("pending", a2.token, 2)
        st = status(s1, b, scope)
        assert (st["status"], st["token"]) == ("pending", bc.token)

        complete(s2, a, scope, token=a2.token, payload={"ok": "a"})
        complete(s1, b, scope, token=bc.token, payload={"ok": "b"})
        assert status(s2, a, scope)["status"] == "completed"
        assert status(s2, b, scope)["status"] == "completed"
    report(f"a tokens {a1.token}->{a2.token}, b token {bc.token}: "
           f"{len(stale) + 1} stale and {len(foreign) + 2} foreign/no-token writes rejected (55006)")


# --------------------------------------------------------------------------------------------------
# 5. Rollback leaves nothing.
# --------------------------------------------------------------------------------------------------

def test_rollback_leaves_nothing(cluster, report):
    scope = new_scope("rollback")
    with cluster.connect() as conn, cluster.connect() as other:
        before = records_count(conn)

        conn.execute("BEGIN")
        c = claim(conn, "k-claim", scope)
        assert c.outcome == "claimed"
        conn.execute("INSERT INTO side_effects (scope, key) VALUES (%s, 'k-claim')", (scope,))
        complete(conn, "k-claim", scope, payload={"x": 1})
        assert status(conn, "k-claim", scope)["status"] == "completed"   # visible inside
        conn.execute("ROLLBACK")

        conn.execute("BEGIN")
        assert once(conn, "k-once", scope) is True
        conn.execute("ROLLBACK")

        conn.execute("BEGIN")
        assert claim(conn, "k-fail", scope, ttl=ms(60000)).outcome == "claimed"
        assert fail(conn, "k-fail", scope, error={"e": "boom"}, retryable=False) == "failed"
        conn.execute("ROLLBACK")

        conn.execute("BEGIN")
        assert claim(conn, "k-error", scope).outcome == "claimed"
        assert sqlstate_of(conn.execute, "SELECT 1 / 0") == "22012"
        conn.execute("ROLLBACK")

        conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        assert claim(conn, "k-serializable", scope).outcome == "claimed"
        conn.execute("ROLLBACK")

        keys = ["k-claim", "k-once", "k-fail", "k-error", "k-serializable"]
        leftovers = {k: status(other, k, scope) for k in keys}
        assert leftovers == {k: None for k in keys}
        assert records_count(other) == before
        assert other.execute("SELECT count(*) FROM side_effects WHERE scope = %s",
                             (scope,)).fetchone()[0] == 0

        # The keys are new again: the next claim is a first attempt, idem_once says true.
        again = claim(other, "k-claim", scope)
        assert (again.outcome, again.attempts) == ("claimed", 1)
        assert once(other, "k-once", scope) is True
        assert records_count(other) == before + 2
    report(f"{len(keys)} rolled-back transactions left 0 records (count stayed {before})")


# --------------------------------------------------------------------------------------------------
# 6. wait => false / wait => true against an open one-transaction claim.
# --------------------------------------------------------------------------------------------------

def _waiting_lock(observer, pid, timeout=10.0):
    """The ungranted lock the backend `pid` waits for, polled until it shows up and the backend
    reports its lock wait (a backend queues its lock request a moment before it reports the wait
    event, so one poll can see the first with the event it had before, ClientRead, still shown)."""
    deadline = time.monotonic() + timeout
    row = None
    while time.monotonic() < deadline:
        row = observer.execute(
            "SELECT l.locktype, l.objsubid, l.classid, l.objid, l.mode, a.wait_event_type "
            "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.pid = %s AND NOT l.granted", (pid,)).fetchone()
        if row and row[5] == "Lock":
            return row
        time.sleep(0.02)
    return row


def _start_waiting_claim(waiter, key, scope):
    result, done = {}, threading.Event()

    def run():
        try:
            t = time.monotonic()
            result["claim"] = claim(waiter, key, scope, wait=True)
            result["elapsed"] = time.monotonic() - t
            result["finished"] = time.monotonic()
        except BaseException as e:  # noqa: BLE001 - checked by the caller
            result["error"] = e
        finally:
            done.set()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, result, done


def test_wait_false_and_wait_true(cluster, report):
    scope = new_scope("wait")
    key, key2 = "order-7", "order-8"
    with cluster.connect() as holder, cluster.connect(statement_timeout_ms=20000) as waiter, \
            cluster.connect() as observer:
        holder_pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
        waiter_pid = waiter.execute("SELECT pg_backend_pid()").fetchone()[0]
        # Both sessions have made a call before (long-lived consumer sessions), so whatever a
        # backend sets up on its first call is done; test_other_keys_do_not_wait covers first calls.
        for conn in (holder, waiter):
            assert claim(conn, "warm-up", new_scope("warm-up")).outcome == "claimed"

        holder.execute("BEGIN")
        assert claim(holder, key, scope).outcome == "claimed"
        holder.execute("INSERT INTO side_effects (scope, key, note) VALUES (%s, %s, 'holder')",
                       (scope, key))

        # wait => false: in_progress at once. lock_timeout turns a wrongful wait into an error.
        waiter.execute("SET lock_timeout = '3s'")
        t = time.monotonic()
        try:
            nowait = claim(waiter, key, scope, wait=False)
        except psycopg.errors.LockNotAvailable:
            pytest.fail("idem_claim(wait => false) waited for a lock (lock_timeout 3s expired)")
        nowait_elapsed = time.monotonic() - t
        waiter.execute("RESET lock_timeout")
        assert nowait.outcome == "in_progress", nowait
        assert nowait_elapsed < 1.5
        assert nowait.token is None

        # wait => true: blocks on the key's lock until the holder's transaction ends.
        th, result, done = _start_waiting_claim(waiter, key, scope)
        lock = _waiting_lock(observer, waiter_pid)
        assert lock is not None, "the waiting claim never showed up waiting in pg_locks"
        locktype, objsubid, classid, objid, _mode, wait_event_type = lock
        if pgtools.sql_edition():  # no key locks: the claim waits in the unique index for the holder's transaction
            assert (locktype, wait_event_type) == ("transactionid", "Lock")
            held = observer.execute(
                "SELECT count(*) FROM pg_locks w JOIN pg_locks h ON h.locktype = 'transactionid' "
                "AND h.transactionid = w.transactionid AND h.granted AND h.pid = %s "
                "WHERE w.pid = %s AND NOT w.granted AND w.locktype = 'transactionid'",
                (holder_pid, waiter_pid)).fetchone()[0]
        else:
            assert (locktype, objsubid, wait_event_type) == ("advisory", LOCK_OBJSUBID, "Lock")
            held = observer.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND granted AND locktype = 'advisory' "
                "AND objsubid = %s AND classid = %s AND objid = %s",
                (holder_pid, LOCK_OBJSUBID, classid, objid)).fetchone()[0]
        assert held >= 1, "the holder does not hold the lock the waiter waits for"
        time.sleep(0.5)
        assert not done.is_set(), f"the claim returned while the holder was open: {result}"

        complete(holder, key, scope, payload={"by": "holder"})
        commit_at = time.monotonic()
        holder.execute("COMMIT")
        th.join(15)
        assert done.is_set(), "the waiting claim did not return after the holder committed"
        assert "error" not in result, result.get("error")
        c = result["claim"]
        assert c.outcome == "completed", c
        assert c.payload == {"by": "holder"}
        assert result["finished"] >= commit_at
        assert result["elapsed"] >= 0.5
        waited = result["elapsed"]

        after = claim(waiter, key, scope, wait=False)
        assert after.outcome == "completed"

        # Same, but the holder rolls back: the waiter gets the key.
        holder.execute("BEGIN")
        assert claim(holder, key2, scope).outcome == "claimed"
        th, result, done = _start_waiting_claim(waiter, key2, scope)
        assert _waiting_lock(observer, waiter_pid) is not None
        holder.execute("ROLLBACK")
        th.join(15)
        assert done.is_set() and "error" not in result, result
        c2 = result["claim"]
        assert (c2.outcome, c2.attempts) == ("claimed", 1), c2
        complete(waiter, key2, scope, token=c2.token)
        assert status(observer, key2, scope)["status"] == "completed"
        assert observer.execute("SELECT count(*) FROM side_effects WHERE scope = %s",
                                (scope,)).fetchone()[0] == 1
    report(f"wait=>false answered in_progress in {nowait_elapsed * 1000:.0f} ms; "
           f"wait=>true blocked {waited:.2f}s on advisory lock (objsubid {LOCK_OBJSUBID}), "
           f"then saw completed; after a rollback it claimed")


def test_other_keys_do_not_wait(cluster, report):
    """The lock is per key: an open transaction holding one key delays no call on another key,
    including the very first call of a new session."""
    scope = new_scope("other-keys")
    with cluster.connect() as holder:
        holder.execute("BEGIN")
        assert claim(holder, "held", scope).outcome == "claimed"
        waited = {}
        calls = {
            "idem_claim(wait=>true)": lambda c: claim(c, "k1", scope).outcome,
            "idem_claim(wait=>false)": lambda c: claim(c, "k2", scope, wait=False).outcome,
            "idem_once": lambda c: once(c, "k3", scope),
            "idem_status(held)": lambda c: (status(c, "held", scope) or {}).get("status"),
        }
        answers = {}
        for name, call in calls.items():
            with cluster.connect() as fresh:           # a new session: its first call
                fresh.execute("SET lock_timeout = '2s'")
                t = time.monotonic()
                try:
                    answers[name] = call(fresh)
                except psycopg.errors.LockNotAvailable:
                    answers[name] = "waited: lock_timeout expired"
                waited[name] = round(time.monotonic() - t, 2)
        holder.execute("ROLLBACK")
    assert answers == {"idem_claim(wait=>true)": "claimed", "idem_claim(wait=>false)": "claimed",
                       "idem_once": True, "idem_status(held)": None}, (answers, waited)
    assert max(waited.values()) < 1.5, waited
    report(f"first calls of new sessions on other keys while a key is held: {waited} (seconds)")


def test_reads_of_settled_keys_do_not_block(cluster, report):
    """A call that only reads a key (a duplicate, a replay, in_progress) gives the key's lock back
    at once, so an open transaction that saw a duplicate delays nobody; a call that wrote keeps
    the lock until its transaction ends."""
    scope = new_scope("settled")
    with cluster.connect() as setup:
        assert once(setup, "done-once", scope) is True
        c = claim(setup, "done-claim", scope)
        complete(setup, "done-claim", scope, token=c.token, payload={"ok": 1})
        assert claim(setup, "live-lease", scope, ttl="1 hour").outcome == "claimed"
        setup.execute("SELECT idem_once_batch(ARRAY['b1', 'b2'], scope => %s)", (scope,))
    reads = {
        "idem_once(duplicate)": lambda c: once(c, "done-once", scope),
        "idem_claim(completed)": lambda c: claim(c, "done-claim", scope).outcome,
        "idem_claim(in_progress)": lambda c: claim(c, "live-lease", scope).outcome,
        "idem_once_batch(duplicates)": lambda c: c.execute(
            "SELECT count(*) FROM idem_once_batch(ARRAY['b1', 'b2'], scope => %s)", (scope,)).fetchone()[0],
        "idem_claim_batch(settled)": lambda c: c.execute(
            "SELECT array_agg(outcome) FROM idem_claim_batch(ARRAY['done-claim', 'live-lease'], "
            "scope => %s)", (scope,)).fetchone()[0],
    }
    expected = {"idem_once(duplicate)": False, "idem_claim(completed)": "completed",
                "idem_claim(in_progress)": "in_progress", "idem_once_batch(duplicates)": 0,
                "idem_claim_batch(settled)": ["completed", "in_progress"]}
    answers, held_after = {}, {}
    with cluster.connect() as reader, cluster.connect() as other:
        other.execute("SET lock_timeout = '500ms'")
        for name, call in reads.items():
            reader.execute("BEGIN")
            answers[name] = call(reader)
            held_after[name] = reader.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = %s "
                "AND pid = pg_backend_pid()", (LOCK_OBJSUBID,)).fetchone()[0]
            # Another session's call on the same keys answers without waiting for the reader.
            try:
                call(other)
            except psycopg.errors.LockNotAvailable:
                answers[name] = "other session waited for the reader's lock"
            reader.execute("COMMIT")
        # A call that wrote (a new claim) still holds its key until commit.
        reader.execute("BEGIN")
        assert claim(reader, "fresh", scope).outcome == "claimed"
        with pytest.raises(psycopg.errors.LockNotAvailable):
            once(other, "fresh", scope)
        reader.execute("ROLLBACK")
    assert answers == expected, answers
    assert held_after == {name: 0 for name in reads}, held_after
    report(f"reads of settled keys hold no key lock afterwards: {sorted(held_after)}")


# --------------------------------------------------------------------------------------------------
# 7. Two-transaction claims with short leases, many contenders: at most one live holder.
# --------------------------------------------------------------------------------------------------

LEASE_SESSIONS = 12
LEASE_KEYS = 6
LEASE_TTL_MS = 300


def test_short_lease_contention_single_holder(cluster, report):
    scope = new_scope("contend")
    keys = [f"task-{i}" for i in range(LEASE_KEYS)]
    ttl = ms(LEASE_TTL_MS)
    start = threading.Barrier(LEASE_SESSIONS, timeout=30)
    guard = threading.Lock()
    successes = collections.Counter()

    def log_end(conn, key, token, fate, end=None):
        conn.execute(
            "UPDATE lease_log SET fate = %s, lease_end = coalesce(%s, lease_end) "
            "WHERE scope = %s AND key = %s AND token = %s", (fate, end, scope, key, token))

    def try_complete(conn, key, token, w, tally):
        try:
            conn.execute("BEGIN")
            complete(conn, key, scope, token=token, payload={"worker": w, "token": token})
            conn.execute("INSERT INTO lease_effects (scope, key, token, worker) "
                         "VALUES (%s, %s, %s, %s)", (scope, key, token, w))
            end = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            conn.execute("COMMIT")
        except psycopg.Error as e:
            rollback_quietly(conn)
            # A stale token is "lease lost" even after the new holder settled the key.
            if e.sqlstate != "55006":
                raise
            tally[f"fenced_{e.sqlstate}"] += 1
            log_end(conn, key, token, f"fenced_{e.sqlstate}")
            return False
        tally["completed_ok"] += 1
        log_end(conn, key, token, "completed", end)
        with guard:
            successes[key] += 1
        return True

    def session(w):
        rnd = random.Random(f"{scope}/{w}")
        tally = collections.Counter()
        done = set()
        deadline = time.monotonic() + 45
        with cluster.connect() as conn:
            # Takeovers count as attempts; keep the poison-message limit out of this test.
            conn.execute("SET idempotency.max_attempts = 100000")
            start.wait()
            while len(done) < len(keys):
                assert time.monotonic() < deadline, "keys never got completed"
                key = rnd.choice([k for k in keys if k not in done])
                c = claim(conn, key, scope, ttl=ttl)
                tally[c.outcome] += 1
                if c.outcome == "completed":
                    done.add(key)
                    continue
                if c.outcome == "in_progress":
                    time.sleep(rnd.uniform(0.005, 0.03))
                    continue
                assert c.outcome == "claimed", c
                conn.execute(
                    "INSERT INTO lease_log (scope, key, token, worker, claimed_at, lease_end) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
                    (scope, key, c.token, w, c.at, c.expires_at))
                # The first holder of every key stalls past its lease; later ones vary.
                if c.attempts == 1:
                    plan = "stall"
                elif c.attempts <= 6:
                    plan = rnd.choices(["stall", "release", "heartbeat", "quick"],
                                       weights=[35, 35, 15, 15])[0]
                else:
                    plan = "quick"
                tally[f"plan_{plan}"] += 1
                if plan == "stall":
                    time.sleep(3 * LEASE_TTL_MS / 1000)
                    try_complete(conn, key, c.token, w, tally)
                elif plan == "release":
                    time.sleep(rnd.uniform(0, LEASE_TTL_MS / 3000))
                    try:
                        # The lease ends at COMMIT (the key stays locked until then), so a clock
                        # read before COMMIT is a lower bound: a claim earlier than it overlapped.
                        conn.execute("BEGIN")
                        r = fail(conn, key, scope, token=c.token, error={"worker": w})
                        end = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                        conn.execute("COMMIT")
                        assert r == "released", r
                        tally["released"] += 1
                        log_end(conn, key, c.token, "released", end)
                    except psycopg.Error as e:
                        rollback_quietly(conn)
                        if e.sqlstate != "55006":
                            raise
                        tally["release_fenced"] += 1
                        log_end(conn, key, c.token, "release_fenced")
                elif plan == "heartbeat":
                    lost = False
                    for _ in range(3):
                        time.sleep(LEASE_TTL_MS / 3000)
                        try:
                            exp = heartbeat(conn, key, scope, token=c.token, ttl=ttl)
                            tally["heartbeats"] += 1
                            log_end(conn, key, c.token, "holding", exp)
                        except psycopg.Error as e:
                            if e.sqlstate != "55006":
                                raise
                            tally["heartbeat_lost"] += 1
                            lost = True
                            break
                    if lost:
                        log_end(conn, key, c.token, "heartbeat_lost")
                    else:
                        try_complete(conn, key, c.token, w, tally)
                else:
                    try_complete(conn, key, c.token, w, tally)
        return tally

    t0 = time.monotonic()
    tallies = run_threads(LEASE_SESSIONS, session, timeout=90)
    elapsed = time.monotonic() - t0
    t = sum(tallies, collections.Counter())

    with cluster.connect() as conn:
        effects = conn.execute(
            "SELECT key, count(*), max(token) FROM lease_effects WHERE scope = %s GROUP BY key",
            (scope,)).fetchall()
        # Holders of a key ordered by token: each one claimed only after the previous lease ended
        # (expired, released, or extended by heartbeats up to lease_end).
        overlaps = conn.execute(
            "SELECT key, prev_token, prev_fate, token, prev_end, claimed_at FROM ("
            "  SELECT key, token, claimed_at, lag(fate) OVER w AS prev_fate,"
            "         lag(token) OVER w AS prev_token, lag(lease_end) OVER w AS prev_end,"
            "         lag(claimed_at) OVER w AS prev_claimed"
            "  FROM lease_log WHERE scope = %s"
            "  WINDOW w AS (PARTITION BY key ORDER BY token)) s "
            "WHERE prev_token IS NOT NULL AND (claimed_at < prev_end OR claimed_at < prev_claimed)",
            (scope,)).fetchall()
        last_tokens = dict(conn.execute(
            "SELECT key, max(token) FROM lease_log WHERE scope = %s GROUP BY key",
            (scope,)).fetchall())
        holders = conn.execute("SELECT count(*) FROM lease_log WHERE scope = %s",
                               (scope,)).fetchone()[0]
        statuses = {k: status(conn, k, scope) for k in keys}

    assert sorted(e[0] for e in effects) == keys
    doubled = [e for e in effects if e[1] != 1]
    assert doubled == [], f"two holders' completions both succeeded: {doubled}"
    assert dict(successes) == {k: 1 for k in keys}
    assert overlaps == [], f"two live holders at once: {overlaps[:5]}"
    # The holder that completed is the last one that ever claimed the key.
    assert {e[0]: e[2] for e in effects} == last_tokens
    for k in keys:
        assert statuses[k]["status"] == "completed"
        assert statuses[k]["payload"]["token"] == last_tokens[k]
    fenced = t["fenced_55006"]
    assert fenced >= 1, "no stale holder was ever fenced off: the test did not exercise takeover"
    assert t["claimed"] == holders
    report(f"{LEASE_SESSIONS} sessions x {LEASE_KEYS} keys, ttl {LEASE_TTL_MS} ms: "
           f"{holders} leases granted (plans: stall {t['plan_stall']}, release {t['plan_release']}, "
           f"heartbeat {t['plan_heartbeat']}, quick {t['plan_quick']}), {t['in_progress']} in_progress, {t['completed']} completed "
           f"replays, {fenced} stale completions fenced with 55006, {t['released']} released, {t['heartbeats']} heartbeats "
           f"({t['heartbeat_lost']} lost), {elapsed:.1f}s")
