"""A month of retention with the clock running fast: retention 30 days, daily partitions, premake 4, the
clock stepped 6 hours at a time through 40 days while consumers run and maintenance runs (the native
worker, and a round after every step on both editions, standing for the rounds of the minutes skipped: a
missed minute is harmless, the next round does what the missed ones would have done).
After every step's round: partitions premade ahead of need, every past one sealed, every one past retention
dropped, storage within its bound; sampled keys answer as they must (not new within the retention, gone
past it). On the second day a session holds the write partition (ROW EXCLUSIVE, as a consumer's long
transaction would) through two rounds, so that its seal comes two rounds late and new keys go on into it
for those 12 hours (their created_at at its last microsecond): it must then be dropped a retention after its
seal, not after its end (under a loaded machine a seal was left to the next round now and then, and the
count of retained records, which assumed seals on time, failed)."""
import datetime

from clocklab import UTC, Case, check_case, partitions
from consumers import Consumer, Ledger

START = datetime.datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
DAY = datetime.timedelta(days=1)
RETENTION_DAYS, PREMAKE, STEP_H, DAYS = 30, 4, 6, 40
STEP = datetime.timedelta(hours=STEP_H)
SAMPLE = 16
HOLD_STEPS = (3, 5)  # the write partition held from before step 3's clock step until after step 5's


def day_start(ts):
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)


def storage(c, native):
    parts = c.execute("SELECT coalesce(sum(total_bytes), 0) FROM idempotency.partitions").fetchone()[0]
    if native:
        parts += c.execute("SELECT pg_total_relation_size('idempotency.filter_chunks')").fetchone()[0]
    return int(parts)


def test_a_month_of_retention(server, report):
    case = Case(server, "month", start=START, rate=1, retention=f"{RETENTION_DAYS} days", premake=PREMAKE)
    case.worker_s = 1
    with case:
        ledger = Ledger("month")
        # The SQL edition's scheduler is the round after each step (a round every minute would find the step's
        # round under way now and then, and do nothing: idem_maintenance() runs one round at a time).
        for n in range(3):
            case.spawn(Consumer(n, ledger, case.connect, case.stop, seed=30 + n, max_age=1.0))
        seen, sealed_seen, problems, late = set(), set(), [], {}
        sealed_at, ends = {}, {}  # partition -> when it was sealed, its range's end (once seen)
        holder = write_partition = None
        deferred = 0
        keys_checked = largest = most_parts = 0
        with case.connect() as c:
            for step in range(DAYS * 24 // STEP_H):
                if step == HOLD_STEPS[0]:
                    holder = case.connect("clock-holder")
                    write_partition = next(p[0] for p in partitions(c) if not p[3])
                    holder.execute("BEGIN")
                    holder.execute(f"LOCK TABLE {write_partition} IN ROW EXCLUSIVE MODE")
                server.clock.step(STEP_H * 3600)
                if step == HOLD_STEPS[1]:
                    holder.execute("COMMIT")
                    holder.close()
                rounded = case.round(c)
                now = c.execute("SELECT clock_timestamp()").fetchone()[0]
                parts = partitions(c)
                names = {p[0] for p in parts}
                seen |= names
                sealed_seen |= {p[0] for p in parts if p[3]}
                ends.update((p[0], p[2]) for p in parts)
                sealed_at.update((p[0], p[4]) for p in parts if p[3])
                horizon = day_start(now) + (PREMAKE + 1) * DAY
                cutoff = now - RETENTION_DAYS * DAY
                where = f"step {step} ({now:%Y-%m-%d %H:%M})"
                if max(p[2] for p in parts) < horizon:
                    problems.append(f"{where}: premade until {max(p[2] for p in parts)}, not {horizon}")
                # A seal or a drop whose lock does not come within drop_lock_timeout is left to the next
                # round (consumers keep locks on the partitions they read): on schedule means within a day.
                # (The held partition's rounds count from the end of the hold. The SQL edition drops a partition
                # that holds keys written after its end a retention after its seal: its rounds count from then.)
                held = write_partition if HOLD_STEPS[0] <= step < HOLD_STEPS[1] else None
                for p in parts:
                    drop_from = max(p[2], sealed_at.get(p[0], p[2])) if case.sql else p[2]
                    for what, due in (("sealed", p[2] <= now and not p[3] and p[0] != held), ("dropped", drop_from <= cutoff)):
                        late[(what, p[0])] = late.get((what, p[0]), 0) + 1 if due else 0
                        if late[(what, p[0])] > 24 // STEP_H:
                            problems.append(f"{where}: {p[0]} not {what} in {late[(what, p[0])]} rounds")
                deferred += rounded[2]
                most_parts = max(most_parts, len(parts))
                if len(parts) > RETENTION_DAYS + PREMAKE + 2:
                    problems.append(f"{where}: {len(parts)} partitions")
                largest = max(largest, storage(c, not case.sql))
                # Retained rows: the keys processed since the oldest partition kept began, and since the newest
                # dropped one was sealed (new keys went into it until then). A lease's record has the time of its
                # claim, and its business row the time of its completion, up to a step later; at most a lease
                # per consumer is between its two transactions.
                kept_from = min(p[1] for p in parts)
                retained_since = max([kept_from] + [sealed_at.get(n, kept_from) for n in seen - names]) + STEP
                records, surely, maybe = c.execute(
                    "SELECT (SELECT count(*) FROM idempotency.records),"
                    "       (SELECT count(*) FROM business WHERE at >= %s),"
                    "       (SELECT count(*) FROM business WHERE at >= %s)", (retained_since, kept_from)).fetchone()
                if not surely <= records <= maybe + 3:
                    problems.append(f"{where}: {records} records for {surely} to {maybe} messages since {kept_from}"
                                    f" (surely since {retained_since})")
                sample = c.execute("SELECT key, at FROM business ORDER BY random() LIMIT %s", (SAMPLE,)).fetchall()
                for key, at in sample:
                    if at > cutoff + STEP:
                        c.execute("BEGIN")
                        if c.execute("SELECT idem_once(%s)", (key,)).fetchone()[0]:
                            problems.append(f"{where}: {key} of {at} answered as new within its retention")
                        c.execute("ROLLBACK")
                        keys_checked += 1
                    elif at < kept_from:
                        if c.execute("SELECT count(*) FROM idem_status(%s)", (key,)).fetchone()[0]:
                            problems.append(f"{where}: {key} of {at} still there past its retention")
                        keys_checked += 1
            made = len(seen)
            dropped = len(seen - names)
            report(f"{DAYS} days in {step + 1} steps of {STEP_H} h: {made} partitions made, {len(sealed_seen)} sealed, "
                   f"{dropped} dropped ({deferred} drops deferred to a later round); at most {most_parts} kept; largest storage {largest} bytes; "
                   f"{keys_checked} keys checked; {len(problems)} violations")
            assert not problems, "\n".join(problems[:30])
            assert dropped >= DAYS - RETENTION_DAYS - 2, (made, dropped)
            # The held partition's seal came late (else the case tested nothing late): on the SQL edition, whose
            # rounds are the steps', at the first round after the hold, over two steps after the partition's end;
            # the native worker's rounds (every second) may take the lock at the release, before that step's.
            late_seals = {n: at - ends[n] for n, at in sealed_at.items() if at - ends[n] > STEP}
            report(f"seals later than a step after the partition's end: {late_seals}")
            assert sealed_at[write_partition] - ends[write_partition] > (2 if case.sql else 1) * STEP, late_seals
            check_case(case, ledger, report, retained_since=retained_since)
