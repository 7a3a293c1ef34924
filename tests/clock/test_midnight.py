"""Midnight UTC: consumers claim, complete, call idem_once and batches without pause from 23:58 to 00:02,
with maintenance running; the new day's partition was premade, yesterday's is sealed once the day is over,
and nothing failed on the way (clocklab.check_case)."""
import datetime

from clocklab import UTC, Case, check_case, partitions, round_waits_for
from consumers import Consumer, Ledger

START = datetime.datetime(2026, 11, 26, 23, 58, tzinfo=UTC)
MIDNIGHT = datetime.datetime(2026, 11, 27, tzinfo=UTC)
RATE = 12  # 4 minutes of the fake clock in 20 s


def test_midnight(server, report):
    with Case(server, "midnight", start=START, rate=RATE) as case:
        ledger = Ledger("midnight")
        case.run_maintenance()
        for n in range(4):
            case.spawn(Consumer(n, ledger, case.connect, case.stop, seed=n))
        with case.connect() as c:
            before = [p for p in partitions(c) if p[1] <= MIDNIGHT < p[2]]
            assert before, "the day after was not premade before midnight"
            case.run_until(c, MIDNIGHT + datetime.timedelta(minutes=2))
            check_case(case, ledger, report)
            days = c.execute("SELECT count(*) FILTER (WHERE at < %s), count(*) FILTER (WHERE at >= %s) FROM business",
                             (MIDNIGHT, MIDNIGHT)).fetchone()
            assert min(days) > 0, f"messages before and after midnight: {days}"
            # A round after midnight sealed yesterday's partition (the worker's, or the scheduler's).
            case.round(c)
            sealed = {p[0]: p[3] for p in partitions(c) if p[2] <= MIDNIGHT}
            assert sealed and all(sealed.values()), f"yesterday's partition not sealed after midnight: {sealed}"
            report(f"{days[0]} messages before midnight, {days[1]} after")


def test_the_first_claim_of_a_day_makes_no_partition(server, report):
    """Just after midnight, before any round of the new day, the next day's partition is there (premade): a
    consumer's first claim of the day must find it and make nothing. The native extension's claim used to
    premake the partitions up to `premake` days ahead of its own time, in its own transaction, holding the
    creation lock until it committed: every other consumer whose claim looked for the new day, and the
    round's premake, waited for it (found by test_a_month_of_retention's watcher)."""
    with Case(server, "first-claim", start=MIDNIGHT - datetime.timedelta(seconds=3), rate=1) as case:
        with case.connect("clock-consumer") as consumer, case.connect() as c:
            case.round(c)
            before = len(partitions(c))
            case.run_until(c, MIDNIGHT)
            consumer.execute("BEGIN")
            assert consumer.execute("SELECT outcome FROM idem_claim('first-of-the-day')").fetchone()[0] == "claimed"
            blocked = round_waits_for(case, consumer)
            made = len(partitions(c)) - before
        assert not blocked, "the round waited for a consumer's transaction"
        report(f"the day's first claim: the round did not wait for it; the round made {made} partition(s)")
