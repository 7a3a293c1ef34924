"""A backend copies a sealed partition's filter a chunk at a time, at the first lookup that reads one of the
chunk's blocks (src/storage/pg/sealed.rs, `BitsCopy`). A partition of 20,000 keys has a filter of five chunks
(248 blocks of 32 bytes each): every one of its keys must be found again from a new backend's copies, whichever
chunk it falls in, and a chunk that does not read as
`idempotency.sealed` lists it must make the lookups probe the partition's index, never answer "new". The same keys are
found by a backend that reads the filters in shared buffers, without copies.
"""
import uuid

import pytest

import pgtools

pytestmark = pytest.mark.native_only("the native extension's filter copies (src/storage/pg/sealed.rs)")

KEYS = 20_000
BATCH = 1_000


@pytest.fixture(scope="module")
def db(cluster):
    with pgtools.own_database(cluster, "idem_chunks") as name:
        yield sealed_day(cluster, name)


def sealed_day(cluster, name):
    """Yesterday's partition holding KEYS completed keys, sealed with its filter."""
    with cluster.connect(dbname=name) as c:
        c.execute("SELECT idempotency.premake_partitions(now() - interval '1 day')")
        c.execute("""
            INSERT INTO idempotency.records (scope, key, status, attempts, created_at, updated_at)
            SELECT 'default', 'k' || g, 'completed', 1,
                   date_trunc('day', now()) - interval '1 day' + interval '1 second' * (g %% 80000), now()
              FROM generate_series(0, %s) g""", (KEYS - 1,))
        as_of = c.execute("SELECT date_trunc('day', max(created_at)) + interval '1 day' FROM idempotency.records"
                          ).fetchone()[0]
        c.execute("SELECT FROM idem_maintenance(%s)", (as_of,))
        blocks, chunks = c.execute("SELECT blocks, cardinality(chunks) FROM idempotency.sealed").fetchone()
        assert chunks >= 5 and blocks > 4 * 248, (blocks, chunks)
    return name


def new_keys(c, keys):
    """The keys idem_once_batch answers new, in a transaction rolled back."""
    c.execute("BEGIN")
    new = [r[0] for r in c.execute("SELECT idem_once_batch(%s)", (keys,)).fetchall()]
    c.execute("ROLLBACK")
    return new


def check_all(c):
    old = [f"k{g}" for g in range(KEYS)]
    for start in range(0, KEYS, BATCH):
        new = new_keys(c, old[start:start + BATCH])
        assert new == [], f"{len(new)} sealed keys answered new, e.g. {new[:3]}"
    fresh = [f"fresh-{uuid.uuid4().hex[:8]}-{g}" for g in range(200)]
    assert sorted(new_keys(c, fresh)) == sorted(fresh)


def test_every_key_is_found_from_chunks_copied_one_at_a_time(cluster, db):
    with cluster.connect(dbname=db) as c:  # a new backend: no copy yet
        assert c.execute("SELECT idem_once('k7')").fetchone()[0] is False
        check_all(c)


def test_the_same_answers_read_in_shared_buffers(cluster, db):
    with cluster.connect(dbname=db) as c:  # a new backend, set before it reads any filter: no copies at all
        c.execute("SET idempotency.filter_cache = 0")
        check_all(c)


def test_a_chunk_not_as_listed_makes_lookups_probe_the_index(cluster, db):
    swap = "UPDATE idempotency.sealed SET chunks[1:2] = ARRAY[chunks[2], chunks[1]]"
    with cluster.connect(dbname=db) as c:
        # The listed places of the first two chunks swapped: each now names the other chunk's row.
        c.execute(swap)
        try:
            with cluster.connect(dbname=db) as other:  # a new backend, that reads the listing anew
                check_all(other)
        finally:
            c.execute(swap)
