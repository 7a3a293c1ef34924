"""One-row claims: in one-transaction mode the record of a new key is written once, as completed.

pg_stat_xact_user_tables counts the current transaction's own inserts and updates per partition, at
once, so each test reads what its transaction wrote to the record table.
"""
import threading
import uuid

import psycopg
import pytest


def new_scope(tag):
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def writes(conn):
    """(inserts, updates) of this transaction into the partitions of idempotency.records."""
    return conn.execute("""
        SELECT coalesce(sum(n_tup_ins), 0)::int, coalesce(sum(n_tup_upd), 0)::int
          FROM pg_stat_xact_user_tables
         WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idempotency.records'::regclass)
    """).fetchone()


def row(conn, scope, key):
    return conn.execute("SELECT status, token, attempts, payload, expires_at IS NULL FROM idempotency.records "
                        "WHERE scope = %s AND key = %s", (scope, key)).fetchone()


def claim(conn, scope, key, ttl=None):
    return conn.execute("SELECT outcome, token, expires_at FROM idem_claim(%s, %s::interval, %s)",
                        (key, ttl, scope)).fetchone()


@pytest.mark.native_only("a new key's record written once, at its fate (the key's lock keeps others out until then)")
def test_claim_and_complete_write_one_row(cluster):
    scope = new_scope("one-row")
    with cluster.connect() as c:
        c.execute("BEGIN")
        outcome, token, _ = claim(c, scope, "k")
        assert outcome == "claimed"
        assert writes(c) == (0, 0), "the claim of a new key wrote before its fate was known"
        c.execute("SELECT idem_complete('k', '{\"ok\": 1}', %s)", (scope,))
        assert writes(c) == (1, 0), "claim + complete should be one insert and no update"
        assert row(c, scope, "k") == ("completed", token, 1, {"ok": 1}, True)
        c.execute("COMMIT")
        assert claim(c, scope, "k")[0] == "completed"
        assert c.execute("SELECT status, token, payload, expires_at FROM idem_status('k', %s)",
                         (scope,)).fetchone() == ("completed", token, {"ok": 1}, None)


def test_two_transaction_claim_is_written_at_commit(cluster):
    scope = new_scope("one-row-2tx")
    with cluster.connect() as a, cluster.connect() as b:
        a.execute("BEGIN")
        outcome, token, expires_at = claim(a, scope, "k", "1 hour")
        a.execute("COMMIT")
        assert outcome == "claimed"
        assert b.execute("SELECT status, token, expires_at FROM idem_status('k', %s)",
                         (scope,)).fetchone() == ("pending", token, expires_at)
        assert claim(b, scope, "k")[0] == "in_progress"
        a.execute("SELECT idem_complete('k', NULL, %s, %s)", (scope, token))
        assert claim(b, scope, "k")[0] == "completed"


def test_the_same_transaction_sees_its_claim(cluster):
    scope = new_scope("one-row-same")
    with cluster.connect() as c:
        c.execute("BEGIN")
        _, token, expires_at = claim(c, scope, "k")
        # idem_status, a second claim and idem_once see the claim as a pending row, as before.
        assert c.execute("SELECT status, token, expires_at FROM idem_status('k', %s)",
                         (scope,)).fetchone() == ("pending", token, expires_at)
        assert claim(c, scope, "k")[0] == "in_progress"
        assert c.execute("SELECT idem_once('k', %s)", (scope,)).fetchone()[0] is False
        c.execute("SELECT idem_complete('k', NULL, %s)", (scope,))
        assert writes(c) == (1, 1), "written as pending when looked at, then completed by an update"
        c.execute("COMMIT")
        assert claim(c, scope, "k")[0] == "completed"


def test_savepoints(cluster):
    scope = new_scope("one-row-sp")
    with cluster.connect() as c, cluster.connect() as other:
        # A claim rolled back to its savepoint is forgotten: nothing is written, the key is free.
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        assert claim(c, scope, "gone")[0] == "claimed"
        c.execute("ROLLBACK TO SAVEPOINT s")
        gone = claim(other, scope, "gone", "1 hour")
        assert gone[0] == "claimed", "the rolled-back claim still held the key"
        # A completion rolled back to its savepoint leaves the claim: committed as a pending lease.
        _, token, _ = claim(c, scope, "kept", "1 hour")
        c.execute("SAVEPOINT t")
        c.execute("SELECT idem_complete('kept', NULL, %s)", (scope,))
        c.execute("ROLLBACK TO SAVEPOINT t")
        c.execute("COMMIT")
        assert other.execute("SELECT status, token FROM idem_status('kept', %s)", (scope,)).fetchone() \
            == ("pending", token)
        assert other.execute("SELECT status, token FROM idem_status('gone', %s)", (scope,)).fetchone() \
            == ("pending", gone[1]), "the claim rolled back to its savepoint was written at commit"
        # A claim made in a released savepoint belongs to the transaction.
        c.execute("BEGIN")
        c.execute("SAVEPOINT u")
        _, token, _ = claim(c, scope, "released")
        c.execute("RELEASE SAVEPOINT u")
        c.execute("SELECT idem_complete('released', NULL, %s, %s)", (scope, token))
        c.execute("COMMIT")
        assert claim(other, scope, "released")[0] == "completed"


def test_a_waiting_claim_sees_the_one_row(cluster):
    scope = new_scope("one-row-wait")
    with cluster.connect() as a, cluster.connect() as b:
        a.execute("BEGIN")
        assert claim(a, scope, "k")[0] == "claimed"
        got = {}
        t = threading.Thread(target=lambda: got.update(outcome=claim(b, scope, "k")[0]))
        t.start()
        t.join(0.3)
        assert t.is_alive(), "the second claim did not wait for the key"
        a.execute("SELECT idem_complete('k', NULL, %s)", (scope,))
        a.execute("COMMIT")
        t.join(10)
        assert got["outcome"] == "completed"


def test_rollback_writes_nothing(cluster):
    scope = new_scope("one-row-rb")
    with cluster.connect() as c:
        c.execute("BEGIN")
        claim(c, scope, "k")
        c.execute("ROLLBACK")
        assert c.execute("SELECT count(*) FROM idempotency.records WHERE scope = %s", (scope,)).fetchone()[0] == 0
        assert claim(c, scope, "k")[0] == "claimed"


def test_an_error_after_the_claim_loses_it(cluster):
    scope = new_scope("one-row-err")
    with cluster.connect() as c:
        c.execute("BEGIN")
        claim(c, scope, "k")
        try:
            c.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            c.execute("ROLLBACK")
        assert claim(c, scope, "k")[0] == "claimed"


@pytest.mark.native_only("a new key's record written once, at its fate (the key's lock keeps others out until then)")
def test_a_statement_that_reads_the_storage_sees_the_claim(cluster):
    """A SELECT on the record table (or a view over it) in the claiming transaction sees the claim
    as a pending row, at every isolation level: it is written just before that statement runs."""
    for level in ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"):
        scope = new_scope("one-row-read")
        with cluster.connect() as c:
            c.execute(f"BEGIN ISOLATION LEVEL {level}")
            _, token, _ = claim(c, scope, "k")
            assert writes(c) == (0, 0)
            assert row(c, scope, "k")[:3] == ("pending", token, 1), level
            assert c.execute("SELECT state, token FROM idempotency.in_flight WHERE scope = %s",
                             (scope,)).fetchone() == ("leased", token), level
            assert writes(c) == (1, 0)
            c.execute("SELECT idem_complete('k', NULL, %s)", (scope,))
            assert row(c, scope, "k")[:2] == ("completed", token), level
            c.execute("COMMIT")


@pytest.mark.native_only("a new key's record written once, at its fate (the key's lock keeps others out until then)")
def test_batch_claim_and_complete_write_one_row_per_key(cluster):
    """The batch loop of one transaction: idem_claim_batch, then idem_complete_batch of the claimed keys,
    writes each new key's row once, completed (before 0.6.0: an insert and an update per key), while the
    transaction may keep the keys' locks (idempotency.key_locks_per_transaction, here 32)."""
    scope = new_scope("one-row-batch")
    keys = [f"k{i}" for i in range(30)]
    with cluster.connect() as c, cluster.connect() as other:
        # One key seen before (answered, not claimed), by the other session: pg_stat_xact_user_tables also
        # shows a session's counts of earlier transactions that the stats collector has not taken yet.
        other.execute("SELECT idem_once('k0', %s)", (scope,))
        c.execute("BEGIN")
        claimed = [k for k, outcome in c.execute(
            "SELECT key, outcome FROM idem_claim_batch(%s, scope => %s)", (keys, scope)).fetchall()
            if outcome == "claimed"]
        assert claimed == keys[1:]
        assert writes(c) == (0, 0), "the batch claim of new keys wrote before their fate was known"
        # Another session waits for the keys as for any claim (here: answers in_progress at once).
        assert other.execute("SELECT outcome FROM idem_claim('k7', scope => %s, wait => false)",
                             (scope,)).fetchone()[0] == "in_progress"
        payloads = [psycopg.types.json.Jsonb({"n": i}) for i in range(len(claimed))]
        done = c.execute("SELECT idem_complete_batch(%s, %s, %s)", (claimed, payloads, scope)).fetchone()[0]
        assert done == len(claimed)
        assert writes(c) == (len(claimed), 0), "claim + complete batches should be one insert per key, no update"
        c.execute("COMMIT")
        got = dict(other.execute("SELECT key, payload FROM idempotency.records WHERE scope = %s AND key <> 'k0'",
                                 (scope,)).fetchall())
        assert got == {k: {"n": i} for i, k in enumerate(claimed)}
        assert other.execute("SELECT count(*) FROM idem_claim_batch(%s, scope => %s) WHERE outcome = 'completed'",
                             (keys, scope)).fetchone()[0] == len(keys)


@pytest.mark.native_only("the key-lock budget and the table of held keys")
def test_batch_past_the_lock_budget_holds_its_keys_without_locks_and_writes_once(cluster):
    """Past the key locks a transaction may keep, the batch claim holds its keys in the table of held keys
    and gives their locks back: it still writes nothing before the keys' fate is known and one row per key
    when it completes them, and the other session is kept out all the same."""
    scope = new_scope("one-row-batch-big")
    keys = [f"k{i}" for i in range(50)]
    with cluster.connect() as c, cluster.connect() as other:
        c.execute("BEGIN")
        assert c.execute("SELECT current_setting('idempotency.key_locks_per_transaction')::int, "
                         "current_setting('max_locks_per_transaction')::int").fetchone() == (-1, 64)
        outcomes = [r[0] for r in c.execute("SELECT outcome FROM idem_claim_batch(%s, scope => %s)", (keys, scope))]
        assert outcomes == ["claimed"] * len(keys)
        assert writes(c) == (0, 0)
        assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 18756 "
                         "AND pid = pg_backend_pid()").fetchone()[0] == 0
        for key in ("k7", "k49"):
            assert other.execute("SELECT outcome FROM idem_claim(%s, scope => %s, wait => false)",
                                 (key, scope)).fetchone()[0] == "in_progress"
        assert c.execute("SELECT idem_complete_batch(%s, NULL, %s)", (keys, scope)).fetchone()[0] == len(keys)
        assert writes(c) == (len(keys), 0)
        c.execute("COMMIT")
        assert other.execute("SELECT count(*) FROM idem_claim_batch(%s, scope => %s) WHERE outcome = 'completed'",
                             (keys, scope)).fetchone()[0] == len(keys)


def test_batch_complete_of_keys_claimed_earlier_updates_them(cluster):
    """A batch claimed in an earlier transaction (two-transaction mode) is completed by update, with tokens."""
    scope = new_scope("one-row-batch-2tx")
    with cluster.connect() as claimer, cluster.connect() as c:
        rows = claimer.execute("SELECT key, token FROM idem_claim_batch(ARRAY['a', 'b'], '1 hour', %s)",
                               (scope,)).fetchall()
        c.execute("BEGIN")
        done = c.execute("SELECT idem_complete_batch(%s, NULL, %s, %s)",
                         ([k for k, _ in rows], scope, [t for _, t in rows])).fetchone()[0]
        assert done == 2 and writes(c) == (0, 2)
        c.execute("COMMIT")


@pytest.mark.native_only("the table of held keys")
def test_a_held_key_goes_with_its_subtransaction(cluster):
    """Past the budget a claim holds its key in the table of held keys, under the xid of the subtransaction
    that claimed it: a session waiting for the key wakes when that subtransaction rolls back, while the
    outer transaction is still open (as it would for a key lock the subtransaction took), and claims it."""
    scope = new_scope("held-savepoint")
    with cluster.connect() as c, cluster.connect() as other:
        c.execute("BEGIN")
        c.execute("SET LOCAL idempotency.key_locks_per_transaction = 1")
        c.execute("SELECT idem_claim('pad', scope => %s)", (scope,))  # the one lock it keeps
        c.execute("SAVEPOINT message")
        assert c.execute("SELECT outcome FROM idem_claim('k', scope => %s)", (scope,)).fetchone()[0] == "claimed"
        assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 18756 "
                         "AND pid = pg_backend_pid()").fetchone()[0] == 1, "k is held, not locked"
        other_pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
        got = []
        waiter = threading.Thread(target=lambda: got.append(
            other.execute("SELECT outcome FROM idem_claim('k', scope => %s)", (scope,)).fetchone()[0]))
        waiter.start()
        with cluster.connect() as watch:
            # Until the other session waits for c's subtransaction (a transactionid lock it has not got).
            while not watch.execute("SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s AND locktype = "
                                    "'transactionid' AND NOT granted)", (other_pid,)).fetchone()[0]:
                assert waiter.is_alive(), got
        c.execute("ROLLBACK TO SAVEPOINT message")
        waiter.join(timeout=60)
        still_open = c.execute("SELECT txid_current_if_assigned() IS NOT NULL").fetchone()[0]
        assert not waiter.is_alive(), "the other session still waits for the outer transaction"
        assert got == ["claimed"] and still_open
        c.execute("COMMIT")
