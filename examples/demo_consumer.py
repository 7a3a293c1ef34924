#!/usr/bin/env python3
"""Demo: an at-least-once message consumer made exactly-once with the `idempotency` extension.

A simulated broker delivers a stream of order messages to several consumer threads (one database
session each). The stream has duplicates (a message delivered again later, as after a lost ack) and
concurrent redeliveries (several consumers receive the same message at the same instant). Now and then
a consumer "crashes" after doing the work but before committing; the broker then redelivers.

Each delivery is handled in ONE transaction:

    BEGIN;
    SELECT outcome FROM idem_claim(msg_id, scope => run, wait => ...);
      claimed     -> INSERT the business row; SELECT idem_complete(msg_id, payload); COMMIT
      completed   -> duplicate: already done, nothing to do (the stored payload could be replayed)
      in_progress -> duplicate: another consumer holds the message right now; drop this copy (if
                     that consumer crashes, its own delivery is redelivered)
    COMMIT / ROLLBACK

Copies of a concurrent burst claim with wait => false, so the losers return at once; ordinary
deliveries wait (the default) for a holder's transaction and then see `completed`.

Connection from the environment: IDEM_SOCKDIR (socket directory or host), IDEM_PORT, IDEM_DB
(default "demo"), IDEM_USER (default "postgres"). Knobs: DEMO_MESSAGES, DEMO_CONSUMERS, DEMO_SEED.
Exit status 0 when every message produced exactly one business row, 1 otherwise.
"""
import collections
import os
import queue
import random
import sys
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

MESSAGES = int(os.environ.get("DEMO_MESSAGES", "150"))
CONSUMERS = int(os.environ.get("DEMO_CONSUMERS", "6"))
SEED = os.environ.get("DEMO_SEED", "")
DUPLICATE_P = 0.4   # a message gets 1-2 later redeliveries
BURST_P = 0.3       # a message gets delivered to 2-4 consumers at the same instant
CRASH_P = 0.05      # a consumer dies after the work, before COMMIT
RETRY_SQLSTATES = ("40001", "40P01")


def connect():
    return psycopg.connect(
        host=os.environ.get("IDEM_SOCKDIR", "/tmp/idem-sock-54329"),
        port=int(os.environ.get("IDEM_PORT", "54329")),
        dbname=os.environ.get("IDEM_DB", "demo"),
        user=os.environ.get("IDEM_USER", "postgres"),
        autocommit=True,  # transactions are explicit: BEGIN ... COMMIT
    )


class Delivery:
    def __init__(self, msg_id, amount, kind, barrier=None):
        self.msg_id, self.amount, self.kind, self.barrier = msg_id, amount, kind, barrier

    def redelivered(self):
        return Delivery(self.msg_id, self.amount, "redelivery after crash")


def plan_stream(rnd):
    """The broker's stream: each entry is (message, number of simultaneous copies)."""
    messages = [(f"order-{i:04d}", rnd.randint(1, 500)) for i in range(1, MESSAGES + 1)]
    stream, redeliveries, bursts = [], 0, []
    for m in messages:
        stream.append((m, 1))
        if rnd.random() < DUPLICATE_P:
            n = rnd.randint(1, 2)
            stream.extend([(m, 1)] * n)
            redeliveries += n
        if rnd.random() < BURST_P:
            k = rnd.randint(2, min(4, CONSUMERS))
            stream.append((m, k))
            bursts.append(k)
    rnd.shuffle(stream)
    return messages, stream, redeliveries, bursts


def consumer(cid, inbox, run_id, stats, lock, rnd):
    local = collections.Counter()
    with connect() as conn:
        while True:
            d = inbox.get()
            if d is None:
                break
            while d is not None:
                d = handle(conn, cid, d, run_id, local, rnd)
    with lock:
        stats.update(local)


def handle(conn, cid, d, run_id, st, rnd):
    """Process one delivery; return the delivery the broker sends again, or None."""
    st["deliveries"] += 1
    if d.barrier is not None:
        d.barrier.wait()  # all copies of a burst go at the same instant
    try:
        conn.execute("BEGIN")
        outcome, _token, _attempts, _payload = conn.execute(
            "SELECT outcome, token, attempts, payload "
            "FROM idem_claim(%s, scope => %s, wait => %s)",
            (d.msg_id, run_id, d.barrier is None)).fetchone()
        if outcome == "claimed":
            ledger_id = conn.execute(
                "INSERT INTO demo_ledger (run_id, msg_id, amount, consumer) "
                "VALUES (%s, %s, %s, %s) RETURNING id",
                (run_id, d.msg_id, d.amount, cid)).fetchone()[0]
            conn.execute("SELECT idem_complete(%s, payload => %s, scope => %s)",
                         (d.msg_id, Jsonb({"ledger_id": ledger_id, "consumer": cid}), run_id))
            if rnd.random() < CRASH_P:
                conn.execute("ROLLBACK")  # died before COMMIT: nothing of it remains
                st["crashes"] += 1
                return d.redelivered()
            conn.execute("COMMIT")
            st["claimed"] += 1
        elif outcome == "completed":
            conn.execute("COMMIT")
            st["dup_completed"] += 1
        elif outcome == "in_progress":
            conn.execute("ROLLBACK")
            st["dup_in_progress"] += 1
        else:  # failed / mismatch: would go to a dead-letter queue
            conn.execute("ROLLBACK")
            st[f"dead_letter_{outcome}"] += 1
    except psycopg.Error as e:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            pass
        if e.sqlstate in RETRY_SQLSTATES:
            st["retries"] += 1
            return d.redelivered()
        raise
    return None


def main():
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    rnd = random.Random(SEED or run_id)
    with connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        conn.execute("SELECT FROM idem_maintenance()")  # its first partitions
        conn.execute(
            "CREATE TABLE IF NOT EXISTS demo_ledger ("
            " id bigserial PRIMARY KEY, run_id text NOT NULL, msg_id text NOT NULL,"
            " amount numeric NOT NULL, consumer int NOT NULL,"
            " booked_at timestamptz NOT NULL DEFAULT clock_timestamp())")

    messages, stream, redeliveries, bursts = plan_stream(rnd)
    inboxes = [queue.Queue() for _ in range(CONSUMERS)]
    stats, lock = collections.Counter(), threading.Lock()
    threads = [threading.Thread(target=consumer,
                                args=(c, inboxes[c], run_id, stats, lock, random.Random(f"{run_id}/{c}")))
               for c in range(CONSUMERS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    # The broker. Each inbox is FIFO and bursts are enqueued in one global order, so the consumers of
    # a burst always reach its barrier.
    for (msg_id, amount), copies in stream:
        if copies == 1:
            inboxes[rnd.randrange(CONSUMERS)].put(Delivery(msg_id, amount, "single"))
        else:
            barrier = threading.Barrier(copies, timeout=60)
            for c in rnd.sample(range(CONSUMERS), copies):
                inboxes[c].put(Delivery(msg_id, amount, "burst copy", barrier))
    for inbox in inboxes:
        inbox.put(None)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0

    with connect() as conn:
        rows, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT msg_id) FROM demo_ledger WHERE run_id = %s",
            (run_id,)).fetchone()
        completed = sum(
            1 for (m, _a) in messages
            if conn.execute("SELECT status FROM idem_status(%s, scope => %s)",
                            (m, run_id)).fetchone() == ("completed",))

    suppressed = stats["dup_completed"] + stats["dup_in_progress"]
    dead = sum(v for k, v in stats.items() if k.startswith("dead_letter_"))
    lines = [
        ("messages (distinct)", len(messages), ""),
        ("deliveries", stats["deliveries"],
         f"{len(messages)} first + {redeliveries} later redeliveries + {sum(bursts)} copies in "
         f"{len(bursts)} simultaneous bursts + {stats['crashes'] + stats['retries']} after "
         f"crashes/retries"),
        ("claimed and committed", stats["claimed"], ""),
        ("crashed before COMMIT", stats["crashes"], "rolled back, redelivered"),
        ("duplicates suppressed", suppressed,
         f"completed {stats['dup_completed']}, in_progress {stats['dup_in_progress']}"),
        ("40001/40P01 retries", stats["retries"], ""),
        ("business rows", rows, f"{distinct} distinct messages"),
        ("keys completed", completed, ""),
    ]
    if dead:
        lines.append(("dead-lettered", dead, "failed / mismatch"))
    print(f"idempotency demo: run {run_id}, {CONSUMERS} consumers, {elapsed:.1f}s")
    for label, value, note in lines:
        print(f"  {label:<24}{value:6d}" + (f"   ({note})" if note else ""))
    ok = rows == distinct == len(messages) == completed == stats["claimed"]
    print(f"check: business rows ({rows}) == distinct messages ({len(messages)}): "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
