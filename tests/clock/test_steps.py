"""Clock steps: backwards by 5 seconds and by 2 minutes (an NTP correction), forwards by an hour (a VM resumed
from a pause), each in the middle of a consumer's transaction and between two maintenance rounds, with
consumers running throughout, around midnight UTC so that the steps cross a day boundary and land in a
sealed day. What a step does to leases and expires_at is what docs/reference.md ("The clock") says, and is
checked here:

* a lease's expires_at is an instant of the wall clock, kept as it was: a step forward past it lets another
  consumer take the key over (the old holder's completion is then 55006); a step back lengthens what is left;
* idem_heartbeat sets expires_at to the clock plus ttl, even when that is earlier than the end it had;
* a transaction keeps the created_at of its start; a row whose time falls in a sealed partition (the clock
  stepped back behind a seal) goes to the first partition that is not sealed, created_at moved to its start.
"""
import datetime
import threading
import time

import psycopg
import pytest

from clocklab import UTC, Case, check_case, partitions
from consumers import Consumer, Ledger

START = datetime.datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
MIDNIGHT = datetime.datetime(2026, 12, 1, tzinfo=UTC)
TTL = datetime.timedelta(minutes=3)


def one(conn, sql, *args):
    return conn.execute(sql, args).fetchone()


def held_step(case, seconds, tag, report):
    """A consumer's transaction open across a step of `seconds`: a one-transaction claim whose completion
    commits after the step, and, claimed before it, a lease (two transactions) and a lease heartbeated after
    it. Checks what the step did to them."""
    k1, k2, k3 = (f"held-{tag}-{i}" for i in (1, 2, 3))
    with case.connect("clock-held") as h, case.connect("clock-held") as other:
        leases = {}
        for k in (k2, k3):
            outcome, token, expires = one(h, "SELECT outcome, token, expires_at FROM idem_claim(%s, %s)", k, TTL)
            assert outcome == "claimed"
            leases[k] = (token, expires)
        h.execute("BEGIN")
        started = one(h, "SELECT now()")[0]
        assert one(h, "SELECT outcome FROM idem_claim(%s)", k1)[0] == "claimed"
        h.execute("INSERT INTO business (key, consumer) VALUES (%s, -1)", (k1,))
        before = case.now(other)
        case.server.clock.step(seconds)
        after = case.now(other)
        assert abs((after - before).total_seconds() - seconds) < 5, (before, after)
        # A round now waits for this transaction at most drop_lock_timeout (the watcher checks it).
        case.round()
        h.execute("SELECT idem_complete(%s)", (k1,))
        h.execute("COMMIT")
        created = one(other, "SELECT created_at FROM idem_status(%s)", k1)[0]
        assert created >= started, (created, started)

        token2, expires2 = leases[k2]
        answer = one(other, "SELECT outcome, attempts, token, expires_at FROM idem_claim(%s, wait => false)", k2)
        if seconds > TTL.total_seconds():
            # Forward past the lease's end: taken over; the old holder's completion is refused.
            assert answer[:2] == ("claimed", 2), answer
            with pytest.raises(psycopg.errors.ObjectInUse):
                h.execute("SELECT idem_complete(%s, NULL, 'default', %s)", (k2, token2))
            other.execute("INSERT INTO business (key, consumer) VALUES (%s, -2)", (k2,))
            other.execute("SELECT idem_complete(%s, NULL, 'default', %s)", (k2, answer[2]))
        else:
            # Back (or forward within it): still held, its end unchanged.
            assert answer[0] == "in_progress" and answer[3] == expires2, (answer, expires2)
            h.execute("INSERT INTO business (key, consumer) VALUES (%s, -1)", (k2,))
            h.execute("SELECT idem_complete(%s, NULL, 'default', %s)", (k2, token2))
        token3, expires3 = leases[k3]
        try:
            beat = one(h, "SELECT idem_heartbeat(%s, '1 min', 'default', %s)", k3, token3)[0]
        except psycopg.errors.ObjectInUse:
            beat = None  # taken over meanwhile? not by anyone here
            raise
        clock = case.now(h)
        assert abs((beat - clock).total_seconds() - 60) < 5, (beat, clock)
        assert one(other, "SELECT expires_at FROM idem_status(%s)", k3)[0] == beat
        h.execute("INSERT INTO business (key, consumer) VALUES (%s, -1)", (k3,))
        h.execute("SELECT idem_complete(%s, NULL, 'default', %s)", (k3, token3))
    report(f"step {seconds:+d} s in a transaction: lease ends {(expires2 - after).total_seconds():+.0f} s after the step, heartbeat "
           f"{'shortened' if beat < expires3 else 'lengthened'} it by {abs((beat - expires3).total_seconds()):.0f} s")
    return [k1, k2, k3]


def between_rounds(case, seconds):
    case.round()
    case.server.clock.step(seconds)
    case.round()


def test_clock_steps(server, report):
    case = Case(server, "steps", start=START, rate=1)
    case.worker_s = 1
    with case:
        ledger = Ledger("steps")
        case.run_maintenance()
        for n in range(3):
            case.spawn(Consumer(n, ledger, case.connect, case.stop, seed=20 + n, ttl="3 min", gate=case.gate))
        with case.connect() as c:
            case.round(c)
            # No autovacuum of the day whose seal is asserted below: its ANALYZE (the launcher, on the wall clock,
            # runs at once after a step forward) holds a lock the seal waits for, cancelled only after
            # deadlock_timeout, longer than drop_lock_timeout.
            day = next(p[0] for p in partitions(c) if p[2] == MIDNIGHT)
            c.execute(f"ALTER TABLE {day} SET (autovacuum_enabled = off)")
            # Forwards an hour across midnight, a transaction of the day before open: its day cannot be sealed
            # until it commits (the seal waits drop_lock_timeout, then leaves it to the next round).
            held = held_step(case, 3600, "fwd", report)
            yesterday = [p for p in partitions(c) if p[2] == MIDNIGHT]
            # The first round after it commits seals that day. With the consumers parked and no scheduled round
            # under way: a consumer completing yesterday's lease may hold the partition past drop_lock_timeout,
            # and the SQL edition's round does nothing while the scheduler's runs.
            with case.quiet():
                case.round(c)
            assert [p[3] for p in partitions(c) if p[2] == MIDNIGHT] == [True], yesterday
            between_rounds(case, 3600)
            # Back to just after midnight, yesterday sealed; then back behind the seal, by 5 s and by 2 min.
            server.clock.step((MIDNIGHT + datetime.timedelta(seconds=3) - case.now(c)).total_seconds())
            case.round(c)
            for seconds in (-5, -120):
                held += held_step(case, seconds, f"back{-seconds}", report)
                between_rounds(case, seconds)
                late = case.now(c)
                assert late < MIDNIGHT, late
                # A new key now: its time is in the sealed day; it goes to today's partition, at midnight.
                c.execute("BEGIN")
                assert one(c, "SELECT idem_once(%s)", f"late{-seconds}")[0]
                c.execute("INSERT INTO business (key, consumer) VALUES (%s, -3)", (f"late{-seconds}",))
                c.execute("COMMIT")
                held.append(f"late{-seconds}")
                created = one(c, "SELECT created_at FROM idempotency.records WHERE key = %s", f"late{-seconds}")[0]
                assert created == MIDNIGHT, (created, late)
            ledger.committed(held)
            check_case(case, ledger, report)


def test_a_step_back_lengthens_a_lock_timeout(server, report):
    """PostgreSQL's lock_timeout (with which maintenance waits at most drop_lock_timeout for a partition's
    writers) is a deadline on the wall clock: a step back during the wait lengthens it by the step, a step
    forward does not shorten it. What docs/reference.md ("The clock") says, shown on a table of the case."""
    with Case(server, "lock-timeout", start=START, rate=1) as case:
        with case.connect() as holder, case.connect() as waiter:
            holder.execute("CREATE TABLE t ()")
            waited = {}
            for step in (-2, 3600):
                holder.execute("BEGIN")
                holder.execute("LOCK t")
                waiter.execute("BEGIN")
                waiter.execute("SET LOCAL lock_timeout = '200ms'")
                pid = waiter.execute("SELECT pg_backend_pid()").fetchone()[0]
                done = threading.Event()

                def step_when_waiting(pid=pid, step=step):
                    with case.server.cluster.connect() as w:
                        while not done.is_set() and not w.execute(
                                "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s::int AND NOT granted)", (pid,)).fetchone()[0]:
                            pass
                    case.server.clock.step(step)

                stepper = threading.Thread(target=step_when_waiting, daemon=True)
                stepper.start()
                started = time.monotonic()
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    waiter.execute("LOCK t")
                waited[step] = time.monotonic() - started
                done.set()
                stepper.join()
                waiter.execute("ROLLBACK")
                holder.execute("ROLLBACK")
        assert waited[-2] >= 2.0, waited
        report(f"a 200 ms lock_timeout waited {waited[-2]:.1f} s across a step back of 2 s, "
               f"{waited[3600]:.1f} s across a step forward of an hour")
