"""Session time zones across a DST change: sessions in America/New_York claim and complete across
2026-11-01 06:00 UTC (02:00 EDT becomes 01:00 EST), their clock running over the change, with hourly
partitions (so the change is a partition boundary too) and maintenance running, the SQL edition's rounds
called from a New York session as well. Another session, in UTC, then finds every key, and created_at is
continuous in the order the keys were claimed."""
import datetime

from clocklab import UTC, Case, check_case
from consumers import Consumer, Ledger

CHANGE = datetime.datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
START = CHANGE - datetime.timedelta(minutes=2)
RATE = 24  # 4 minutes of the fake clock in 10 s
NY = "SET TimeZone = 'America/New_York'"


def test_dst_change_in_new_york(server, report):
    with Case(server, "dst", start=START, rate=RATE, interval="1 hour", maint_tz="America/New_York") as case:
        ledger = Ledger("dst")
        case.run_maintenance()
        for n in range(2):
            case.spawn(Consumer(n, ledger, case.connect, case.stop, seed=40 + n, setup=[NY], max_age=2.0))
        claimed = []  # (key, now() as the New York session shows it)
        with case.connect() as ny, case.connect() as utc:
            ny.execute(NY)
            utc.execute("SET TimeZone = 'UTC'")
            while case.now(ny) < CHANGE + datetime.timedelta(minutes=2):
                key = f"dst-seq-{len(claimed)}"
                ny.execute("BEGIN")
                shown = ny.execute("SELECT now()::text").fetchone()[0]
                assert ny.execute("SELECT outcome FROM idem_claim(%s)", (key,)).fetchone()[0] == "claimed"
                ny.execute("INSERT INTO business (key, consumer) VALUES (%s, -1)", (key,))
                ny.execute("SELECT idem_complete(%s)", (key,))
                ny.execute("COMMIT")
                claimed.append((key, shown))
            ledger.committed([k for k, _ in claimed])
            check_case(case, ledger, report)
            rows = [utc.execute("SELECT status, created_at FROM idem_status(%s)", (k,)).fetchone() for k, _ in claimed]
            assert all(r is not None and r[0] == "completed" for r in rows), "a key the UTC session does not find"
            created = [r[1] for r in rows]
            gaps = [(b - a).total_seconds() for a, b in zip(created, created[1:])]
            assert min(gaps) >= 0 and max(gaps) < 60, f"created_at jumps: {min(gaps)} s to {max(gaps)} s"
            assert created[0] < CHANGE <= created[-1], (created[0], created[-1])
            offsets = {shown[-3:] for _, shown in claimed}
            assert offsets == {"-04", "-05"}, offsets
            names = utc.execute("SELECT partition::text FROM idempotency.partitions"
                                " WHERE range_from = %s", (CHANGE,)).fetchall()
            assert names == [("idempotency.records_p2026_11_01_0600",)], names
            report(f"{len(claimed)} keys claimed in New York from {claimed[0][1]} to {claimed[-1][1]}; "
                   f"created_at steps of at most {max(gaps):.1f} s")
