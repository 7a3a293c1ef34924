"""A seal that commits while a batch's write is being planned (the SQL edition).

The SQL edition's batches write their new keys in one statement whose constants (the write partition, the
state's generation) come from idempotency.cached_state(), folded in when the statement is planned. A state
replaced while that statement is planned (the session takes in the invalidation at a lock its planning takes
anew, a catalog's on a cache miss among them) gives the parts planned after that moment the new state's
constants, and the parts planned before it the old ones: the write went by the old state and put the keys into the partition that was just
sealed, while the statement's outer SELECT said the new one. 0.9.5 then deleted the rows it had written by
the new state's range, found none, and the long way found them in the sealed partition: idem_claim_batch
answered its new keys in_progress (seen in the clock layer's month, tests/clock/test_month.py, about one run
in six), and idem_once_batch answered them as seen before, so their messages were never processed.

tests/planpause.c makes the moment deterministic: the session pauses once its write's source is planned,
another session seals the write partition (a maintenance round as of a day later) and commits, and the
planning goes on with the new state. Each new key must then be answered as new and written once, into the
new write partition.
"""
import threading
import time

import pytest

import pgtools
import planpause

pytestmark = pytest.mark.skipif(not pgtools.sql_edition(), reason="the SQL edition's plans (the native extension plans none)")

ADVISORY_KEY = 731_205
CALLS = {
    "claim_batch": ("SELECT key, outcome FROM idem_claim_batch(%s, scope => 'replan')",
                    lambda keys, rows: sorted(rows) == [(k, "claimed") for k in keys]),
    "once_batch": ("SELECT k FROM idem_once_batch(%s, 'replan') AS t(k)",
                   lambda keys, rows: sorted(r[0] for r in rows) == keys),
}


def _write_partition(c):
    return c.execute("SELECT partition::text FROM idempotency.partitions WHERE sealed_at IS NULL"
                     " ORDER BY range_from LIMIT 1").fetchone()[0]


@pytest.fixture
def db(cluster):
    with pgtools.own_database(cluster, "idem_replan") as name:
        yield name


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_batch_planned_across_a_seal_writes_its_keys_once(cluster, db, report, call):
    sql, answered_new = CALLS[call]
    keys = [f"{call}-{i}" for i in range(3)]
    with cluster.connect(dbname=db) as a, cluster.connect(dbname=db) as b:
        # The round below makes no partition (one ahead of its as_of is there): it only seals.
        b.execute("UPDATE idempotency.settings SET premake = 1")
        sealed = _write_partition(b)
        a.execute(f"LOAD '{planpause.library()}'")
        # The session's plans made, as a consumer's are after its first batch.
        a.execute("BEGIN")
        a.execute(sql, ([f"{call}-warm"],)).fetchall()
        a.execute("COMMIT")
        # A new state with the same write partition: the next batch plans its write again.
        b.execute("UPDATE idempotency.settings SET max_attempts = 4")
        b.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_KEY,))
        a_pid = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        a.execute(f"SET planpause.advisory_key = {ADVISORY_KEY}")
        result = {}

        def batch():
            try:
                a.execute("BEGIN")
                result["rows"] = a.execute(sql, (keys,)).fetchall()
                a.execute("COMMIT")
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                result["error"] = e

        t = threading.Thread(target=batch, daemon=True)
        t.start()
        try:
            # Until the batch's planning waits for the lock (or the batch ended without pausing, or stopped
            # elsewhere: failures).
            deadline = time.monotonic() + 60
            while t.is_alive() and time.monotonic() < deadline and not b.execute(
                    "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = %s)",
                    (a_pid,)).fetchone()[0]:
                time.sleep(0.01)
            paused = t.is_alive() and time.monotonic() < deadline
            if paused:
                b.execute("SELECT FROM idem_maintenance(now() + interval '1 day')")
            moved_to = _write_partition(b)
        finally:
            b.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))
            t.join(60)
        assert paused, f"the batch never paused in its planning: {result}"
        assert moved_to != sealed, f"the round did not seal {sealed}"
        assert "error" not in result, result.get("error")
        where = b.execute("SELECT key, tableoid::regclass::text, status FROM idempotency.records"
                          " WHERE scope = 'replan' AND key = ANY (%s) ORDER BY key, tableoid::regclass::text",
                          (keys,)).fetchall()
        report(f"{call} planned across the seal of {sealed}: answered {result['rows']}; records {where}")
        assert answered_new(keys, result["rows"]), f"new keys answered {result['rows']}"
        assert [(k, p) for k, p, _ in where] == [(k, moved_to) for k in keys], where
