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
import pytest

from idemlib import rollback_quietly, run_threads

pytestmark = pytest.mark.native_only("the shared-memory statistics counters (shared_preload_libraries)")

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
            committing = False
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
                    committing = True
                    conn.execute("COMMIT")
            except psycopg.Error as e:
                seen[f"error:{e.sqlstate}"] += 1
                if e.sqlstate == "40001":
                    # Every statement before COMMIT is an idem_* call: its 40001 is counted, whoever
                    # raised it. At COMMIT, only one from the insert of a claim's row left to COMMIT.
                    seen["ser_at_commit" if committing else "ser_in_call"] += 1
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
    assert tally["ser_in_call"] <= s["serialization_failures"] <= tally["ser_in_call"] + tally["ser_at_commit"]
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


@pytest.mark.parametrize("timeout", ["lock_timeout", "statement_timeout"])
def test_a_lock_wait_that_ends_in_an_error_is_counted(cluster, timeout):
    """A wait for a key's lock that ends in an ERROR (here 55P03 lock_timeout, or 57014 statement_timeout)
    is counted with its time until then: counts are published when the transaction aborts too."""
    scope = new_scope(f"stats-wait-{timeout}")
    holder, waiter = cluster.connect(), cluster.connect()
    try:
        holder.execute("BEGIN")
        assert holder.execute("SELECT outcome FROM idem_claim('w', NULL, %s)", (scope,)).fetchone()[0] == "claimed"
        waiter.execute(f"SET {timeout} = '300ms'")
        expected = psycopg.errors.LockNotAvailable if timeout == "lock_timeout" else psycopg.errors.QueryCanceled
        with pytest.raises(expected):
            waiter.execute("SELECT outcome FROM idem_claim('w', NULL, %s)", (scope,))
        waiter.execute(f"RESET {timeout}")
        holder.execute("ROLLBACK")
        s = stats_of(holder, scope)
        assert s["lock_waits"] == 1, s
        # lock_timeout fires 300 ms into the wait; statement_timeout 300 ms into the call, which waits
        # nearly all of it.
        assert 200 <= s["lock_wait_ms"] < 10_000, s
        # Only the holder's claim: the waiter's raised, so it answered nothing.
        assert (s["claims"], s["claimed_new"], sum_answered(s)) == (1, 1, 0), s
    finally:
        holder.close()
        waiter.close()


CALLS_THAT_UPDATE = {
    "complete": "SELECT idem_complete('k', NULL, %(scope)s, %(token)s)",
    "fail": "SELECT idem_fail('k', NULL, true, %(scope)s, %(token)s)",
    "heartbeat": "SELECT idem_heartbeat('k', NULL, %(scope)s, %(token)s)",
    "takeover": "SELECT outcome FROM idem_claim('k', NULL, %(scope)s)",
}


@pytest.mark.parametrize("call", sorted(CALLS_THAT_UPDATE))
def test_a_serialization_failure_postgresql_raises_inside_a_call_is_counted(cluster, call):
    """A write skew between two SERIALIZABLE transactions that PostgreSQL's SSI detects at the UPDATE a
    call makes (complete, fail, heartbeat, the takeover of an expired lease): the 40001 reaches the client
    as PostgreSQL raised it, and serialization_failures counts it (and nothing else moves)."""
    scope = new_scope(f"stats-ssi-{call}")
    a, b = cluster.connect(), cluster.connect()
    try:
        # The key, claimed and committed: a lease a holds, or (to be taken over) one that has ended.
        ttl = "1 ms" if call == "takeover" else "5 min"
        token = a.execute("SELECT token FROM idem_claim('k', %s::interval, %s)", (ttl, scope)).fetchone()[0]
        time.sleep(0.01)
        before = stats_of(a, scope)
        # a reads what b writes; b reads the key that a then updates, and commits first: a cycle of
        # rw-dependencies that SSI breaks by failing a at its UPDATE (a pivot "during write").
        a.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        a.execute("SELECT count(*) FROM side_effects WHERE scope = %s", (scope,))
        b.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        assert b.execute("SELECT status FROM idem_status('k', %s)", (scope,)).fetchone()[0] == "pending"
        b.execute("INSERT INTO side_effects (scope, key, note) VALUES (%s, 'k', 'b')", (scope,))
        b.execute("COMMIT")
        with pytest.raises(psycopg.errors.SerializationFailure) as raised:
            a.execute(CALLS_THAT_UPDATE[call], {"scope": scope, "token": token})
        a.execute("ROLLBACK")
        message = raised.value.diag.message_primary
        assert not message.startswith("idempotency"), f"not PostgreSQL's own 40001: {message}"
        after = stats_of(a, scope)
        moved = {k: after[k] - before[k] for k in COUNTERS if k != "lock_wait_ms"}
        assert moved == {k: int(k == "serialization_failures") for k in moved}, moved
    finally:
        a.close()
        b.close()


def test_a_batch_whose_later_key_raises_counts_nothing(cluster):
    """idem_claim_batch inserts its new keys first, then takes over or answers the known ones in key order;
    when a later key raises, the batch answered nothing: none of its keys is counted, and claims stays
    claimed_new + takeovers + retries + answered_*."""
    scope = new_scope("stats-batch-raise")
    name = f"stats_boom_{uuid.uuid4().hex[:8]}"
    with cluster.connect() as conn:
        _, token = conn.execute("SELECT outcome, token FROM idem_claim('a-done', NULL, %s)", (scope,)).fetchone()
        conn.execute("SELECT idem_complete('a-done', NULL, %s, %s)", (scope, token))
        conn.execute("SELECT idem_claim('c-boom', '1 ms', %s)", (scope,))
        time.sleep(0.01)  # its lease ends: the batch takes it over, with an UPDATE that raises
        conn.execute(f"""CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
                         BEGIN
                           IF NEW.scope = TG_ARGV[0] AND NEW.key = 'c-boom' THEN
                             RAISE EXCEPTION 'boom on %', NEW.key;
                           END IF;
                           RETURN NEW;
                         END $$""")
        conn.execute(f"CREATE TRIGGER {name} BEFORE UPDATE ON idempotency.records "
                     f"FOR EACH ROW EXECUTE FUNCTION {name}('{scope}')")
        try:
            before = stats_of(conn, scope)
            with pytest.raises(psycopg.errors.RaiseException, match="boom on c-boom"):
                conn.execute("SELECT * FROM idem_claim_batch(ARRAY['a-done', 'b-new', 'c-boom'], NULL, %s)",
                             (scope,))
            after = stats_of(conn, scope)
        finally:
            conn.execute(f"DROP TRIGGER {name} ON idempotency.records")
            conn.execute(f"DROP FUNCTION {name}()")
        moved = {k: after[k] - before[k] for k in COUNTERS if k != "lock_wait_ms"}
        assert moved == {k: 0 for k in moved}, f"a batch that raised moved {moved}"
        assert after["claims"] == sum_claimed(after) + sum_answered(after), after


def test_long_scopes_show_apart_and_reset_by_name(cluster):
    """Scopes over 128 bytes (the name a slot keeps) show as their first 111 bytes, '~' and 16 hex digits
    of hashtextextended(scope, 0): two that share their first 190 bytes show apart. idem_stats_reset
    finds one by its full name, or by the name it shows."""
    a = (new_scope("stats-long") + "-").ljust(200, "x")
    b = a[:190] + "y" * 10
    with cluster.connect() as conn:
        for scope in (a, b, a):
            conn.execute("SELECT idem_once(%s, %s)", (str(uuid.uuid4()), scope))
        shown = {scope: conn.execute("SELECT left(%s, 111) || '~' || lpad(to_hex(hashtextextended(%s, 0)), 16, '0')",
                                     (scope, scope)).fetchone()[0] for scope in (a, b)}

        def rows():
            return dict(conn.execute("SELECT scope, claims FROM idempotency.stats WHERE left(scope, 100) = %s",
                                     (a[:100],)).fetchall())

        assert rows() == {shown[a]: 2, shown[b]: 1}
        assert all(len(name.encode()) == 128 for name in shown.values())
        conn.execute("SELECT idem_stats_reset(%s)", (a,))
        assert rows() == {shown[a]: 0, shown[b]: 1}, "the reset by full name missed, or touched the other"
        conn.execute("SELECT idem_stats_reset(%s)", (shown[b],))
        assert rows() == {shown[a]: 0, shown[b]: 0}, "the reset by the shown name missed"
        conn.execute("SELECT idem_once('again', %s)", (b,))
        assert rows() == {shown[a]: 0, shown[b]: 1}, "counted again, but not in its row"


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
