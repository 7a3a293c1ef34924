"""Partition boundaries under load: the shortest partition_interval the extension allows (60 s), premake 4
and a retention of 2 minutes, so that consumers cross a boundary every minute of the fake clock while
rounds premake, seal and drop around them (the clock runs 20 times as fast: 8 minutes in 24 s)."""
import datetime

from clocklab import UTC, Case, check_case, partitions
from consumers import Consumer, Ledger

START = datetime.datetime(2026, 12, 1, 10, 0, 30, tzinfo=UTC)
RATE = 20
MINUTES = 8


def test_partition_boundaries_under_load(server, report):
    with Case(server, "boundaries", start=START, rate=RATE, interval="60 s", retention="120 s") as case:
        ledger = Ledger("bounds")
        case.run_maintenance()
        # Re-deliveries pick keys done within the last minute of the fake clock: still retained.
        for n in range(4):
            case.spawn(Consumer(n, ledger, case.connect, case.stop, seed=10 + n, max_age=60 / RATE))
        with case.connect() as c:
            end = START + datetime.timedelta(minutes=MINUTES)
            case.run_until(c, end)
            check_case(case, ledger, report)
            # The last round's as_of is its own start: read before it, so that a partition that ends while it
            # runs (the fake clock runs 20 times as fast as the round) is not counted as due.
            before = c.execute("SELECT now()").fetchone()[0]
            case.round(c)
            parts = partitions(c)
            now = c.execute("SELECT now()").fetchone()[0]
            crossed = c.execute("SELECT count(DISTINCT date_bin('60 s', at, '2000-01-01')) FROM business").fetchone()[0]
            assert crossed >= MINUTES, f"messages in {crossed} partition intervals"
            assert parts[0][1] > START, f"nothing was dropped: the oldest partition starts at {parts[0][1]}"
            assert all(sealed for _, _, to, sealed, _ in parts if to <= before), (before, parts)
            assert max(to for _, _, to, _, _ in parts) >= now + datetime.timedelta(minutes=3), "premake fell behind"
            assert len(parts) <= 2 + 1 + 4 + 1, f"{len(parts)} partitions kept"
            report(f"messages in {crossed} one-minute partitions; {len(parts)} partitions kept at the end")
