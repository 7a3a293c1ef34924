"""Keys of sealed partitions are found again, whichever way a call looks for them.

Three past daily partitions hold completed keys (written there as benches/retained.py loads a week); a
maintenance round seals them. Every one of those keys must then answer as seen before through idem_once,
idem_claim, idem_once_batch and idem_claim_batch, and new keys as new: before the partitions' key filters
are written and after. The SQL edition writes its filters (idempotency.sealed_keys) in the round after the
seal and reads a partition through its index until then; the native extension writes them with the seal.
A filter that missed a key, or hashed it otherwise than the lookup, shows here as a sealed key answered new.
The two tests share one database, in order: the second drops the oldest partition.
"""
import pytest

import pgtools

DB = "idem_sealed_keys"
PER_DAY = 600
DAYS = 3


@pytest.fixture(scope="module")
def db(cluster):
    with cluster.connect(dbname="postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    with cluster.connect(dbname=DB) as conn:
        pgtools.install_extension(conn)
        for k in range(DAYS, 0, -1):
            conn.execute("SELECT idempotency.premake_partitions(now() - interval '1 day' * %s)", (k,))
        # Keys k0 .. k(DAYS * PER_DAY - 1), completed, in the past days' partitions.
        conn.execute("""
            INSERT INTO idempotency.records (scope, key, status, attempts, created_at, updated_at)
            SELECT 'default', 'k' || g, 'completed', 1,
                   date_trunc('day', now()) - interval '1 day' * (1 + g %% %s) + interval '1 second' * (g %% 80000), now()
              FROM generate_series(0, %s) g""", (DAYS, DAYS * PER_DAY - 1))
    yield DB
    with cluster.connect(dbname="postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def _answers(conn, keys):
    """What each way of calling says of the keys, each in a transaction rolled back: the keys answered new."""
    new = {}
    conn.execute("BEGIN")
    new["idem_once"] = [r[0] for r in conn.execute(
        "SELECT k FROM unnest(%s::text[]) k WHERE idem_once(k)", (keys,)).fetchall()]
    conn.execute("ROLLBACK")
    conn.execute("BEGIN")
    new["idem_claim"] = [r[0] for r in conn.execute(
        "SELECT k FROM unnest(%s::text[]) k, LATERAL idem_claim(k) c WHERE c.outcome = 'claimed'", (keys,)).fetchall()]
    conn.execute("ROLLBACK")
    conn.execute("BEGIN")
    new["idem_once_batch"] = [r[0] for r in conn.execute("SELECT idem_once_batch(%s)", (keys,)).fetchall()]
    conn.execute("ROLLBACK")
    conn.execute("BEGIN")
    new["idem_claim_batch"] = [r[0] for r in conn.execute(
        "SELECT key FROM idem_claim_batch(%s) WHERE outcome = 'claimed'", (keys,)).fetchall()]
    conn.execute("ROLLBACK")
    return new


def _check(conn, stage):
    old = [f"k{g}" for g in range(DAYS * PER_DAY)]
    for batch in range(0, len(old), 600):
        keys = old[batch:batch + 600]
        for how, new in _answers(conn, keys).items():
            assert new == [], f"{stage}: {how} answered {len(new)} sealed keys as new, e.g. {new[:3]}"
    fresh = [f"new-{stage}-{g}" for g in range(100)]
    for how, new in _answers(conn, fresh).items():
        assert sorted(new) == sorted(fresh), f"{stage}: {how} answered {len(fresh) - len(new)} new keys as seen"


def test_sealed_keys_are_found_before_and_after_their_filters(cluster, db):
    with cluster.connect(dbname=db) as conn:
        # The rounds as of the start of the day the keys were written for: a midnight during the test seals
        # nothing more.
        as_of = conn.execute("SELECT date_trunc('day', max(created_at)) + interval '1 day' FROM idempotency.records"
                             ).fetchone()[0]
        conn.execute("SELECT FROM idem_maintenance(%s)", (as_of,))
        sealed = conn.execute("SELECT count(*) FROM idempotency.sealed").fetchone()[0]
        assert sealed == DAYS, f"{sealed} partitions sealed, not the {DAYS} past ones (as of {as_of})"
        if pgtools.sql_edition():
            filtered = conn.execute("SELECT count(filtered_keys) FROM idempotency.sealed").fetchone()[0]
            assert filtered == 0, "the round that sealed the partitions wrote no filter (its writers would wait)"
            _check(conn, "sealed")
            conn.execute("SELECT FROM idem_maintenance(%s)", (as_of,))
            rows = conn.execute("""
                SELECT s.filtered_keys, (SELECT count(*) FROM idempotency.records r WHERE r.tableoid = s.partition)
                  FROM idempotency.sealed s""").fetchall()
            assert len(rows) == DAYS and all(f == n == PER_DAY for f, n in rows), rows
            st = conn.execute("SELECT (s).filtered, (s).unfiltered_from, (s).probe_before FROM "
                              "(SELECT idempotency.cached_state() AS s) x").fetchone()
            assert st == (True, None, True), f"the calls' state after the filters: {st}"
        _check(conn, "filtered")


@pytest.mark.skipif(not pgtools.sql_edition(), reason="the SQL edition's filter table")
def test_a_bucket_past_a_rows_prints_takes_more_rows(cluster, db):
    """A bucket of a partition with more prints than a row holds (256 in production: thousands of keys in a
    bucket, from a partition of tens of millions of keys or from keys chosen to collide) spreads over rows,
    each a B-tree entry of the index that answers the calls. Here a row holds one print: every key is still
    found, and after a VACUUM (autovacuum's, in production) a call reads the bucket from the index alone."""
    with cluster.connect(dbname=db) as conn:
        with pytest.raises(Exception) as bad:
            conn.execute("SELECT idempotency.filter_sealed(partition, 0) FROM idempotency.sealed LIMIT 1")
        assert getattr(bad.value, "sqlstate", None) == "22023", bad.value
        conn.execute("UPDATE idempotency.sealed SET filtered_keys = NULL")
        written = conn.execute("SELECT idempotency.filter_sealed(partition, 1) FROM idempotency.sealed").fetchall()
        assert written == [(PER_DAY,)] * DAYS, written
        rows, widest, chunks = conn.execute(
            "SELECT count(*), max(cardinality(prints)), max(chunk) FROM idempotency.sealed_keys").fetchone()
        assert (rows, widest) == (DAYS * PER_DAY, 1), (rows, widest)
        assert chunks >= 1, "no bucket of a partition spread over rows: the test does not test that"
        _check(conn, "one print a row")
        conn.execute("VACUUM (ANALYZE) idempotency.sealed_keys")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT EXISTS (SELECT FROM idempotency.sealed_key_matches(idempotency.key_hash('k1', 'default')))"))
        assert "Index Only Scan using sealed_keys_pkey" in plan, plan


@pytest.mark.skipif(not pgtools.sql_edition(), reason="the SQL edition's filter table")
def test_a_dropped_partition_takes_its_filter_along(cluster, db):
    with cluster.connect(dbname=db) as conn:
        as_of = conn.execute("SELECT date_trunc('day', max(created_at)) + interval '1 day' FROM idempotency.records"
                             ).fetchone()[0]
        conn.execute("SELECT FROM idem_maintenance(%s)", (as_of,))
        conn.execute("SELECT FROM idem_maintenance(%s)", (as_of,))
        oldest = conn.execute("SELECT partition FROM idempotency.sealed ORDER BY range_from LIMIT 1").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM idempotency.sealed_keys WHERE partition = %s::regclass",
                            (oldest,)).fetchone()[0] > 0
        # A retention of one day and a half: the oldest of the three past days goes.
        conn.execute("UPDATE idempotency.settings SET retention = '36 hours'")
        conn.execute("SELECT FROM idem_maintenance(%s)", (as_of,))
        assert conn.execute("SELECT to_regclass(%s) IS NULL", (oldest,)).fetchone()[0], "the oldest partition is dropped"
        left = conn.execute("SELECT count(*) FROM idempotency.sealed_keys f WHERE NOT EXISTS"
                            " (SELECT FROM idempotency.sealed s WHERE s.partition = f.partition)").fetchone()[0]
        assert left == 0, f"{left} filter rows of a dropped partition are left"
        st = conn.execute("SELECT (s).filtered, (s).unfiltered_from FROM (SELECT idempotency.cached_state() AS s) x").fetchone()
        assert st == (True, None), st
