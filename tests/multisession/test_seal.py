"""Trying to slip a key past a seal.

Writers at READ COMMITTED, REPEATABLE READ and SERIALIZABLE pin their transaction's start (so their
`now()` falls in the partition being sealed), wait a little, then claim keys of a small key space (many
duplicates); the partition of the present is sealed at a random moment while they run. A filter that
missed a key, or a row that landed in the partition after its seal, would show as a key recorded twice,
a side effect applied twice, a sealed key answered as new, or more rows in the partition than it had
when it was sealed.
"""
import contextlib
import os
import random
import shutil
import subprocess
import threading
import time

import psycopg
import pytest

import pgtools
from pgtools import RETRY_SQLSTATES

pytestmark = pytest.mark.native_only("sealing the partition of the present under writers, and its filters (the SQL edition "
                                     "seals only partitions whose range is past, and keeps no filters)")

LEVELS = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
KEYS = 400


def _writer(cluster, db, worker, stop, errors, counts):
    rnd = random.Random(worker)
    with cluster.connect(dbname=db) as conn:
        while not stop.is_set():
            level = LEVELS[worker % len(LEVELS)]
            keys = [f"k{rnd.randrange(KEYS)}" for _ in range(rnd.randint(1, 4))]
            try:
                conn.execute(f"BEGIN ISOLATION LEVEL {level}")
                conn.execute("SELECT now()")  # the transaction's start is fixed here
                time.sleep(rnd.random() * 0.05)
                for key in keys:
                    if worker % 2:
                        new = conn.execute("SELECT idem_once(%s, 'seal')", (key,)).fetchone()[0]
                    else:
                        outcome = conn.execute("SELECT outcome FROM idem_claim(%s, scope => 'seal')", (key,)).fetchone()[0]
                        new = outcome == "claimed"
                        if new:
                            conn.execute("SELECT idem_complete(%s, scope => 'seal')", (key,))
                    if new:
                        conn.execute("INSERT INTO effects VALUES (%s, %s)", (key, worker))
                conn.execute("COMMIT")
                counts[worker] += 1
            except psycopg.Error as e:
                conn.execute("ROLLBACK")
                if e.sqlstate not in RETRY_SQLSTATES:
                    errors.append(f"worker {worker}: {e.sqlstate} {e}")
                    return


@contextlib.contextmanager
def _fresh_database(cluster, db):
    """A database of its own, with the extension and its first partitions; dropped at the end."""
    with cluster.connect(dbname="postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.execute(f"CREATE DATABASE {db}")
    try:
        with cluster.connect(dbname=db) as conn:
            pgtools.install_extension(conn)
            conn.execute("SELECT FROM idem_maintenance()")
        yield
    finally:
        with cluster.connect(dbname="postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.mark.parametrize("round_", range(3))
def test_no_key_slips_past_a_seal(cluster, report, round_):
    db = f"idem_seal_{round_}"
    with _fresh_database(cluster, db):
        with cluster.connect(dbname=db) as conn:
            conn.execute("CREATE TABLE effects (key text NOT NULL, worker int NOT NULL)")
            present = conn.execute(
                "SELECT partition::oid FROM idempotency.partitions WHERE range_from <= now() AND range_to > now()"
            ).fetchone()[0]
        stop = threading.Event()
        errors, counts = [], [0] * 6
        threads = [threading.Thread(target=_writer, args=(cluster, db, w, stop, errors, counts)) for w in range(6)]
        for t in threads:
            t.start()
        time.sleep(random.Random(round_).uniform(0.3, 1.5))
        with cluster.connect(dbname=db) as sealer:
            t0 = time.monotonic()
            assert sealer.execute("SELECT idempotency.seal_partition(%s)", (present,)).fetchone()[0] is True
            seal_wait = time.monotonic() - t0
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors

        with cluster.connect(dbname=db) as conn:
            twice = conn.execute(
                "SELECT scope, key, count(*) FROM idempotency.records GROUP BY 1, 2 HAVING count(*) > 1"
            ).fetchall()
            assert twice == [], f"keys recorded twice: {twice}"
            applied_twice = conn.execute(
                "SELECT key, count(*) FROM effects GROUP BY 1 HAVING count(*) > 1"
            ).fetchall()
            assert applied_twice == [], f"side effects applied twice: {applied_twice}"
            sealed_keys, now_in = conn.execute(
                "SELECT s.keys, (SELECT count(*) FROM idempotency.records r WHERE r.tableoid = s.partition)"
                "  FROM idempotency.sealed s WHERE s.partition = %s", (present,)
            ).fetchone()
            assert now_in == sealed_keys, f"{now_in - sealed_keys} rows landed in the partition after its seal"
            moved = conn.execute(
                "SELECT count(*) FROM idempotency.records WHERE tableoid <> %s", (present,)).fetchone()[0]
            # Every key of the sealed partition is found through its filter: none is new again, whether
            # the filter is read from the backend's copy (the default) or from shared buffers.
            for cache in ("8MB", "0"):
                conn.execute("BEGIN")
                conn.execute(f"SET LOCAL idempotency.filter_cache = '{cache}'")
                renewed = conn.execute(
                    "SELECT count(*) FROM idempotency.records r WHERE r.tableoid = %s AND idem_once(r.key, r.scope)",
                    (present,)).fetchone()[0]
                conn.execute("ROLLBACK")
                assert renewed == 0, f"{renewed} keys of the sealed partition answered as new (filter_cache {cache})"
            effects = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
            records = conn.execute("SELECT count(*) FROM idempotency.records").fetchone()[0]
            assert effects == records
        report(f"{sum(counts)} transactions, {sealed_keys} keys sealed (seal waited {seal_wait * 1000:.0f} ms), "
               f"{moved} keys moved to the next partition, 0 duplicates")
        assert sealed_keys > 0 and moved > 0, "the seal did not fall while writers ran"



def test_a_key_moved_past_a_seal_is_found(cluster):
    """The interleaving behind a duplicate the racing test above caught, in a fixed order: session A begins
    (its time in a partition that takes rows) with what it knows of the partitions cached; that partition is
    sealed; B claims a key, which goes to the next partition; then A claims the same key, and must find B's
    row, though what A had cached (the seal's end, up to which partitions past the clock are searched)
    predates the seal. Twice: A's claim the first lookup of its transaction, then one after an earlier
    lookup (the record table locked already, so no lock of A's claim processes the seal's invalidation)."""
    db = "idem_seal_moved"
    with _fresh_database(cluster, db):
        with cluster.connect(dbname=db) as a, cluster.connect(dbname=db) as b, cluster.connect(dbname=db) as sealer:
            assert a.execute("SELECT idem_once('warm', 'seal')").fetchone()[0] is True
            for key, earlier_call in (("k1", False), ("k2", True)):
                assert a.execute("SELECT idem_once('warm', 'seal')").fetchone()[0] is False  # A's cache filled
                a.execute("BEGIN")
                start = a.execute("SELECT now()").fetchone()[0]
                if earlier_call:
                    assert a.execute("SELECT idem_once('warm', 'seal')").fetchone()[0] is False
                target = sealer.execute(  # where a row created at A's start goes now
                    "SELECT p.partition::oid FROM idempotency.partitions p WHERE p.range_to > %s AND NOT EXISTS"
                    " (SELECT FROM idempotency.sealed s WHERE s.partition = p.partition::oid) ORDER BY p.range_to LIMIT 1",
                    (start,)).fetchone()[0]
                assert sealer.execute("SELECT idempotency.seal_partition(%s)", (target,)).fetchone()[0] is True
                assert b.execute("SELECT idem_once(%s, 'seal')", (key,)).fetchone()[0] is True
                moved = b.execute("SELECT tableoid <> %s FROM idempotency.records WHERE key = %s", (target, key)).fetchone()[0]
                again = a.execute("SELECT idem_once(%s, 'seal')", (key,)).fetchone()[0]
                a.execute("COMMIT")
                rows = b.execute("SELECT count(*) FROM idempotency.records WHERE key = %s", (key,)).fetchone()[0]
                assert moved, "B's row was not moved past the sealed partition"
                assert (again, rows) == (False, 1), f"A claimed {key} after B (earlier call: {earlier_call}): {rows} rows"


def _wait_until(check, what):
    """Polls `check` until it is true: the sessions' states, never a guessed delay."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.02)


@pytest.mark.skipif(not (os.environ.get("IDEM_GDB_TESTS") and shutil.which("gdb")),
                    reason="opt-in (IDEM_GDB_TESTS=1, and gdb): holds a backend in gdb")
def test_a_seal_still_committing_is_waited_for(cluster):
    """A seal is visible to other sessions before its backend sends its invalidation (PostgreSQL sends it
    after the commit, before releasing the locks). Held there by gdb (at AtEOXact_Inval): B, a new session,
    learns of the seal from its read and moves its key past the sealed partition; A, whose cache predates
    the seal, then claims the same key and must find it, though no invalidation tells it of the seal yet. B
    waits for the seal's locks before it writes, so A's lookup comes after the invalidation."""
    with _fresh_database(cluster, "idem_seal_window"), cluster.connect(dbname="idem_seal_window") as a, \
            cluster.connect(dbname="idem_seal_window") as sealer, cluster.connect(dbname="idem_seal_window") as b, \
            cluster.connect(dbname="idem_seal_window") as watch:
        assert a.execute("SELECT idem_once('warm', 'seal')").fetchone()[0] is True
        a.execute("BEGIN")
        start = a.execute("SELECT now()").fetchone()[0]
        target = sealer.execute("SELECT partition::oid FROM idempotency.partitions WHERE range_from <= %s AND"
                                " range_to > %s", (start, start)).fetchone()[0]
        a_pid, b_pid, s_pid = (c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (a, b, sealer))
        answers = {}

        def call(name, conn, sql):
            answers[name] = conn.execute(f"SELECT {sql}").fetchone()[0]

        def waits(pid):
            return watch.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s AND"
                                 " wait_event_type = 'Lock')", (pid,)).fetchone()[0]

        threads = [threading.Thread(target=call, args=step) for step in
                   (("seal", sealer, f"idempotency.seal_partition({target})"),
                    ("b", b, "idem_once('k', 'seal')"), ("a", a, "idem_once('k', 'seal')"))]
        gdb = subprocess.Popen(["gdb", "-q", "-nx", "-p", str(s_pid), "-ex", "break AtEOXact_Inval", "-ex", "continue"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            if not any(line.startswith("Continuing.") for line in gdb.stdout):
                pytest.fail("gdb did not attach to the sealing backend")
            threads[0].start()
            # The seal committed (visible to others), its backend held before its invalidation is sent.
            _wait_until(lambda: watch.execute("SELECT EXISTS (SELECT FROM idempotency.sealed)").fetchone()[0],
                        "the seal's commit")
            threads[1].start()
            # B waits for the seal's locks (without them, it moves its key and commits) ...
            _wait_until(lambda: "b" in answers or waits(b_pid), "B done or waiting")
            threads[2].start()
            # ... and A for B's key lock (or, had it missed B's row, for the sealed partition's lock).
            _wait_until(lambda: "a" in answers or waits(a_pid), "A done or waiting")
        finally:
            gdb.communicate("detach\nquit\n", timeout=60)
        for t in threads:
            t.join()
        a.execute("COMMIT")
        rows = b.execute("SELECT count(*) FROM idempotency.records WHERE key = 'k'").fetchone()[0]
        assert (answers["seal"], answers["b"]) == (True, True)
        assert (answers["a"], rows) == (False, 1), f"A claimed the key B had claimed: {rows} rows"
