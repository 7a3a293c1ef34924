#!/usr/bin/env python3
"""One consumer process of the RabbitMQ / NATS JetStream exactly-once runs.

Per batch of deliveries (up to BROKERS_BATCH messages):
1. the payment, outside the database, in TWO-TRANSACTION mode (exactly_once.pay: idem_claim_batch with a
   lease and fencing tokens, committed; one charge per key at the HTTP provider, its key as
   Idempotency-Key; idem_complete_batch with the tokens; 55006 when a lease was taken over);
2. the ledger, inside the database, in ONE transaction (exactly_once.apply_ledger): the claims of the
   messages' keys (idem_claim_batch for RabbitMQ, one idem_claim per message for NATS), one ledger row
   per claimed key, their completions, COMMIT;
3. then the acknowledgement to the broker: basic_ack(multiple) of the batch's last delivery tag
   (RabbitMQ, manual acks), or an ack per message (JetStream, explicit ack policy).
A consumer killed anywhere before 3 leaves its deliveries unacknowledged: RabbitMQ requeues them when the
connection drops, JetStream redelivers them after the consumer's AckWait. Those redeliveries, and the
producer's duplicates, meet completed keys in step 2 (and replay their charges in step 1).

Chaos: the driver may arm a point (RUN_DIR/arm-<cid>): after_http, mid_txn, after_commit (committed, not
acknowledged), or freeze_after_http / freeze_after_commit (SIGSTOP until the driver's SIGCONT, past the
payment leases, RabbitMQ's heartbeat timeout and JetStream's AckWait). SIGTERM: finish the batch, leave.
Exit status 4: the broker connection was lost (a zombie woken after the broker gave it up); the driver
starts a fresh member.

Usage: consumer.py rabbitmq|nats CID   (the rest comes from the environment; see brokers.py)
"""
import asyncio
import json
import os
import signal
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exactly_once import EventLog, Provider, apply_ledger, chaos_points, pay  # noqa: E402

BROKER, CID = sys.argv[1], sys.argv[2]
ENV = os.environ
RUN_DIR = ENV["BROKERS_RUN_DIR"]
LEASE = float(ENV.get("BROKERS_LEASE_S", "8"))
BATCH = int(ENV.get("BROKERS_BATCH", "50"))
BATCH_WAIT = 0.5  # the longest a batch waits to fill up
CLAIM = ENV.get("BROKERS_CLAIM", "batch")  # batch: idem_claim_batch; single: one idem_claim per message
STOP = False
event = EventLog(RUN_DIR, CID)
chaos_point = chaos_points(RUN_DIR, CID, event)


def on_sigterm(*_):
    global STOP
    STOP = True


def connect_db():
    db = psycopg.connect(ENV["BROKERS_DSN"], autocommit=True, application_name=f"{BROKER}-c{CID}")
    # Under chaos a payment key can be taken over many times; the default (5) would make it terminal.
    db.execute("SET idempotency.max_attempts = 1000")
    return db


class Processor:
    """Steps 1 and 2 of a batch; the broker-specific loops below do the receiving and step 3."""

    def __init__(self):
        self.db = connect_db()
        self.provider = Provider(int(ENV["BROKERS_PROVIDER_PORT"]))

    def process(self, msgs, keepalive=None):
        """msgs: [{key, amount, redelivered, tag, offset?}]. Returns after the ledger transaction committed."""
        event("batch", n=len(msgs), keys=[m["key"] for m in msgs],
              redelivered=sum(m["redelivered"] for m in msgs))
        charges, pay_st = pay(self.db, self.provider, msgs, LEASE, chaos_point, keepalive)
        event("paid", pay=pay_st)
        ledger_st = apply_ledger(self.db, msgs, charges, CID, claim=CLAIM, chaos_point=chaos_point)
        event("applied", ledger=ledger_st)
        chaos_point("after_commit")


def parse(body):
    return json.loads(body)["amount"]


# ---- RabbitMQ: a classic durable queue, manual acks, prefetch ----------------------------------------


def run_rabbitmq():
    import pika
    import pika.exceptions

    proc = Processor()
    params = pika.ConnectionParameters(host="127.0.0.1", port=int(ENV["BROKERS_AMQP_PORT"]),
                                       heartbeat=int(ENV.get("BROKERS_AMQP_HEARTBEAT", "4")),
                                       connection_attempts=5, retry_delay=0.5)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=BATCH)
    deliveries = ch.consume(ENV["BROKERS_QUEUE"], auto_ack=False, inactivity_timeout=0.2)
    event("start", broker="rabbitmq")

    def keepalive():  # pika's heartbeats only go out while pika runs: let it, during long work
        conn.process_data_events(0)

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


# ---- NATS JetStream: a durable pull consumer, explicit acks, a short AckWait -------------------------


async def run_nats_async():
    import nats
    import nats.errors

    proc = Processor()
    loop = asyncio.get_running_loop()
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
                          "redelivered": md.num_delivered > 1, "offset": md.sequence.stream, "msg": m})

        def keepalive(batch=batch):  # from the worker thread: +AckWait for the batch (WPI)
            for x in batch:
                asyncio.run_coroutine_threadsafe(x["msg"].in_progress(), loop)

        await asyncio.to_thread(proc.process, [{k: v for k, v in x.items() if k != "msg"} for x in batch],
                                keepalive)
        for x in batch:
            await x["msg"].ack()
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
