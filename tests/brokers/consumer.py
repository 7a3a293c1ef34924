#!/usr/bin/env python3
"""One consumer process of the RabbitMQ / NATS JetStream exactly-once runs, written against the Python
package idempotency_client (clients/python), the way a user of the package would write it.

Per batch of deliveries (up to BROKERS_BATCH messages):
1. the payment, outside the database, in TWO-TRANSACTION mode: one ``lease`` per key (idem_claim with a
   lease and a fencing token, committed; heartbeats on a connection of their own while the work runs; one
   charge at the HTTP provider, the key as its Idempotency-Key; idem_complete with the token at the end of
   the block). A key leased by another holder (InProgress) is tried again after a pause, as is a key whose
   lease was taken over while we were slow or frozen (LeaseLost: the new holder does it; we replay it);
2. the ledger, inside the database, in ONE transaction: RabbitMQ with ``process_batch`` (idem_claim_batch,
   one ledger row per claimed key under a savepoint, idem_complete_batch, COMMIT; re-run on 40001/40P01);
   NATS with the asyncio forms, ``@aio.idempotent`` per message (idem_claim, the row, idem_complete, under a
   savepoint) inside ``aio.run_transaction`` (one transaction for the batch, re-run on 40001/40P01);
3. then the acknowledgement to the broker: basic_ack(multiple) of the batch's last delivery tag
   (RabbitMQ, manual acks), or an ack per message (JetStream, explicit ack policy).
RabbitMQ's consumer is synchronous (pika's BlockingConnection, psycopg.Connection, ``lease`` with a heartbeat
thread); the NATS one is asyncio (nats-py, psycopg.AsyncConnection, ``aio.lease`` with a heartbeat task).
A consumer killed anywhere before 3 leaves its deliveries unacknowledged: RabbitMQ requeues them when the
connection drops, JetStream redelivers them after the consumer's AckWait. Those redeliveries, and the
producer's duplicates, meet completed keys in step 2 (and replay their charges in step 1).

Chaos: the driver may arm a point (RUN_DIR/arm-<cid>): after_http, mid_txn (in the ledger transaction,
after a ledger row was written), after_commit (committed, not acknowledged), or freeze_after_http /
freeze_after_commit (SIGSTOP until the driver's SIGCONT, past the payment leases, RabbitMQ's heartbeat
timeout and JetStream's AckWait). SIGTERM: finish the batch, leave. Exit status 4: the broker connection
was lost (a zombie woken after the broker gave it up); the driver starts a fresh member.

Usage: consumer.py rabbitmq|nats CID   (the rest comes from the environment; see brokers.py)
"""
import asyncio
import collections
import json
import os
import signal
import sys
import time

import psycopg

from idempotency_client import InProgress, LeaseLost, aio, process_batch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exactly_once import (BUSY_PAUSE_S, PAY_DEADLINE_S, EventLog, Provider, amounts_of, chaos_points,  # noqa: E402
                          count_claim, lease_lost, pay_counters, pay_with_leases)

BROKER, CID = sys.argv[1], sys.argv[2]
ENV = os.environ
RUN_DIR = ENV["BROKERS_RUN_DIR"]
DSN = ENV["BROKERS_DSN"]
LEASE = float(ENV.get("BROKERS_LEASE_S", "8"))
BATCH = int(ENV.get("BROKERS_BATCH", "50"))
BATCH_WAIT = 0.5     # the longest a batch waits to fill up
KEEPALIVE_S = 1.0    # how often the broker hears from a consumer whose batch takes long
STOP = False
event = EventLog(RUN_DIR, CID)
chaos_point = chaos_points(RUN_DIR, CID, event)

LEDGER_INSERT = ("INSERT INTO e2e.ledger (msg_key, partition, kafka_offset, amount, charge, consumer)"
                 " VALUES (%s, %s, %s, %s, %s, %s)")
# Under chaos a payment key can be taken over many times; the default (5) would make it terminal.
MAX_ATTEMPTS_SQL = "SET idempotency.max_attempts = 1000"


def on_sigterm(*_):
    global STOP
    STOP = True


def parse(body):
    return json.loads(body)["amount"]


def ledger_row(m, charge):
    return (m["key"], m.get("partition"), m.get("offset"), m["amount"], charge, CID)


def log_batch(msgs):
    event("batch", n=len(msgs), keys=[m["key"] for m in msgs], redelivered=sum(m["redelivered"] for m in msgs))


# ---- RabbitMQ: a classic durable queue, manual acks, prefetch; the synchronous API ------------------


class SyncProcessor:
    """Steps 1 and 2 of a batch with psycopg.Connection; run_rabbitmq does the receiving and step 3."""

    def __init__(self):
        self.db = psycopg.connect(DSN, autocommit=True, application_name=f"{BROKER}-c{CID}")
        self.db.execute(MAX_ATTEMPTS_SQL)
        # the leases' heartbeats: one connection for the process, not one per lease
        self.hb = psycopg.connect(DSN, autocommit=True, application_name=f"{BROKER}-c{CID}-heartbeats")
        self.provider = Provider(int(ENV["BROKERS_PROVIDER_PORT"]))

    def process(self, msgs, keepalive):
        """msgs: [{key, amount, redelivered, tag}]. Returns after the ledger transaction committed."""
        log_batch(msgs)
        charges, pay_st = self.pay(msgs, keepalive)
        event("paid", pay=pay_st)
        ledger_st = self.apply_ledger(msgs, charges)
        event("applied", ledger=ledger_st)
        chaos_point("after_commit")

    def pay(self, msgs, keepalive):
        return pay_with_leases(self.db, self.hb, self.provider, msgs, LEASE, event, chaos_point, keepalive)

    def apply_ledger(self, msgs, charges):
        def apply(conn, m):  # under process_batch's savepoint, in its transaction
            conn.execute(LEDGER_INSERT, ledger_row(m, charges[m["key"]]))
            chaos_point("mid_txn")
            return {"charge": charges[m["key"]]}

        items = process_batch(self.db, msgs, apply, key=lambda m: m["key"], scope="ledger")
        n = collections.Counter(i.outcome for i in items)
        if n["failed"]:  # nothing here makes one; a run that sees one is broken
            raise RuntimeError(f"ledger items failed: {[i.error for i in items if i.outcome == 'failed'][:3]}")
        return {"claimed": n["processed"], "completed": n["replayed"], "in_batch_repeat": n["duplicate"]}


def run_rabbitmq():
    import pika
    import pika.exceptions

    proc = SyncProcessor()
    params = pika.ConnectionParameters(host="127.0.0.1", port=int(ENV["BROKERS_AMQP_PORT"]),
                                       heartbeat=int(ENV.get("BROKERS_AMQP_HEARTBEAT", "4")),
                                       connection_attempts=5, retry_delay=0.5)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=BATCH)
    deliveries = ch.consume(ENV["BROKERS_QUEUE"], auto_ack=False, inactivity_timeout=0.2)
    event("start", broker="rabbitmq")
    last = [time.monotonic()]

    def keepalive():  # pika's heartbeats only go out while pika runs: let it, during long work
        if time.monotonic() - last[0] >= KEEPALIVE_S:
            conn.process_data_events(0)
            last[0] = time.monotonic()

    try:
        while not STOP:
            batch, started = [], time.monotonic()
            for method, props, body in deliveries:
                if method is None:  # 0.2 s without a delivery
                    break
                key = (props.headers or {})["idempotency-key"]
                batch.append({"key": key, "amount": parse(body), "redelivered": bool(method.redelivered),
                              "tag": method.delivery_tag})
                if len(batch) >= BATCH or time.monotonic() - started > BATCH_WAIT or STOP:
                    break
            if not batch:
                continue
            last[0] = time.monotonic()
            proc.process(batch, keepalive)
            # every earlier tag of this channel was acknowledged with an earlier batch
            ch.basic_ack(delivery_tag=batch[-1]["tag"], multiple=True)
            event("acked", n=len(batch))
        ch.cancel()  # deliveries prefetched but not processed go back to the queue
        conn.close()
    except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as e:
        # e.g. woken after a SIGSTOP: the broker closed the connection (missed heartbeats) and requeued
        # our deliveries; the batch's ledger transaction committed or met completed keys: nothing is lost
        event("connection_lost", error=repr(e))
        sys.exit(4)
    event("stop")


# ---- NATS JetStream: a durable pull consumer, explicit acks, a short AckWait; the asyncio API ------


@aio.idempotent("ledger")
async def apply_entry(conn, m, charge):
    """One message's ledger row; called f(conn, key, m, charge) inside the batch's transaction: the claim,
    the row and the completion under a savepoint of it. Returns (result, replayed)."""
    await conn.execute(LEDGER_INSERT, ledger_row(m, charge))
    return {"charge": charge}


class AsyncProcessor:
    """Steps 1 and 2 of a batch with psycopg.AsyncConnection; run_nats_async does the rest."""

    async def open(self):
        self.db = await psycopg.AsyncConnection.connect(DSN, autocommit=True, application_name=f"{BROKER}-c{CID}")
        await self.db.execute(MAX_ATTEMPTS_SQL)
        self.hb = await psycopg.AsyncConnection.connect(DSN, autocommit=True,
                                                        application_name=f"{BROKER}-c{CID}-heartbeats")
        self.provider = Provider(int(ENV["BROKERS_PROVIDER_PORT"]))
        return self

    async def process(self, msgs, keepalive):
        log_batch(msgs)
        charges, pay_st = await self.pay(msgs, keepalive)
        event("paid", pay=pay_st)
        ledger_st = await self.apply_ledger(msgs, charges)
        event("applied", ledger=ledger_st)
        chaos_point("after_commit")

    async def pay(self, msgs, keepalive):
        amounts, charges, st = amounts_of(msgs), {}, pay_counters()
        todo, deadline = list(amounts), time.monotonic() + PAY_DEADLINE_S
        while todo:
            if time.monotonic() > deadline:
                raise RuntimeError(f"payment keys stuck in progress: {todo[:5]}")
            busy = []
            for key in todo:
                await keepalive()
                l = None
                try:
                    async with aio.lease(self.db, key, scope="payment", ttl=LEASE, heartbeat_conn=self.hb) as l:
                        count_claim(st, l)
                        if not l.replayed:
                            # blocking HTTP off the event loop: the heartbeat task and nats-py keep running
                            body, dedup = await asyncio.to_thread(self.provider.charge, key, amounts[key])
                            st["provider_dedup"] += dedup
                            chaos_point("after_http")
                            l.result = {"charge": body["charge"]}
                except InProgress:
                    busy.append(key)
                    continue
                except LeaseLost as e:
                    lease_lost(st, key, e, event)
                    busy.append(key)
                    continue
                finally:
                    st["heartbeats"] += l.beats if l is not None else 0
                charges[key] = l.result["charge"]
            todo = busy
            if busy:
                st["waited"] += len(busy)
                pause = time.monotonic() + BUSY_PAUSE_S
                while time.monotonic() < pause:
                    await keepalive()
                    await asyncio.sleep(0.1)
        return charges, st

    async def apply_ledger(self, msgs, charges):
        async def batch_transaction(conn):  # run again as a whole on 40001 / 40P01
            st = {"claimed": 0, "completed": 0, "in_batch_repeat": 0}
            seen = set()
            for m in msgs:
                if m["key"] in seen:  # a producer retry in the same batch: the first one applies it
                    st["in_batch_repeat"] += 1
                    continue
                seen.add(m["key"])
                _, replayed = await apply_entry(conn, m["key"], m, charges[m["key"]])
                st["completed" if replayed else "claimed"] += 1
                if not replayed:
                    chaos_point("mid_txn")
            return st

        return await aio.run_transaction(self.db, batch_transaction)


async def run_nats_async():
    import nats
    import nats.errors

    proc = await AsyncProcessor().open()
    nc = await nats.connect(f"nats://127.0.0.1:{ENV['BROKERS_NATS_PORT']}", name=f"c{CID}",
                            max_reconnect_attempts=5)
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind(durable=ENV["BROKERS_DURABLE"], stream=ENV["BROKERS_STREAM"])
    event("start", broker="nats")
    while not STOP:
        msgs, started = [], time.monotonic()
        while len(msgs) < BATCH and not STOP:  # fill the batch for up to BATCH_WAIT (a fetch returns early)
            left = BATCH_WAIT - (time.monotonic() - started)
            if left < 0.05:
                break
            try:
                msgs += await sub.fetch(batch=BATCH - len(msgs), timeout=left)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nothing more within the time left
                break
        if not msgs:
            continue
        batch = []
        for m in msgs:
            md = m.metadata
            batch.append({"key": m.headers["Idempotency-Key"], "amount": parse(m.data),
                          "redelivered": md.num_delivered > 1, "offset": md.sequence.stream})
        last = [time.monotonic()]

        async def keepalive(msgs=msgs):  # +AckWait for the batch's messages (JetStream "work in progress")
            if time.monotonic() - last[0] >= KEEPALIVE_S:
                last[0] = time.monotonic()
                for m in msgs:
                    await m.in_progress()

        await proc.process(batch, keepalive)
        for m in msgs:
            await m.ack()
        await nc.flush()
        event("acked", n=len(batch))
    await sub.unsubscribe()
    await nc.close()
    event("stop")


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    if BROKER == "rabbitmq":
        run_rabbitmq()
    elif BROKER == "nats":
        asyncio.run(run_nats_async())
    else:
        raise SystemExit(f"unknown broker {BROKER}")


if __name__ == "__main__":
    main()
