#!/usr/bin/env python3
"""Publishes M payment messages to RabbitMQ or NATS JetStream, in bursts paced over a duration, with retry
duplicates.

Each message: header idempotency key `pay-<run>-<i>`, body {"order": i, "amount": cents}. A fraction
DUP_P of them is published a second time 5-300 messages later, with the same key and body: what an
application-level producer retry does after a lost acknowledgement. Every publish is confirmed by the
broker before the next one (RabbitMQ publisher confirms, persistent messages; JetStream's PubAck), so the
duplicates really are in the queue / stream twice. On JetStream no Nats-Msg-Id is set: the stream's own
duplicate window would otherwise drop the retries, and the point is to see the consumers suppress them.

Writes OUT (a JSON file) when done: the (key, amount) pairs produced and the count of records published.
Usage: producer.py rabbitmq|nats RUN M SECONDS DUP_P OUT   (broker address from the environment)
"""
import asyncio
import json
import os
import random
import sys
import time

ENV = os.environ


def plan(run, m, dup_p):
    """The sequence of publishes: [(key, amount, body)] with the duplicates in place, and the messages."""
    rnd = random.Random(run)
    messages, out, pending = [], [], []
    for i in range(m):
        key, amount = f"pay-{run}-{i}", rnd.randint(100, 99999)
        messages.append((key, amount))
        rec = (key, json.dumps({"order": i, "amount": amount}).encode())
        out.append(rec)
        if rnd.random() < dup_p:  # the "retry": the same message again, 5-300 messages later
            pending.append((i + rnd.randint(5, 300), rec))
        for due in [d for d in pending if d[0] <= i]:
            out.append(due[1])
            pending.remove(due)
    out += [rec for _, rec in pending]
    return messages, out


BURST = 40  # published back to back, then a pause: consumers get full batches, so a kill finds many in flight


def pause(j, n, seconds, start):
    """How long to wait after publish j of n so that bursts of BURST spread evenly over `seconds`."""
    if (j + 1) % BURST:
        return 0
    return start + seconds * (j + 1) / n - time.monotonic()


def paced(records, seconds):
    start = time.monotonic()
    for j, rec in enumerate(records):
        yield rec
        ahead = pause(j, len(records), seconds, start)
        if ahead > 0:
            time.sleep(ahead)


def publish_rabbitmq(records, seconds):
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1",
                                                             port=int(ENV["BROKERS_AMQP_PORT"])))
    ch = conn.channel()
    ch.confirm_delivery()  # basic_publish returns once the broker confirmed (raises if it nacks)
    for key, body in paced(records, seconds):
        ch.basic_publish(exchange="", routing_key=ENV["BROKERS_QUEUE"], body=body, mandatory=True,
                         properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent,
                                                         headers={"idempotency-key": key},
                                                         content_type="application/json"))
    conn.close()


async def publish_nats(records, seconds):
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{ENV['BROKERS_NATS_PORT']}", name="producer")
    js = nc.jetstream()
    start = time.monotonic()
    for j, (key, body) in enumerate(records):
        ack = await js.publish(ENV["BROKERS_SUBJECT"], body, headers={"Idempotency-Key": key}, timeout=10)
        if ack.duplicate:
            raise RuntimeError(f"the stream dropped {key} as a duplicate")
        ahead = pause(j, len(records), seconds, start)
        if ahead > 0:
            await asyncio.sleep(ahead)
    await nc.close()


def main():
    broker, run, m, seconds, dup_p, out = sys.argv[1:7]
    messages, records = plan(run, int(m), float(dup_p))
    start = time.monotonic()
    if broker == "rabbitmq":
        publish_rabbitmq(records, float(seconds))
    else:
        asyncio.run(publish_nats(records, float(seconds)))
    with open(out, "w") as f:
        json.dump({"messages": messages, "records": len(records)}, f)
    print(f"producer: {len(messages)} messages, {len(records)} records in {time.monotonic() - start:.0f}s",
          flush=True)


if __name__ == "__main__":
    main()
