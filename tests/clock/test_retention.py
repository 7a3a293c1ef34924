"""A key keeps its whole retention even when maintenance is late: a key written after midnight, before any
round of the new day sealed the day before (a scheduler that missed some runs, or a seal left to the next
round because a writer held the partition), is still answered as known until its own time plus the
retention."""
import datetime

import pytest

import pgtools
from clocklab import MAINT_APP, UTC, Case, check_case
from consumers import Ledger

DAY = datetime.timedelta(days=1)
NOON = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
LATE = NOON + datetime.timedelta(hours=20)  # 08:00 the next day; the last round ran at noon the day before


def _new_after_a_round(server, case, c, at):
    """Whether 'late-key' is answered as new by idem_once (rolled back) after a round at `at` (the clock set there)."""
    server.clock.step((at - case.now(c)).total_seconds())
    case.round(c)
    c.execute("BEGIN")
    new = c.execute("SELECT idem_once('late-key')").fetchone()[0]
    c.execute("ROLLBACK")
    return new


def test_a_key_written_before_a_late_seal_keeps_its_retention(server, report):
    with Case(server, "late-seal", start=NOON, rate=1, retention="2 days") as case:
        ledger = Ledger("late")
        with case.connect() as c:
            # No round runs from noon to 08:00 the next day (the native worker is told to wait a day).
            if not case.sql:
                c.execute("ALTER SYSTEM SET idempotency.maintenance_interval = '1d'")
                c.execute("SELECT pg_reload_conf()")
            server.clock.step((LATE - case.now(c)).total_seconds())
            c.execute("BEGIN")
            assert c.execute("SELECT idem_once('late-key')").fetchone()[0]
            c.execute("INSERT INTO business (key, consumer) VALUES ('late-key', -1)")
            c.execute("COMMIT")
            ledger.committed(["late-key"])
            created = c.execute("SELECT created_at FROM idem_status('late-key')").fetchone()[0]
            # Two days later, less an hour: within the key's retention; its day before is past it.
            new = _new_after_a_round(server, case, c, LATE + 2 * DAY - datetime.timedelta(hours=1))
            report(f"a key written at {LATE:%H:%M} after a day without rounds: created_at {created:%Y-%m-%d %H:%M:%S}, "
                   f"{'answered as new' if new else 'still known'} {2 * DAY - datetime.timedelta(hours=1)} later")
            assert not new, f"answered as new within its retention (created_at {created})"
            check_case(case, ledger, report, retained_since=LATE)


@pytest.mark.skipif(not pgtools.sql_edition(), reason="the SQL edition's late keys (the native extension writes a key into the "
                                                      "partition of its time, never into an older one)")
def test_a_seal_in_a_transaction_begun_before_a_late_key_keeps_its_retention(server, report):
    """The seal records when it took the partition's lock, not when its transaction began: a key written after
    the partition's end, while a transaction that then sealed it was already open, keeps its retention from its
    own time (0.9.5 recorded the transaction's start, and dropped the key an hour early here)."""
    with Case(server, "seal-time", start=NOON, rate=1, retention="2 days") as case:
        ledger = Ledger("seal-time")
        with case.connect() as c, case.connect(MAINT_APP) as m:
            server.clock.step((LATE - case.now(c)).total_seconds())
            m.execute("BEGIN")
            began = m.execute("SELECT now()").fetchone()[0]
            server.clock.step(3600)
            c.execute("BEGIN")
            assert c.execute("SELECT idem_once('late-key')").fetchone()[0]
            c.execute("INSERT INTO business (key, consumer) VALUES ('late-key', -1)")
            written = c.execute("SELECT now()").fetchone()[0]
            c.execute("COMMIT")
            ledger.committed(["late-key"])
            m.execute("SELECT FROM idem_maintenance()")   # seals the day before, as of its transaction's start
            m.execute("COMMIT")
            sealed = m.execute("SELECT sealed_at FROM idempotency.partitions WHERE range_to <= %s", (LATE,)).fetchall()
            # Half an hour short of the key's retention: past the sealing transaction's start plus the retention.
            new = _new_after_a_round(server, case, c, written + 2 * DAY - datetime.timedelta(minutes=30))
            report(f"a key written at {written:%H:%M:%S}, sealed by a transaction begun at {began:%H:%M:%S}: sealed_at "
                   f"{[s[0].strftime('%H:%M:%S') for s in sealed]}, {'answered as new' if new else 'still known'} 2 days less 30 min later")
            assert not new, f"answered as new within its retention (sealed_at {sealed}, written {written})"
            assert [s[0] >= written for s in sealed] == [True], (sealed, written)
            check_case(case, ledger, report, retained_since=written)
