"""Statistics (idempotency.stats, idem_stats) against what real concurrent consumers saw.

The session cluster preloads the library, so the counters are on. Every test works in scopes of its
own, and compares the counters of its scopes with a tally the sessions kept of every answer and
every error they got. The counters are published when a transaction ends, so the tallies are read
after every session finished its last transaction.
"""
import collections
import random
import threading
import time
import uuid

import psycopg

from idemlib import rollback_quietly, run_threads

LEVELS = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
COUNTERS = ("claims", "claimed_new", "takeovers", "retries", "answered_completed", "answered_in_progress",
            "answered_failed", "answered_mismatch", "poisoned", "dead_lettered", "stale_refused",
            "serialization_failures", "lock_waits", "lock_wait_ms", "completes", "fails", "heartbeats")


def new_scope(tag):
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def stats_of(conn, scope):
    rows = conn.execute(f"SELECT {', '.join(COUNTERS)}, stats_reset FROM idempotency.stats WHERE scope = %s",
                        (scope,)).fetchall()
    assert len(rows) <= 1, rows
    if not rows:
        return None
    return dict(zip(COUNTERS + ("stats_reset",), rows[0]))


def sum_claimed(s):
    return s["claimed_new"] + s["takeovers"] + s["retries"]


def sum_answered(s):
    return s["answered_completed"] + s["answered_in_progress"] + s["answered_failed"] + s["answered_mismatch"]


SESSIONS = 6
TRANSACTIONS = 120
KEYS = 16


def _consumer(cluster, scope, seed, tally, lock):
    """One consumer: random transactions over a small pool of keys, every answer and error tallied."""
    rnd = random.Random(seed)
    seen = collections.Counter()
    conn = cluster.connect()
    conn.execute("SET idempotency.max_attempts = 3")
    conn.execute("SET lock_timeout = '5s'")
    try:
        for _ in range(TRANSACTIONS):
            time.sleep(rnd.random() * 0.01)  # lets some 80 ms leases expire, to be taken over
            level = rnd.choice(LEVELS)
            conn.execute(f"BEGIN ISOLATION LEVEL {level}")
            try:
                op = rnd.random()
                if op < 0.6:
                    key = f"k{rnd.randrange(KEYS)}"
                    fp = rnd.choice([None, None, "fp-a", "fp-b"])
                    ttl = rnd.choice(["80 ms", "5 s", "5 min"])
                    row = conn.execute(
                        "SELECT outcome, token, attempts FROM idem_claim(%s, %s::interval, %s, %s, %s)",
                        (key, ttl, scope, fp, rnd.random() < 0.7)).fetchone()
                    outcome, token, attempts = row
                    seen[f"outcome:{outcome}"] += 1
                    if outcome == "claimed":
                        seen["claimed_first" if attempts == 1 else "claimed_again"] += 1
                        what = rnd.random()
                        if what < 0.45:
                            if rnd.random() < 0.3:
                                conn.execute("SELECT idem_heartbeat(%s, NULL, %s, %s)", (key, scope, token))
                                seen["heartbeats"] += 1
                            conn.execute("SELECT idem_complete(%s, '{\"ok\": true}', %s, %s)", (key, scope, token))
                            seen["completes"] += 1
                        elif what < 0.75:
                            retryable = rnd.random() < 0.8
                            left = conn.execute("SELECT idem_fail(%s, '{\"e\": 1}', %s, %s, %s)",
                                                (key, retryable, scope, token)).fetchone()[0]
                            seen["fails"] += 1
                            if left == "failed" and not retryable:
                                seen["failed_terminal"] += 1
                        # else: leave the lease (two-transaction mode); it may expire and be taken over
                elif op < 0.8:
                    keys = [f"k{rnd.randrange(KEYS)}" for _ in range(rnd.randint(1, 4))]
                    rows = conn.execute("SELECT key, outcome, token, attempts FROM idem_claim_batch(%s, NULL, %s)",
                                        (keys, scope)).fetchall()
                    claimed = []
                    for key, outcome, token, attempts in rows:
                        seen[f"outcome:{outcome}"] += 1
                        if outcome == "claimed":
                            seen["claimed_first" if attempts == 1 else "claimed_again"] += 1
                            claimed.append(key)
                    if claimed and rnd.random() < 0.7:
                        n = conn.execute("SELECT idem_complete_batch(%s, NULL, %s)", (claimed, scope)).fetchone()[0]
                        seen["completes"] += n
                else:
                    # A holder whose lease was lost, or a stranger: a token that is not the key's.
                    key = f"k{rnd.randrange(KEYS)}"
                    conn.execute("SELECT idem_complete(%s, NULL, %s, 9000000000000000000)", (key, scope))
                    seen["completes"] += 1
                if rnd.random() < 0.15:
                    conn.execute("ROLLBACK")
                else:
                    conn.execute("COMMIT")
            except psycopg.Error as e:
                seen[f"error:{e.sqlstate}"] += 1
                if e.sqlstate == "40001" and "idempotency" in str(e):
                    seen["ser_ext"] += 1
                rollback_quietly(conn)
    finally:
        conn.close()
    with lock:
        tally.update(seen)


def test_counters_add_up_under_races(cluster, report):
    scope = new_scope("stats-race")
    tally, lock = collections.Counter(), threading.Lock()
    run_threads(SESSIONS, lambda i: _consumer(cluster, scope, 1000 + i, tally, lock), timeout=300)
    with cluster.connect() as conn:
        s = stats_of(conn, scope)
    assert s is not None, "no row for the scope in idempotency.stats"
    outcomes = {o: tally[f"outcome:{o}"] for o in ("claimed", "completed", "in_progress", "failed", "mismatch")}
    report(f"{sum(outcomes.values())} answers {outcomes}, errors "
           f"{ {k[6:]: v for k, v in tally.items() if k.startswith('error:')} }; counters {s}")
    assert s["claims"] == sum(outcomes.values())
    assert s["claims"] == sum_claimed(s) + sum_answered(s)
    assert s["claimed_new"] == tally["claimed_first"]
    assert s["takeovers"] + s["retries"] == tally["claimed_again"]
    assert s["answered_completed"] == outcomes["completed"]
    assert s["answered_in_progress"] == outcomes["in_progress"]
    assert s["answered_failed"] == outcomes["failed"]
    assert s["answered_mismatch"] == outcomes["mismatch"]
    assert s["completes"] == tally["completes"]
    assert s["fails"] == tally["fails"]
    assert s["heartbeats"] == tally["heartbeats"]
    assert s["stale_refused"] == tally["error:55006"]
    assert s["serialization_failures"] == tally["ser_ext"]
    # Terminal failures are idem_fail(retryable => false) and poisoned keys; nothing else.
    assert s["dead_lettered"] - s["poisoned"] == tally["failed_terminal"]
    # The common paths are reached every time (test_every_counter_exactly reaches the others).
    for name in ("claimed_new", "answered_completed", "answered_in_progress", "answered_mismatch", "stale_refused",
                 "completes", "fails"):
        assert s[name] > 0, f"the workload never reached {name}: {s}"


def test_every_counter_exactly(cluster):
    """Each path of a key, walked once on purpose, moves exactly its counters."""
    scope = new_scope("stats-exact")
    a, b = cluster.connect(), cluster.connect()
    try:
        for c in (a, b):
            c.execute("SET idempotency.max_attempts = 2")

        def claim(conn, key, ttl=None, fp=None):
            return conn.execute("SELECT outcome, token FROM idem_claim(%s, %s::interval, %s, %s)",
                                (key, ttl, scope, fp)).fetchone()

        def delta(before, **want):
            now = stats_of(a, scope)
            got = {k: now[k] - (before[k] if before else 0) for k in COUNTERS if k != "lock_wait_ms"}
            expected = {k: want.get(k, 0) for k in got}
            assert got == expected, f"counters moved by {got}, expected {expected}"
            return now

        # New key, its completion, a duplicate.
        outcome, t1 = claim(a, "k1")
        assert outcome == "claimed"
        a.execute("SELECT idem_complete('k1', NULL, %s, %s)", (scope, t1))
        s = delta(None, claims=1, claimed_new=1, completes=1)
        assert claim(b, "k1")[0] == "completed"
        s = delta(s, claims=1, answered_completed=1)
        # A live lease (two-transaction mode), asked again; a heartbeat; a stale holder; a mismatch.
        _, token = claim(a, "k2", fp="x")
        assert claim(b, "k2")[0] == "in_progress"
        a.execute("SELECT idem_heartbeat('k2', NULL, %s, %s)", (scope, token))
        s = delta(s, claims=2, claimed_new=1, answered_in_progress=1, heartbeats=1)
        try:
            b.execute("SELECT idem_complete('k2', NULL, %s, %s)", (scope, token + 1000))
            raise AssertionError("a wrong token completed the key")
        except psycopg.errors.ObjectInUse:  # 55006
            pass
        assert claim(b, "k2", fp="y")[0] == "mismatch"
        s = delta(s, claims=1, answered_mismatch=1, stale_refused=1)
        # An expired lease is taken over; a retryable failure, then the retry; then poisoned by
        # max_attempts (2) at the next takeover.
        claim(a, "k3", ttl="1 ms")
        time.sleep(0.01)
        _, t3 = claim(b, "k3")
        s = delta(s, claims=2, claimed_new=1, takeovers=1)
        assert b.execute("SELECT idem_fail('k3', NULL, true, %s, %s)", (scope, t3)).fetchone()[0] == "failed"
        s = delta(s, fails=1, dead_lettered=1, poisoned=1)  # attempt 2 of 2 failed: terminal
        _, t4 = claim(a, "k4")
        assert a.execute("SELECT idem_fail('k4', NULL, true, %s, %s)", (scope, t4)).fetchone()[0] == "released"
        assert claim(b, "k4", ttl="1 ms")[0] == "claimed"
        time.sleep(0.01)
        assert claim(a, "k4")[0] == "failed"  # its consumers died twice: a poison message
        s = delta(s, claims=3, claimed_new=1, retries=1, fails=1, poisoned=1, dead_lettered=1, answered_failed=1)
        _, t5 = claim(a, "k5")
        assert a.execute("SELECT idem_fail('k5', NULL, false, %s, %s)", (scope, t5)).fetchone()[0] == "failed"
        assert claim(b, "k5")[0] == "failed"
        s = delta(s, claims=2, claimed_new=1, fails=1, dead_lettered=1, answered_failed=1)
        # A serialization failure: b's snapshot predates a's new key.
        b.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        b.execute("SELECT 1")
        claim(a, "k6")
        try:
            claim(b, "k6")
            raise AssertionError("a claim outside the snapshot got an answer")
        except psycopg.errors.SerializationFailure:
            b.execute("ROLLBACK")
        delta(s, claims=1, claimed_new=1, serialization_failures=1)
    finally:
        a.close()
        b.close()


def test_once_counts(cluster, report):
    scope = new_scope("stats-once")
    keys = [f"o{i}" for i in range(30)]
    tally, lock = collections.Counter(), threading.Lock()

    def consumer(i):
        rnd = random.Random(i)
        seen = collections.Counter()
        with cluster.connect() as conn:
            for _ in range(40):
                conn.execute(f"BEGIN ISOLATION LEVEL {rnd.choice(LEVELS)}")
                try:
                    if rnd.random() < 0.5:
                        fresh = conn.execute("SELECT idem_once(%s, %s)", (rnd.choice(keys), scope)).fetchone()[0]
                        seen["asked"] += 1
                        seen["new" if fresh else "seen"] += 1
                    else:
                        batch = [rnd.choice(keys) for _ in range(rnd.randint(1, 5))]
                        fresh = conn.execute("SELECT array(SELECT idem_once_batch(%s, %s))", (batch, scope)).fetchone()[0]
                        seen["asked"] += len(batch)
                        seen["new"] += len(fresh)
                        seen["seen"] += len(batch) - len(fresh)
                    conn.execute("ROLLBACK" if rnd.random() < 0.2 else "COMMIT")
                except psycopg.Error as e:
                    seen[f"error:{e.sqlstate}"] += 1
                    rollback_quietly(conn)
        with lock:
            tally.update(seen)

    run_threads(4, consumer, timeout=120)
    with cluster.connect() as conn:
        s = stats_of(conn, scope)
    report(f"asked {tally['asked']}, new {tally['new']}, seen {tally['seen']}; counters {s}")
    assert s["claims"] == tally["asked"]
    assert s["claimed_new"] == tally["new"]
    # Only idem_once writes here, so every key it finds is completed.
    assert s["answered_completed"] == tally["seen"]
    assert s["answered_in_progress"] == s["answered_failed"] == s["answered_mismatch"] == 0
    assert s["takeovers"] == s["retries"] == 0


def test_lock_wait_is_counted(cluster):
    scope = new_scope("stats-wait")
    holder, waiter = cluster.connect(), cluster.connect()
    try:
        holder.execute("BEGIN")
        assert holder.execute("SELECT outcome FROM idem_claim('w', NULL, %s)", (scope,)).fetchone()[0] == "claimed"
        result = {}

        def wait():
            result["outcome"] = waiter.execute("SELECT outcome FROM idem_claim('w', NULL, %s)", (scope,)).fetchone()[0]

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "the second claim did not wait for the key lock"
        holder.execute("SELECT idem_complete('w', NULL, %s)", (scope,))
        holder.execute("COMMIT")
        t.join(10)
        assert result["outcome"] == "completed"
        s = stats_of(holder, scope)
        assert s["lock_waits"] == 1
        assert s["lock_wait_ms"] >= 400, s  # it waited at least as long as the holder slept
        assert s["claims"] == 2 and s["claimed_new"] == 1 and s["answered_completed"] == 1
    finally:
        holder.close()
        waiter.close()


def test_reset_and_switch_off(cluster):
    a, b = new_scope("stats-reset-a"), new_scope("stats-reset-b")
    with cluster.connect() as conn:
        for scope in (a, b):
            conn.execute("SELECT idem_once('x', %s)", (scope,))
        before = stats_of(conn, a)["stats_reset"]
        at = conn.execute("SELECT idem_stats_reset(%s)", (a,)).fetchone()[0]
        sa, sb = stats_of(conn, a), stats_of(conn, b)
        assert sa["claims"] == 0 and sa["stats_reset"] == at and at > before
        assert sb["claims"] == 1, "a reset of one scope touched another"
        # Switched off (superuser only): calls are not counted, idem_stats() says so.
        conn.execute("SET idempotency.stats = off")
        conn.execute("SELECT idem_once('y', %s)", (a,))
        assert stats_of(conn, a)["claims"] == 0
        assert conn.execute("SELECT enabled FROM idem_stats()").fetchone()[0] is False
        conn.execute("RESET idempotency.stats")
        conn.execute("SELECT idem_once('y', %s)", (a,))
        assert stats_of(conn, a)["answered_completed"] == 1
        total = conn.execute("SELECT claims, scopes, enabled FROM idem_stats()").fetchone()
        by_scope = conn.execute("SELECT sum(claims), count(*) FROM idempotency.stats").fetchone()
        assert total == (by_scope[0], by_scope[1], True)


def test_consumer_cannot_reset_or_switch_off(cluster):
    scope = new_scope("stats-priv")
    role = f"consumer_{uuid.uuid4().hex[:8]}"
    with cluster.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE idempotency_consumer")
        conn.execute("SELECT idem_once('x', %s)", (scope,))
    try:
        with psycopg.connect(host=cluster.host, port=cluster.port, dbname=cluster.dbname, user=role,
                             autocommit=True) as c:
            for sql in ("SELECT idem_stats_reset()", "SELECT * FROM idempotency.stats", "SELECT * FROM idem_stats()"):
                try:
                    c.execute(sql)
                    raise AssertionError(f"{sql} ran for a consumer")
                except psycopg.errors.InsufficientPrivilege:
                    pass
            try:
                c.execute("SET idempotency.stats = off")
                raise AssertionError("a consumer switched the statistics off")
            except psycopg.errors.InsufficientPrivilege:
                pass
        with cluster.connect() as conn:
            assert stats_of(conn, scope)["claims"] == 1
    finally:
        with cluster.connect() as conn:
            conn.execute(f"DROP ROLE {role}")
