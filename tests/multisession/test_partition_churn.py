"""Consumers claiming while partitions are dropped and made under them.

A superuser runs maintenance rounds as of 30 days ahead (which drop every partition consumers write to),
plain rounds and premakes, back to back, while consumer-role sessions claim with savepoints, rollbacks
and several claims per statement. Each consumer backend caches where new rows go (the partition holding
the present); a cache filled from a snapshot taken before a drop committed, after the drop's
invalidation had already been processed, kept naming the dropped partition: the claim's row was
written to it at COMMIT ("could not open relation with OID ...", XX000), and every later call of that
backend failed the same way (0.5.0 and 0.6.0 before the fix: dozens per run). Every error a consumer
may see here is a retry (40001, 40P01) or a lock timeout; anything else fails the test.
"""
import random
import threading
import time

import psycopg

import pgtools

DB = "idem_churn"
SECONDS = 12
CONSUMERS = 4
# What a consumer may be told while its partition is dropped under it: retry (serialization, deadlock)
# or wait longer (the drop's lock_timeout, a statement timeout).
EXPECTED = {"40001", "40P01", "55P03", "57014"}


def _admin(cluster, stop, errors):
    rnd = random.Random(0)
    with cluster.connect(dbname=DB) as s:
        while not stop.is_set():
            query = rnd.choice(["SELECT * FROM idem_maintenance(now() + interval '30 days')",
                                "SELECT * FROM idem_maintenance()",
                                "SELECT idempotency.premake_partitions(now())"])
            try:
                s.execute(query)
            except psycopg.Error as e:
                if e.sqlstate not in EXPECTED:
                    errors.append(f"admin: {e.sqlstate} {e}")


def _consumer(cluster, worker, stop, errors, calls, retried):
    rnd = random.Random(worker)
    with cluster.connect(dbname=DB, user="churn_consumer") as s:
        while not stop.is_set():
            try:
                if rnd.random() < 0.5:
                    s.execute("BEGIN")
                    savepoint = rnd.random() < 0.3
                    if savepoint:
                        s.execute("SAVEPOINT a")
                    s.execute("SELECT * FROM idem_claim(%s)", (f"k{rnd.randint(1, 50)}",))
                    if savepoint and rnd.random() < 0.5:
                        s.execute("ROLLBACK TO SAVEPOINT a")
                    s.execute("SELECT idem_once(%s)", (f"o{rnd.randint(1, 50)}",))
                    s.execute(rnd.choice(["COMMIT", "ROLLBACK"]))
                else:
                    s.execute("SELECT * FROM generate_series(1, 2) g, LATERAL idem_claim(%s) AS f",
                              (f"k{rnd.randint(1, 50)}",))
                calls[worker] += 1
            except psycopg.Error as e:
                if e.sqlstate not in EXPECTED:
                    errors.append(f"consumer {worker}: {e.sqlstate} {e}")
                retried[e.sqlstate] = retried.get(e.sqlstate, 0) + 1
                s.execute("ROLLBACK")


def test_claims_while_partitions_are_dropped_and_made(cluster, report):
    with cluster.connect(dbname="postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.execute(f"CREATE DATABASE {DB}")
        admin.execute("DROP ROLE IF EXISTS churn_consumer")
        admin.execute("CREATE ROLE churn_consumer LOGIN")
    with cluster.connect(dbname=DB) as conn:
        pgtools.install_extension(conn)
        conn.execute("GRANT idempotency_consumer TO churn_consumer")
        conn.execute("SELECT FROM idem_maintenance()")
    stop = threading.Event()
    errors, calls, retried = [], [0] * CONSUMERS, {}
    threads = [threading.Thread(target=_admin, args=(cluster, stop, errors))]
    threads += [threading.Thread(target=_consumer, args=(cluster, w, stop, errors, calls, retried)) for w in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join()
    with cluster.connect(dbname=DB) as conn:
        dropped = conn.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relname LIKE 'records_p%'").fetchone()[0]
    report(f"{sum(calls)} consumer statements in {SECONDS}s, errors by SQLSTATE {retried}, "
           f"{dropped} partitions at the end")
    assert sum(calls) > 0
    assert not errors, errors[:5]
