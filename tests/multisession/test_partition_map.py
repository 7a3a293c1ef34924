"""The partition map changing between two calls of one transaction.

A backend remembers what its calls learned of the partitions (which leaves a lookup searches, where new
rows go, which partitions are sealed, the indexes an insert fills) until a relcache invalidation of the
record table (or of the partition, for its indexes). Each test
changes the map between two calls of one transaction (or of one statement) and checks that the second
call searches and writes what is there now: a remembered map that outlived the change shows as a key
answered new twice (a partition it no longer searches), or as "could not open relation" (one that is gone).

Its own small cluster, with max_prepared_transactions above 0 for PREPARE TRANSACTION.
How each test fails without the invalidation it covers: with `pg::leaves::forget_walk` left out of the
callbacks in `storage::init` (src/storage/mod.rs), the drop, subtransaction, prepare and function tests fail
(a dropped partition is opened: XX000; a partition back from a rollback is not searched: a key answered new
twice); with `lifecycle::partitions::forget_coverage` left out, the seal test fails (the second key's row goes
into the sealed partition); with `pg::indexes::forget` left out, the index test fails (a row missing from
the index made between the calls, then the dropped index opened).
"""
import psycopg
import pytest

import pgtools

pytestmark = pytest.mark.native_only("the native extension's remembered partition map (the SQL edition reads the catalog "
                                     "at each call)")

DB = "idem_map"
SERVER = pgtools.Cluster(pgtools.port("partitionmap"), ["shared_preload_libraries = 'idempotency'",
                                                       "idempotency.database = ''",
                                                       "max_prepared_transactions = 2"])
# A past partition, made by the test's premake as of 9 days ago, and a key already in it.
PAST = "now() - interval '9 days'"
OLD_KEY = "old"


@pytest.fixture(scope="module")
def server():
    SERVER.init()
    try:
        SERVER.start()
        with SERVER.connect() as admin:
            admin.execute(f"CREATE DATABASE {DB}")
        yield SERVER
    finally:
        SERVER.stop()


@pytest.fixture
def conn(server):
    """A session on a database with the extension, today's partitions, and a past partition holding OLD_KEY."""
    with server.connect(dbname=DB) as c:
        c.execute("DROP EXTENSION IF EXISTS idempotency CASCADE")
        pgtools.install_extension(c)
        c.execute("SELECT FROM idem_maintenance()")
        c.execute(f"SELECT idempotency.premake_partitions({PAST})")
        c.execute("INSERT INTO idempotency.records (scope, key, status, created_at) "
                  f"VALUES ('default', %s, 'completed', {PAST})", (OLD_KEY,))
        yield c


def once(c, key):
    return c.execute("SELECT idem_once(%s)", (key,)).fetchone()[0]


def partition_at(c, when):
    """The partition holding the time `when` (SQL), by name."""
    return c.execute(f"SELECT partition::text FROM idempotency.partitions WHERE range_from <= {when} AND range_to > {when}"
                     ).fetchone()[0]


def test_drop_between_calls(conn):
    conn.execute("BEGIN")
    assert once(conn, "d1") is True
    assert once(conn, OLD_KEY) is False  # the past partition is searched
    conn.execute(f"DROP TABLE {partition_at(conn, PAST)}")
    # The lookup searches the partitions that are left (not the dropped one: XX000 "could not open relation").
    assert once(conn, "d2") is True
    assert once(conn, "d1") is False
    assert once(conn, OLD_KEY) is True  # its record went with the partition
    conn.execute("COMMIT")


def test_seal_between_calls(conn):
    today = partition_at(conn, "now()")
    conn.execute("BEGIN")
    assert once(conn, "s1") is True
    assert conn.execute("SELECT idempotency.seal_partition(%s::regclass::oid)", (today,)).fetchone()[0] is True
    # The next key's row goes to the next partition: a sealed partition takes no new row.
    assert once(conn, "s2") is True
    assert once(conn, "s1") is False and once(conn, "s2") is False
    conn.execute("COMMIT")
    assert conn.execute(f"SELECT array_agg(key ORDER BY key) FROM {today}").fetchone()[0] == ["s1"]


def test_rolled_back_subtransaction(conn):
    past = partition_at(conn, PAST)
    conn.execute("BEGIN")
    assert once(conn, "r1") is True
    conn.execute("SAVEPOINT s")
    conn.execute(f"DROP TABLE {past}")
    assert once(conn, OLD_KEY) is True  # the lookup learns the map without the dropped partition
    conn.execute("ROLLBACK TO SAVEPOINT s")
    # The partition is back with its key: the map learned inside the savepoint must be gone with it.
    assert once(conn, OLD_KEY) is False
    assert once(conn, "r1") is False
    conn.execute("COMMIT")


def test_prepare_transaction(conn, server):
    """A partition made in a transaction that is then prepared is not this session's until it commits."""
    conn.execute("BEGIN")
    # A past partition the map did not have: 20 days ago.
    assert conn.execute("SELECT idempotency.premake_partitions(now() - interval '20 days')").fetchone()[0] > 0
    assert once(conn, "p1") is True  # the session learns the map with it
    assert once(conn, "p2") is True
    conn.execute("PREPARE TRANSACTION 'idem_map'")
    try:
        # The prepared transaction keeps the new partition locked (ACCESS EXCLUSIVE): a map that still lists
        # it would open it and wait (55P03 here). Its keys p1, p2 are not committed yet.
        conn.execute("SET lock_timeout = '2s'")
        assert once(conn, "p3") is True
        conn.execute("RESET lock_timeout")
    finally:
        conn.execute("COMMIT PREPARED 'idem_map'")
    assert once(conn, "p1") is False and once(conn, "p2") is False and once(conn, "p3") is False


def test_many_calls_in_one_statement(conn):
    """A function and a cursor: calls of one statement, the partition map changed between them."""
    conn.execute("""
        CREATE FUNCTION pg_temp.around_drop(part text) RETURNS boolean[] LANGUAGE plpgsql AS $$
        DECLARE answers boolean[];
        BEGIN
            answers := answers || idem_once('f1') || idem_once('old');
            EXECUTE format('DROP TABLE %s', part);
            answers := answers || idem_once('f2') || idem_once('f1') || idem_once('old');
            RETURN answers;
        END $$""")
    past = partition_at(conn, PAST)
    assert conn.execute("SELECT pg_temp.around_drop(%s)", (past,)).fetchone()[0] == [True, False, True, False, True]
    # A cursor whose rows each call idem_once, fetched around a partition made and rolled back.
    conn.execute("BEGIN")
    conn.execute("DECLARE c CURSOR FOR SELECT idem_once('c' || g) FROM generate_series(1, 3) g")
    assert conn.execute("FETCH 1 FROM c").fetchone()[0] is True
    conn.execute("SAVEPOINT s")
    conn.execute(f"SELECT idempotency.premake_partitions({PAST})")  # the dropped partition made again
    conn.execute("INSERT INTO idempotency.records (scope, key, status, created_at) "
                 f"VALUES ('default', 'c2', 'completed', {PAST})")
    assert conn.execute("FETCH 1 FROM c").fetchone()[0] is False  # c2, in the new partition
    conn.execute("ROLLBACK TO SAVEPOINT s")
    # The partition is gone again (not opened: XX000), and so is c2's record.
    assert conn.execute("FETCH 1 FROM c").fetchone()[0] is True
    assert once(conn, "c2") is True
    conn.execute("COMMIT")


def test_index_between_calls(conn):
    """An index made and dropped on the partition new rows go to, between two calls."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    today = partition_at(conn, "now()")
    check = ("SELECT bt_index_check(i.indexrelid, true) FROM pg_index i "
             "WHERE i.indrelid = %s::regclass AND i.indisready")
    conn.execute("BEGIN")
    assert once(conn, "i1") is True
    conn.execute(f"CREATE INDEX map_extra ON {today} (updated_at, key)")
    assert once(conn, "i2") is True
    conn.execute(check, (today,))  # i2 is in the new index too (amcheck: every row has its entries)
    conn.execute("DROP INDEX idempotency.map_extra")
    assert once(conn, "i3") is True  # the dropped index is not opened (XX000)
    conn.execute("COMMIT")
    # A claim's row has a lease: it goes into the partial index on expires_at too.
    assert conn.execute("SELECT outcome FROM idem_claim('i4')").fetchone()[0] == "claimed"
    assert conn.execute(f"SELECT count(*) FROM {today} WHERE expires_at IS NOT NULL").fetchone()[0] == 1
    conn.execute(check, (today,))
