"""The timeout handler under the fake clock. PostgreSQL's SIGALRM handler (handle_sig_alarm) reads the wall
clock to see which timeouts are due, so under libfaketime that read runs inside a signal handler, which may
have interrupted malloc or free. libfaketime's own reading of a clock file allocates (fopen): once a backend
running idem_maintenance(), whose partition locks wait under lock_timeout, aborted with "malloc(): unsorted
double linked list corrupted". fakeclock_waits.c now feeds libfaketime the file's line without allocating,
and the clock layer's server runs with IDEM_FAKECLOCK_STRICT=1, under which any allocation inside that
handler aborts the backend at once: this case makes the handler run hundreds of times while a backend waits
for a lock under statement_timeout (with libfaketime reading the file itself, the first signal aborts it).
"""
import os
import signal
import threading
import time


def test_the_timeout_handler_reads_the_clock_without_allocating(server, report):
    c = server.cluster
    offset = c.log_size()
    with c.connect() as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS signal_case ()")
    holder = c.connect(autocommit=False)
    waiter = c.connect()
    try:
        holder.execute("LOCK TABLE signal_case")
        pid = waiter.execute("SELECT pg_backend_pid()").fetchone()[0]
        waiter.execute("SET statement_timeout = '1h'")   # a timeout pending: each SIGALRM reads the clock
        outcome = {}

        def wait_for_the_lock():
            try:
                waiter.execute("SELECT count(*) FROM signal_case")
                outcome["locked"] = True
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = e

        t = threading.Thread(target=wait_for_the_lock)
        t.start()
        with c.connect() as watch:
            def waiting():
                # (Its lock request not granted: each SIGALRM wakes the waiter, which clears its wait event
                # between two waits, but its request stays in pg_locks until it is granted.)
                return watch.execute("SELECT NOT granted FROM pg_locks WHERE pid = %s AND locktype = 'relation'"
                                     " AND relation = 'signal_case'::regclass", (pid,)).fetchone() == (True,)
            deadline = time.monotonic() + 30
            while not waiting():
                assert time.monotonic() < deadline and t.is_alive(), f"the waiter never waited: {outcome}"
                time.sleep(0.01)
            sent = 0
            for _ in range(500):
                os.kill(pid, signal.SIGALRM)
                sent += 1
                time.sleep(0.001)
            still = waiting()
        holder.rollback()
        t.join(60)
    finally:
        holder.close()
        waiter.close()
    log = c.log_since(offset)
    assert still, f"the waiter stopped waiting during the signals: {outcome}; log: {log[-2000:]}"
    assert outcome == {"locked": True}, f"{outcome}; log: {log[-2000:]}"
    assert "allocation inside the SIGALRM handler" not in log and "terminated by signal" not in log, log[-2000:]
    report(f"{sent} SIGALRM to a backend waiting for a lock under statement_timeout: it kept waiting, then locked")
