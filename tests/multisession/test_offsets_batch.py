"""Offsets and batch claims with real concurrent sessions (issue: transactional offsets)."""
import random
import threading
import time

import psycopg
import pytest

from idemlib import rollback_quietly, run_threads
from pgtools import RETRY_SQLSTATES


def one(conn, sql, *args):
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


def sqlstate(conn, sql, *args):
    try:
        conn.execute(sql, args)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def test_offset_not_advanced_when_session_dies_before_commit(cluster, report):
    admin = cluster.connect()
    victim = cluster.connect()
    victim.execute("BEGIN")
    victim.execute("INSERT INTO side_effects (scope, key) VALUES ('crash', 'm1')")
    assert one(victim, "SELECT idem_record_offset('g-crash', 't', 0, 41)") is True
    pid = victim.info.backend_pid
    # The consumer's process dies between its business write and its commit.
    assert one(admin, "SELECT pg_terminate_backend(%s)", pid) is True
    with pytest.raises(psycopg.OperationalError):
        victim.execute("COMMIT")
    assert one(admin, "SELECT idem_next_offset('g-crash', 't', 0)") is None
    assert one(admin, "SELECT count(*) FROM side_effects WHERE scope = 'crash'") == 0
    # After a commit, the position survives the session's death.
    c = cluster.connect()
    c.execute("BEGIN")
    c.execute("INSERT INTO side_effects (scope, key) VALUES ('crash', 'm1')")
    c.execute("SELECT idem_record_offset('g-crash', 't', 0, 41)")
    c.execute("COMMIT")
    admin.execute("SELECT pg_terminate_backend(%s)", (c.info.backend_pid,))
    assert one(admin, "SELECT idem_next_offset('g-crash', 't', 0)") == 42
    report("uncommitted offset lost with its writes; committed offset kept")


def test_stale_generation_is_fenced(cluster, report):
    c = cluster.connect()
    assert one(c, "SELECT idem_record_offset('g-fence', 't', 3, 10, 5)") is True
    assert sqlstate(c, "SELECT idem_record_offset('g-fence', 't', 3, 20, 4)") == "55006"
    assert one(c, "SELECT next_offset FROM idem_offsets('g-fence', 't')") == 11
    # A newer generation is stored even when the offset does not move.
    assert one(c, "SELECT idem_record_offset('g-fence', 't', 3, 10, 6)") is False
    assert one(c, "SELECT generation FROM idem_offsets('g-fence')") == 6
    assert sqlstate(c, "SELECT idem_record_offset('g-fence', 't', 3, 30, 5)") == "55006"
    report("stale generations 4 and 5 fenced after 5 and 6")


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_racing_the_same_offset(cluster, report, isolation):
    group = f"g-race-{isolation.replace(' ', '-')}"
    a, b = cluster.connect(), cluster.connect()
    a.execute(f"BEGIN ISOLATION LEVEL {isolation}")
    assert one(a, "SELECT idem_record_offset(%s, 't', 0, 10)", group) is True
    result = {}

    def second():
        b.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        try:
            result["value"] = one(b, "SELECT idem_record_offset(%s, 't', 0, 10)", group)
            b.execute("COMMIT")
        except psycopg.Error as e:
            result["sqlstate"] = e.sqlstate
            rollback_quietly(b)

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    assert t.is_alive(), "the second session must wait for the first one's row"
    a.execute("COMMIT")
    t.join(10)
    if isolation == "read committed":
        assert result == {"value": False}
    else:
        # The row appeared after b's snapshot: b must retry, never record the offset twice.
        assert result == {"sqlstate": "40001"}
    assert one(a, "SELECT idem_next_offset(%s, 't', 0)", group) == 11
    report(f"{isolation}: second recorder got {result}")


def test_duplicate_key_inside_one_batch(cluster):
    c = cluster.connect()
    rows = c.execute("SELECT key, outcome FROM idem_claim_batch(ARRAY['d1','d2','d1'], scope => 'dup')").fetchall()
    assert rows == [("d1", "claimed"), ("d2", "claimed"), ("d1", "in_progress")]
    assert c.execute("SELECT * FROM idem_once_batch(ARRAY['o1','o1','o2'], scope => 'dup')").fetchall() == [("o1",), ("o2",)]
    assert sqlstate(c, "SELECT idem_complete_batch(ARRAY['d1','d1'], scope => 'dup')") == "22023"


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read", "serializable"])
def test_batch_and_single_claims_race_on_overlapping_keys(cluster, report, isolation):
    scope = f"mix-{isolation.replace(' ', '-')}"
    keys = [f"k{i}" for i in range(60)]
    sessions = 8
    stats = {"claimed": 0, "retries": 0, "rollbacks": 0}
    lock = threading.Lock()

    def consumer(i):
        rnd = random.Random(i)
        conn = cluster.connect()
        for _ in range(25):
            batch = rnd.sample(keys, rnd.randint(1, 8))
            while True:
                try:
                    conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
                    if i % 2 == 0:
                        rows = conn.execute("SELECT key, outcome FROM idem_claim_batch(%s, scope => %s)",
                                            (batch, scope)).fetchall()
                    else:
                        rows = [(k, one(conn, "SELECT outcome FROM idem_claim(%s, scope => %s)", k, scope))
                                for k in sorted(set(batch))]
                    mine = sorted({k for k, outcome in rows if outcome == "claimed"})
                    for k in mine:
                        conn.execute("INSERT INTO race_effects (scope, key, worker) VALUES (%s, %s, %s)",
                                     (scope, k, i))
                    if mine:
                        conn.execute("SELECT idem_complete_batch(%s, scope => %s)", (mine, scope))
                    if rnd.random() < 0.2:
                        conn.execute("ROLLBACK")
                        with lock:
                            stats["rollbacks"] += 1
                        break
                    conn.execute("COMMIT")
                    with lock:
                        stats["claimed"] += len(mine)
                    break
                except psycopg.Error as e:
                    rollback_quietly(conn)
                    if e.sqlstate not in RETRY_SQLSTATES:
                        raise
                    with lock:
                        stats["retries"] += 1

    run_threads(sessions, consumer, timeout=120)
    c = cluster.connect()
    dupes = c.execute("""SELECT key, count(*) FROM race_effects WHERE scope = %s
                         GROUP BY key HAVING count(*) > 1""", (scope,)).fetchall()
    assert dupes == [], f"side effects applied twice: {dupes}"
    applied = one(c, "SELECT count(*) FROM race_effects WHERE scope = %s", scope)
    completed = one(c, """SELECT count(*) FROM idempotency.records
                          WHERE scope = %s AND status = 'completed'""", scope)
    pending = one(c, "SELECT count(*) FROM idempotency.records WHERE scope = %s AND status = 'pending'", scope)
    assert applied == completed == stats["claimed"]
    assert pending == 0
    report(f"{isolation}: {applied} keys applied once, {stats['retries']} retries, "
           f"{stats['rollbacks']} rollbacks, 0 duplicates")
