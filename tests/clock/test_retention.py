"""A key keeps its whole retention even when maintenance is late: a key written after midnight, before any
round of the new day sealed the day before (a scheduler that missed some runs, or a seal left to the next
round because a writer held the partition), is still answered as known until its own time plus the
retention."""
import datetime

import pytest

import pgtools
from clocklab import UTC, Case, check_case
from consumers import Ledger

DAY = datetime.timedelta(days=1)
NOON = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
LATE = NOON + datetime.timedelta(hours=20)  # 08:00 the next day; the last round ran at noon the day before


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
            server.clock.step((LATE + 2 * DAY - datetime.timedelta(hours=1) - case.now(c)).total_seconds())
            case.round(c)
            c.execute("BEGIN")
            new = c.execute("SELECT idem_once('late-key')").fetchone()[0]
            c.execute("ROLLBACK")
            report(f"a key written at {LATE:%H:%M} after a day without rounds: created_at {created:%Y-%m-%d %H:%M:%S}, "
                   f"{'answered as new' if new else 'still known'} {2 * DAY - datetime.timedelta(hours=1)} later")
            assert not new, f"answered as new within its retention (created_at {created})"
            check_case(case, ledger, report, retained_since=LATE)
