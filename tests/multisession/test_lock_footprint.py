"""Batches of any size under PostgreSQL's default lock-table size, and exactly-once while they overlap.

Each key a transaction writes holds one entry of the shared lock table while the transaction keeps its
lock, and the table has room for about max_locks_per_transaction (64) entries per connection. Before
0.6.0 a batch kept one lock per key until it committed: 24 consumers each holding a 1,000-key batch
filled the table, their claims failed with "out of shared memory", and so did new connections of
unrelated clients. A transaction now keeps at most idempotency.key_locks_per_transaction of them (by
default half of max_locks_per_transaction); past that it holds further keys in a shared table of the
extension's own (idempotency.held_keys), or, when that table is full, its uncommitted rows keep other
writers out.

Its own cluster, at the defaults the issue names: max_connections = 100, max_locks_per_transaction = 64.
Every test runs three times: with the table of held keys (the default), with it off (held_keys = 0), where
every key past the budget is kept by its uncommitted row, and with a table that fills up (both at once).
"""
import random
import threading
import time

import psycopg
import pytest

import pgtools

PORT = pgtools.port("lockfootprint")
DB = "idem_locks"
# The table of held keys at its default size; off; and so small (256 keys, 4 in each of its 64 shards) that it
# fills up, and the keys past it are kept by their rows while the others are held.
MODES = {"held": [], "rows": ["idempotency.held_keys = 0"], "full": ["idempotency.held_keys = 256"]}
SERVER = pgtools.Cluster(PORT, [], max_connections=100)
CONSUMERS = 32
BATCH = 1000
# The key locks one backend holds (objsubid is the lock namespace of keylock.rs, 0x4944 = 18756).
KEY_LOCKS = ("SELECT pid, count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 18756 "
             "GROUP BY pid ORDER BY 2 DESC")


def connect(**kw):
    return SERVER.connect(dbname=DB, **kw)


# The SQL edition has neither the key-lock budget nor the table of held keys: its claims keep keys by their
# uncommitted rows, as "rows" does.
@pytest.fixture(scope="module", params=[
    m if m == "rows" else pytest.param(m, marks=pytest.mark.native_only("the key-lock budget and the table of held keys"))
    for m in sorted(MODES)])
def mode(request):
    return request.param


@pytest.fixture(scope="module")
def db(mode):
    SERVER.conf = ["shared_preload_libraries = 'idempotency'", "idempotency.database = 'postgres'",
                   *MODES[mode]]
    SERVER.init()
    try:
        SERVER.start()
        with SERVER.connect() as admin:
            admin.execute(f"CREATE DATABASE {DB}")
        with connect() as conn:
            pgtools.install_extension(conn)
            conn.execute("SELECT FROM idem_maintenance()")
            conn.execute("CREATE TABLE effects (key text NOT NULL, worker int NOT NULL)")
            yield conn
    finally:
        SERVER.stop()


def test_defaults_are_the_issues(db):
    settings = dict(db.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                               "('max_connections', 'max_locks_per_transaction', 'max_prepared_transactions', "
                               "'idempotency.key_locks_per_transaction')").fetchall())
    want = {"max_connections": "100", "max_locks_per_transaction": "64",
            "max_prepared_transactions": "0", "idempotency.key_locks_per_transaction": "-1"}
    if pgtools.sql_edition():  # no key-lock budget (a setting of the native library)
        del want["idempotency.key_locks_per_transaction"]
    assert settings == want


# Rows this transaction inserted into the record's partitions so far.
WRITTEN = ("SELECT coalesce(sum(n_tup_ins), 0)::int FROM pg_stat_xact_user_tables "
           "WHERE schemaname = 'idempotency' AND relname LIKE 'records_p%'")


def _hold_batch(worker, holding, release, errors, kind, written):
    keys = [f"w{worker}-{i}" for i in range(BATCH)]
    try:
        with connect() as s:
            s.execute("BEGIN")
            if kind == "claim":
                rows = s.execute("SELECT outcome FROM idem_claim_batch(%s)", (keys,)).fetchall()
                assert [r[0] for r in rows] == ["claimed"] * BATCH
                # Held keys stay unwritten until completed; keys kept by their rows are written at once.
                written.append(s.execute(WRITTEN).fetchone()[0])
            else:
                assert len(s.execute("SELECT idem_once_batch(%s)", (keys,)).fetchall()) == BATCH
            holding.wait()
            release.wait()
            if kind == "claim":
                assert s.execute("SELECT idem_complete_batch(%s)", (keys,)).fetchone()[0] == BATCH
            s.execute("COMMIT")
    except (psycopg.Error, AssertionError, threading.BrokenBarrierError) as e:
        errors.append(f"consumer {worker}: {getattr(e, 'sqlstate', '')} {e}")
        holding.abort()
        release.abort()


def test_32_consumers_hold_1000_key_batches(db, mode, report):
    holding, release = threading.Barrier(CONSUMERS + 1), threading.Barrier(CONSUMERS + 1)
    errors, written = [], []
    threads = [threading.Thread(target=_hold_batch,
                                args=(w, holding, release, errors, ("claim", "once")[w % 2], written))
               for w in range(CONSUMERS)]
    for t in threads:
        t.start()
    try:
        holding.wait(timeout=300)
        # Every batch is open: an unrelated client connects and works, and no backend holds more key
        # locks than its budget.
        with connect() as other:
            assert other.execute("SELECT idem_once('unrelated')").fetchone()[0] is True
            budget = other.execute("SELECT current_setting('max_locks_per_transaction')::int / 2").fetchone()[0]
            held = other.execute(KEY_LOCKS).fetchall()
            total = other.execute("SELECT count(*) FROM pg_locks").fetchone()[0]
        release.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    most = max((n for _, n in held), default=0)
    claimed = CONSUMERS // 2 * BATCH
    report(f"{CONSUMERS} open batches of {BATCH} keys: at most {most} key locks in one backend "
           f"(budget {budget}), {total} rows in pg_locks in all; {sum(written)} of the {claimed} claimed keys "
           f"written before their completion (held_keys: {mode})")
    # Past the budget: every claim held and written once (held), every one written at once (rows), or all but
    # the few the table holds (full: 256 keys for the 32,000 keys of both kinds of batches).
    want = {"held": lambda n: n == 0, "rows": lambda n: n == claimed, "full": lambda n: n >= claimed - 256}[mode]
    assert want(sum(written)), (mode, sum(written))
    assert most <= budget
    done = db.execute("SELECT count(*) FROM idempotency.records WHERE status = 'completed' AND key LIKE 'w%'").fetchone()[0]
    assert done == CONSUMERS * BATCH


def test_a_batch_holds_what_the_table_has_room_for_and_writes_the_rest(db, mode, report):
    """One batch of 400 new keys with no other transaction open (so the table is empty): with room for all,
    none is written before it completes; without the table, all are; with room for 256 (4 in each shard),
    some are held and the rest written. Another session is kept out of every one of them, held or written."""
    keys = [f"f{i}" for i in range(400)]
    with connect() as c, connect() as other:
        c.execute("BEGIN")
        assert [r[0] for r in c.execute("SELECT outcome FROM idem_claim_batch(%s)", (keys,))] == ["claimed"] * 400
        written = c.execute(WRITTEN).fetchone()[0]
        busy = other.execute("SELECT count(*) FROM unnest(%s::text[]) k, LATERAL idem_claim(k, wait => false) c "
                             "WHERE c.outcome = 'in_progress'", (keys,)).fetchone()[0]
        assert c.execute("SELECT idem_complete_batch(%s)", (keys,)).fetchone()[0] == 400
        c.execute("COMMIT")
    report(f"held_keys {mode}: {written} of 400 keys written at the claim, {400 - written} held; "
           f"{busy} of 400 in_progress for another session")
    assert busy == 400
    assert {"held": written == 0, "rows": written == 400, "full": 0 < written < 400}[mode], (mode, written)


def test_reclaim_keeps_a_bounded_number_of_locks(db):
    db.execute("SELECT idem_claim_batch(ARRAY(SELECT 'stuck-' || g FROM generate_series(1, 1000) g), "
               "ttl => interval '1 second')")
    db.execute("BEGIN")
    reclaimed = db.execute("SELECT leases_reclaimed FROM idem_maintenance(now() + interval '2 hours')").fetchone()[0]
    held = db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 18756 "
                      "AND pid = pg_backend_pid()").fetchone()[0]
    db.execute("COMMIT")
    assert reclaimed == 1000
    assert held <= 32
    assert db.execute("SELECT count(*) FROM idempotency.records WHERE key LIKE 'stuck-%'").fetchone()[0] == 0


def _overlapping(worker, rounds, errors):
    rnd = random.Random(worker)
    with connect() as s:
        for _ in range(rounds):
            keys = rnd.sample([f"o{i}" for i in range(300)], 100)
            try:
                s.execute("BEGIN")
                rows = s.execute("SELECT key, token FROM idem_claim_batch(%s) WHERE outcome = 'claimed'", (keys,)).fetchall()
                if rows:
                    mine = [r[0] for r in rows]
                    s.execute("INSERT INTO effects SELECT unnest(%s::text[]), %s", (mine, worker))
                    s.execute("SELECT idem_complete_batch(%s, tokens => %s)", (mine, [r[1] for r in rows]))
                s.execute("ROLLBACK" if rnd.random() < 0.2 else "COMMIT")
            except psycopg.Error as e:
                errors.append(f"worker {worker}: {e.sqlstate} {e}")
                s.execute("ROLLBACK")


def test_overlapping_batches_past_the_budget_apply_each_key_once(db, report):
    errors = []
    threads = [threading.Thread(target=_overlapping, args=(w, 15, errors)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    twice = db.execute("SELECT key, count(*) FROM effects WHERE key LIKE 'o%' GROUP BY key HAVING count(*) > 1").fetchall()
    assert not twice, twice[:5]
    completed = {r[0] for r in db.execute("SELECT key FROM idempotency.records WHERE key LIKE 'o%' AND status = 'completed'")}
    applied = {r[0] for r in db.execute("SELECT key FROM effects WHERE key LIKE 'o%'")}
    report(f"{len(completed)} of 300 keys completed by 8 workers' overlapping 100-key batches, each applied once")
    assert completed == applied
    assert len(completed) > 250


def _round_behind(consumer, query, finish=()):
    """Runs query (a maintenance round) in a session of its own while consumer's transaction is open; then
    runs the statements of finish in that transaction and commits it. Returns whether the round waited for
    the consumer, and the round's first value (an error the round raised is raised here).
    Polled until the round ends or waits for the consumer. A wait for a row, a transaction or an advisory
    lock counts at once: it lasts as long as the consumer's transaction. A wait for a relation lock counts
    only when the same wait is still there after RELATION_WAIT seconds: a seal or a drop waits for a
    partition's writers at most drop_lock_timeout (100 ms), then leaves it for the next round."""
    consumer_pid = consumer.execute("SELECT pg_backend_pid()").fetchone()[0]
    with connect() as m, connect() as watch:
        round_pid = m.execute("SELECT pg_backend_pid()").fetchone()[0]
        out, failed = [], []

        def run():
            try:
                out.append(m.execute(query).fetchone()[0])
            except psycopg.Error as e:
                failed.append(e)
        t = threading.Thread(target=run)
        t.start()
        blocked, relation_wait, since = False, None, None
        while t.is_alive() and not blocked:
            wait = watch.execute(
                "SELECT locktype, relation FROM pg_locks WHERE pid = %s AND NOT granted "
                "AND %s = ANY (pg_blocking_pids(%s))", (round_pid, consumer_pid, round_pid)).fetchone()
            if wait is None:
                relation_wait = None
            elif wait[0] != "relation":
                blocked = True
            elif wait != relation_wait:
                relation_wait, since = wait, time.monotonic()
            else:
                blocked = time.monotonic() - since > RELATION_WAIT
        for statement in finish:
            consumer.execute(statement)
        consumer.execute("COMMIT")
        t.join()
    if failed:
        raise failed[0]
    return blocked, out[0]


# Longer than any bounded wait of a round for a relation lock (drop_lock_timeout, 100 ms) by far.
RELATION_WAIT = 30


def test_reclaim_leaves_a_lease_being_taken_over_alone(db):
    """A consumer past its budget takes an expired lease over and gives the key's lock back; the maintenance
    round's reclaim, which finds the old expired version, must not wait for that consumer while holding the
    key's lock (the consumer's idem_complete would then wait for the round: a deadlock)."""
    db.execute("SELECT idem_claim('stuck-taken', ttl => interval '1 millisecond')")
    while db.execute("SELECT expires_at >= clock_timestamp() FROM idem_status('stuck-taken')").fetchone()[0]:
        pass
    with connect() as consumer:
        consumer.execute("SET idempotency.key_locks_per_transaction = 1")
        consumer.execute("BEGIN")
        consumer.execute("SELECT idem_claim('stuck-pad')")  # the one lock it keeps
        assert consumer.execute("SELECT outcome, attempts FROM idem_claim('stuck-taken')").fetchone() == ("claimed", 2)
        blocked, _ = _round_behind(consumer, "SELECT leases_reclaimed FROM idem_maintenance(now() + interval '2 hours')",
                                   finish=["SELECT idem_complete('stuck-taken')"])
    assert not blocked, "the round waited for the consumer's transaction"
    assert db.execute("SELECT status FROM idem_status('stuck-taken')").fetchone()[0] == "completed"


def test_a_round_after_an_early_seal_waits_for_no_consumer(db):
    """A round run as of a later time seals today's partition early, and consumers then write into
    tomorrow's. The SQL edition's consumer used to make partitions inside its own transaction when its write
    partition started after now, holding the creation lock until it committed: the next round waited for it
    (multisession@sql failed so whenever CI ran between 22:00 and midnight UTC, through the round above)."""
    tomorrow = "SELECT partitions_created FROM idem_maintenance(now() + interval '1 day 2 hours')"
    db.execute(tomorrow)
    with connect() as consumer:
        consumer.execute("BEGIN")
        assert consumer.execute("SELECT outcome FROM idem_claim('after-early-seal')").fetchone()[0] == "claimed"
        blocked, _ = _round_behind(consumer, tomorrow)
    assert not blocked, "the round waited for the consumer's transaction"
