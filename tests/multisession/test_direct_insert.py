"""New records are inserted without the executor (src/storage/direct.rs): every index of the partition
gets its entry, a DBA's unique index still raises 23505, and a partition with triggers, CHECK
constraints or a column a DBA added gets the SPI INSERT, which fires, checks and fills them. Each test
works in a database of its own, so that its triggers and indexes on the current partition reach no other
test.

The insert and the lookup before it call PostgreSQL in sections under one guard each
(src/storage/pg/unguarded.rs): an ERROR raised inside one (a DBA's unique index, a lock timeout) must
reach the client as PostgreSQL raised it, with nothing written.
"""
import threading
import time

import psycopg
import pytest

import pgtools
from idemlib import rust_internals

pytestmark = pytest.mark.native_only("direct heap inserts (src/storage/direct.rs)")


@pytest.fixture
def db(cluster):
    with pgtools.own_database(cluster, "idem_direct") as name:
        yield name


def current_partition(c):
    """The partition that takes today's new rows."""
    return c.execute("""
        SELECT format('%I.%I', n.nspname, k.relname)
          FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid JOIN pg_namespace n ON n.oid = k.relnamespace
         WHERE i.inhparent = 'idempotency.records'::regclass
           AND now() >= (regexp_match(pg_get_expr(k.relpartbound, k.oid), 'FROM \\(''([^'']+)''\\)'))[1]::timestamptz
           AND now() <  (regexp_match(pg_get_expr(k.relpartbound, k.oid), 'TO \\(''([^'']+)''\\)'))[1]::timestamptz
    """).fetchone()[0]


def write_three(c, prefix):
    """One record of each kind of insert: idem_once, claim + complete (one row), a committed claim."""
    assert c.execute("SELECT idem_once(%s)", (f"{prefix}1",)).fetchone()[0] is True
    c.execute("BEGIN")
    c.execute("SELECT idem_claim(%s)", (f"{prefix}2",))
    c.execute("SELECT idem_complete(%s, '{\"ok\": true}')", (f"{prefix}2",))
    c.execute("COMMIT")
    c.execute("BEGIN")
    c.execute("SELECT idem_claim(%s, fingerprint => %s)", (f"{prefix}3", f"fp-{prefix}"))
    c.execute("COMMIT")


def write_batches(c, prefix):
    """Rows written together (one multi-row heap insert per partition, then their index entries):
    idem_once_batch, claim + complete batches in one transaction, and a claim batch committed pending."""
    once = [f"{prefix}o{i}" for i in range(300)]
    assert c.execute("SELECT count(*) FROM idem_once_batch(%s)", (once,)).fetchone()[0] == 300
    done = [f"{prefix}c{i}" for i in range(300)]
    c.execute("BEGIN")
    c.execute("SELECT count(*) FROM idem_claim_batch(%s)", (done,))
    assert c.execute("SELECT idem_complete_batch(%s)", (done,)).fetchone()[0] == 300
    c.execute("COMMIT")
    c.execute("BEGIN")
    c.execute("SELECT count(*) FROM idem_claim_batch(%s)", ([f"{prefix}p{i}" for i in range(40)],))
    c.execute("COMMIT")


def test_every_index_of_the_partition_gets_the_new_rows(cluster, db, report):
    with cluster.connect(dbname=db) as c:
        part = current_partition(c)
        c.execute(f"CREATE INDEX direct_lower_key ON {part} (lower(key)) WHERE status = 'completed'")
        c.execute(f"CREATE INDEX direct_fingerprint ON {part} (fingerprint)")
        write_three(c, "K")
        write_batches(c, "B")
        # amcheck: every heap tuple of the partition has its entry in every btree index.
        c.execute("CREATE EXTENSION amcheck")
        checked = c.execute("""
            SELECT count(bt_index_check(i.indexrelid, heapallindexed => true))
              FROM pg_index i WHERE i.indrelid = %s::regclass
        """, (part,)).fetchone()[0]
        assert checked == 4, f"expected 4 indexes on {part}, checked {checked}"
        c.execute("SET enable_seqscan = off")
        c.execute("SET enable_bitmapscan = off")
        got = c.execute(f"SELECT key FROM {part} WHERE lower(key) IN ('k1', 'k2', 'k3') AND status = 'completed' "
                        "ORDER BY key").fetchall()
        assert got == [("K1",), ("K2",)], got
        plan = "\n".join(r[0] for r in c.execute(
            f"EXPLAIN SELECT key FROM {part} WHERE lower(key) = 'k1' AND status = 'completed'").fetchall())
        assert "direct_lower_key" in plan, plan
        assert c.execute(f"SELECT key FROM {part} WHERE fingerprint = 'fp-K'").fetchall() == [("K3",)]
        # The batches' rows through the expression index (completed ones only) and the record's own.
        assert c.execute(f"SELECT count(*) FROM {part} WHERE lower(key) LIKE 'b%%' AND lower(key) >= 'b' "
                         "AND lower(key) < 'c' AND status = 'completed'").fetchone()[0] == 600
        assert c.execute("SELECT count(*) FROM idem_claim_batch(%s) WHERE outcome = 'in_progress'",
                         ([f"Bp{i}" for i in range(40)],)).fetchone()[0] == 40
        report(f"{checked} indexes of {part} verified with bt_index_check(heapallindexed)")


def assert_clean_failure(c, e, keys=()):
    """After an ERROR raised inside a call: no Rust in any field, the session answers once its transaction
    is rolled back, and none of `keys` was written."""
    assert not rust_internals(e), f"the error carries Rust internals: {rust_internals(e)}"
    c.execute("ROLLBACK")
    assert c.execute("SELECT 1").fetchone()[0] == 1
    if keys:
        assert c.execute("SELECT count(*) FROM idempotency.records WHERE key = ANY(%s)", (list(keys),)).fetchone()[0] == 0


def test_a_unique_index_of_a_dba_raises_its_own_error(cluster, db, report):
    """23505 from the index inserts of each kind of write: a claim written at COMMIT, idem_once, and a
    batch (one multi-row heap insert, then its index entries). The partition has no trigger, CHECK or
    column of a DBA's, so these are direct inserts, whose index entries are made inside a section."""
    with cluster.connect(dbname=db) as c:
        part = current_partition(c)
        c.execute(f"CREATE UNIQUE INDEX direct_unique_fp ON {part} (fingerprint)")
        c.execute(f"CREATE UNIQUE INDEX direct_unique_once ON {part} (status) WHERE key LIKE 'once-%'")
        c.execute("BEGIN")
        c.execute("SELECT idem_claim('u1', fingerprint => 'same')")
        c.execute("COMMIT")
        c.execute("BEGIN")
        c.execute("SELECT idem_claim('u2', fingerprint => 'same')")
        with pytest.raises(psycopg.errors.UniqueViolation) as e:
            c.execute("COMMIT")
        assert "direct_unique_fp" in str(e.value)
        assert_clean_failure(c, e.value, ["u2"])
        assert c.execute("SELECT idem_once('once-1')").fetchone()[0] is True
        for call, keys in (("SELECT idem_once('once-2')", ["once-2"]),
                           ("SELECT count(*) FROM idem_once_batch(ARRAY['once-3', 'once-4'])", ["once-3", "once-4"])):
            c.execute("BEGIN")
            with pytest.raises(psycopg.errors.UniqueViolation) as e:
                c.execute(call)
            assert "direct_unique_once" in str(e.value), e.value
            assert_clean_failure(c, e.value, keys)
        assert c.execute("SELECT idem_once('other')").fetchone()[0] is True
    report("23505 from a claim at COMMIT, idem_once and idem_once_batch: clean, nothing written")


def test_a_lock_timeout_in_the_lookup_is_raised_as_postgres_raises_it(cluster, db, report):
    """lock_timeout fires while a call waits for the record table's lock, which the lookup takes in its
    first section (a DBA holds the table in ACCESS EXCLUSIVE mode); the call then works once it is free."""
    with cluster.connect(dbname=db) as c, cluster.connect(dbname=db) as dba:
        assert c.execute("SELECT idem_once('warm')").fetchone()[0] is True   # the backend's caches made
        dba.execute("BEGIN")
        dba.execute("LOCK TABLE idempotency.records IN ACCESS EXCLUSIVE MODE")
        c.execute("SET lock_timeout = '300ms'")
        c.execute("BEGIN")
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable) as e:
            c.execute("SELECT idem_once('blocked')")
        elapsed = time.monotonic() - started
        assert e.value.diag.message_primary == "canceling statement due to lock timeout", e.value.diag.message_primary
        assert_clean_failure(c, e.value)   # (the table is still locked: the answer below shows nothing was written)
        c.execute("SET lock_timeout = '60s'")   # (a bound, never reached: the table is freed below)
        waiter = threading.Thread(target=lambda: (time.sleep(0.2), dba.execute("COMMIT")))
        waiter.start()
        assert c.execute("SELECT idem_once('blocked')").fetchone()[0] is True
        waiter.join()
        assert c.execute("SELECT idem_once('blocked')").fetchone()[0] is False
    report(f"55P03 after {elapsed:.2f}s, clean; the key written once the table was free")


def test_triggers_and_check_constraints_get_the_insert_statement(cluster, db, report):
    with cluster.connect(dbname=db) as c, cluster.connect(dbname=db) as dba:
        part = current_partition(c)
        write_three(c, "a")  # the direct path, remembered for this partition
        dba.execute("CREATE TABLE audit (key text, status text)")
        dba.execute("""
            CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN INSERT INTO public.audit VALUES (NEW.key, NEW.status); RETURN NEW; END $$""")
        dba.execute(f"CREATE TRIGGER audit_row AFTER INSERT ON {part} FOR EACH ROW EXECUTE FUNCTION audit_row()")
        write_three(c, "b")
        assert c.execute("SELECT key, status FROM audit ORDER BY key").fetchall() == \
            [("b1", "completed"), ("b2", "completed"), ("b3", "pending")]

        dba.execute(f"ALTER TABLE {part} ADD CONSTRAINT no_forbidden CHECK (key <> 'forbidden')")
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute("SELECT idem_once('forbidden')")
        c.execute("BEGIN")
        c.execute("SELECT idem_claim('forbidden')")
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute("SELECT idem_complete('forbidden')")
        c.execute("ROLLBACK")
        assert c.execute("SELECT count(*) FROM idempotency.records WHERE key = 'forbidden'").fetchone()[0] == 0

        # Both gone: back to the direct path, which fires nothing.
        dba.execute(f"DROP TRIGGER audit_row ON {part}")
        dba.execute(f"ALTER TABLE {part} DROP CONSTRAINT no_forbidden")
        write_three(c, "c")
        assert c.execute("SELECT count(*) FROM audit").fetchone()[0] == 3
        assert c.execute("SELECT count(*) FROM idempotency.records WHERE key IN ('c1', 'c2', 'c3')").fetchone()[0] == 3
        report("trigger fired for 3 of 3 inserts while it existed, CHECK raised 23514 for idem_once and idem_complete")


def test_a_column_added_by_a_dba_gets_its_default(cluster, db):
    with cluster.connect(dbname=db) as c, cluster.connect(dbname=db) as dba:
        write_three(c, "before")  # the direct path, remembered for this partition
        dba.execute("ALTER TABLE idempotency.records ADD COLUMN tenant text DEFAULT 'acme'")
        write_three(c, "with")
        got = c.execute("SELECT key, tenant FROM idempotency.records WHERE key LIKE 'with%' ORDER BY key").fetchall()
        assert got == [("with1", "acme"), ("with2", "acme"), ("with3", "acme")], got
        dba.execute("ALTER TABLE idempotency.records DROP COLUMN tenant")
        write_three(c, "after")
        assert c.execute("SELECT count(*) FROM idempotency.records WHERE key LIKE 'after%'").fetchone()[0] == 3
