"""The confluent-kafka helper against a real cluster, with a thin fake of the broker side only.

FakeConsumer stands in for confluent_kafka.Consumer's broker-facing methods (subscribe, consume, assign,
seek, commit, consumer_group_metadata): an in-memory log per partition, a group generation that the test
bumps to simulate rebalances, committed offsets. Everything on the database side is real, and the
partitions are real confluent_kafka.TopicPartition objects. No broker runs in these tests; the README says so.
"""
import sys

import confluent_kafka
import pytest
from confluent_kafka import OFFSET_INVALID, TopicPartition
from psycopg.types.json import Jsonb

from idempotency_client import Fenced, TerminalError
from idempotency_client.kafka import IdempotentConsumer, UnsupportedGroupMetadata, group_generation, header_key

from conftest import count, status


class FakeMessage:
    def __init__(self, topic, partition, offset, key, value, headers):
        self._t, self._p, self._o, self._k, self._v, self._h = topic, partition, offset, key, value, headers

    def topic(self): return self._t
    def partition(self): return self._p
    def offset(self): return self._o
    def key(self): return self._k
    def value(self): return self._v
    def headers(self): return self._h
    def error(self): return None


class FakeConsumer:
    def __init__(self, group, logs):
        self.group, self.logs = group, logs  # logs: {(topic, partition): [FakeMessage]}, shared "broker"
        self.generation = -1
        self.positions, self.broker_committed, self.on_assign = {}, logs.setdefault("_committed", {}), None

    # librdkafka's serialization: magic, native int32 generation, then group id and more
    def consumer_group_metadata(self):
        return b"CGMDv2:" + self.generation.to_bytes(4, sys.byteorder, signed=True) + self.group.encode() + b"\0"

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None):
        self.topics, self.on_assign, self.on_revoke = topics, on_assign, on_revoke

    def rebalance(self, generation, partitions):
        """What the group coordinator does: a new generation, these partitions for this member."""
        self.generation = generation
        self.positions = {}
        self.on_assign(self, [TopicPartition(t, p) for t, p in partitions])

    def assign(self, partitions):
        for tp in partitions:
            off = tp.offset
            if off < 0:  # OFFSET_INVALID / STORED: the broker's committed offset, else earliest
                off = self.broker_committed.get((tp.topic, tp.partition), 0)
            self.positions[(tp.topic, tp.partition)] = off

    incremental_assign = assign

    def seek(self, tp):
        self.positions[(tp.topic, tp.partition)] = tp.offset

    def consume(self, num_messages=1, timeout=-1):
        out = []
        for tp, pos in sorted(self.positions.items()):
            log = self.logs.get(tp, [])
            take = log[pos:pos + num_messages - len(out)]
            out += take
            self.positions[tp] = pos + len(take)
        return out

    def commit(self, offsets=None, asynchronous=True):
        for tp in offsets:
            self.broker_committed[(tp.topic, tp.partition)] = tp.offset


def produce(logs, topic, partition, key, value):
    log = logs.setdefault((topic, partition), [])
    log.append(FakeMessage(topic, partition, len(log), None, value, [("idempotency-key", key.encode())]))


def test_group_generation_reads_real_librdkafka_metadata():
    c = confluent_kafka.Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "log_level": 0})
    try:
        assert c.consumer_group_metadata()[:7] == b"CGMDv2:"  # the real library's format, no broker needed
        assert group_generation(c) is None  # -1 before joining a group
    finally:
        c.close()

    class M:
        def __init__(self, m): self.m = m
        def consumer_group_metadata(self): return self.m

    assert group_generation(M(b"CGMDv2:" + (17).to_bytes(4, sys.byteorder, signed=True) + b"g\0")) == 17
    with pytest.raises(UnsupportedGroupMetadata):
        group_generation(M(b"CGMDv3:\0\0\0\1"))
    with pytest.raises(UnsupportedGroupMetadata):
        group_generation(M(object()))


def make_apply(table, calls):
    def apply(conn, msg):
        calls.append(msg.offset())
        if msg.value() == b"poison":
            raise TerminalError("unparseable")
        conn.execute(f"INSERT INTO {table} (k, v) VALUES (%s, %s)", (header_key()(msg), Jsonb(msg.value().decode())))
        return {"offset": msg.offset()}
    return apply


def test_seek_from_database_process_and_crash_before_broker_commit(connect, table, scope):
    logs, calls = {}, []
    for i in range(10):
        produce(logs, "orders", i % 2, f"order-{i // 2 if i % 5 == 0 else i}", f"v{i}".encode())
    conn = connect()
    group = "svc-" + scope
    c1 = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c1, conn, group, commit_to_broker=False)  # "crashes" before every broker commit
    ic.subscribe(["orders"])
    c1.rebalance(4, [("orders", 0), ("orders", 1)])
    assert ic.generation == 4
    out = ic.process(ic.poll_batch(100), make_apply(table, calls))
    assert len(out) == 10 and c1.broker_committed == {}
    applied = count(conn, table)
    assert applied == len({header_key()(m) for m in sum((logs[("orders", p)] for p in (0, 1)), [])})
    # a new member of the group: the broker has nothing committed, the database says where to go on
    c2 = FakeConsumer(group, logs)
    ic2 = IdempotentConsumer(c2, conn, group)
    ic2.subscribe(["orders"])
    c2.rebalance(5, [("orders", 0), ("orders", 1)])
    assert c2.positions == {("orders", 0): 5, ("orders", 1): 5}
    assert ic2.poll_batch(100) == []
    produce(logs, "orders", 1, "order-new", b"vnew")
    calls.clear()
    out = ic2.process(ic2.poll_batch(100), make_apply(table, calls))
    assert [i.outcome for i in out] == ["processed"] and calls == [5]
    assert c2.broker_committed[("orders", 1)] == 6  # the courtesy commit after the database's
    assert count(conn, table) == applied + 1


def test_zombie_is_fenced_and_rewound(connect, table, scope):
    logs, calls = {}, []
    for i in range(4):
        produce(logs, "pay", 0, f"p{i}", b"x")
    conn, group = connect(), "z-" + scope
    old, new = FakeConsumer(group, logs), FakeConsumer(group, logs)
    zombie, live = IdempotentConsumer(old, conn, group), IdempotentConsumer(new, connect(), group)
    zombie.subscribe(["pay"])
    live.subscribe(["pay"])
    old.rebalance(7, [("pay", 0)])
    batch = zombie.poll_batch(2)  # polled in generation 7, then the zombie stalls
    new.rebalance(8, [("pay", 0)])  # the partition moves on
    live.process(live.poll_batch(100), make_apply(table, calls))
    with pytest.raises(Fenced) as ei:
        zombie.process(batch, make_apply(table, calls))
    assert ei.value.generation == 7 and ei.value.partition == 0
    assert old.positions[("pay", 0)] == 0  # rewound to the batch's first offset
    assert count(conn, table) == 4 and calls == [0, 1, 2, 3]  # its keys were done: replayed, then fenced
    # a message only the zombie has: its handler runs, and its work goes with the fenced transaction
    produce(logs, "pay", 0, "p4", b"x")
    with pytest.raises(Fenced):
        zombie.process([logs[("pay", 0)][4]], make_apply(table, calls))
    assert calls[-1] == 4 and count(conn, table) == 4 and status(conn, "p4", "z-" + scope) is None


def test_handle_one_message_with_dead_letter(connect, table, scope):
    logs, calls = {}, []
    produce(logs, "t", 0, "a", b"ok")
    produce(logs, "t", 0, "b", b"poison")
    produce(logs, "t", 0, "a", b"ok")
    conn, group = connect(), "h-" + scope
    c = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["t"])
    c.rebalance(1, [("t", 0)])
    m0, m1, m2 = ic.poll_batch(3)
    assert ic.handle(m0, make_apply(table, calls)) == ({"offset": 0}, False)
    with pytest.raises(TerminalError):  # terminal: recorded and the offset moves past it: dead-letter it
        ic.handle(m1, make_apply(table, calls))
    assert ic.handle(m2, make_apply(table, calls)) == ({"offset": 0}, True)
    assert status(conn, "b", scope)["status"] == "failed" and count(conn, table) == 1
    assert ic.stored_offsets() == {("t", 0): 3} and c.broker_committed[("t", 0)] == 3


def test_handle_retryable_failure_rewinds(connect, table, scope):
    logs = {}
    produce(logs, "t", 0, "r", b"x")
    conn, group = connect(), "r-" + scope
    c = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["t"])
    c.rebalance(1, [("t", 0)])
    (m,) = ic.poll_batch(1)

    def flaky(conn, msg):
        raise OSError("disk full")

    with pytest.raises(OSError):
        ic.handle(m, flaky)
    assert c.positions[("t", 0)] == 0 and ic.stored_offsets() == {}
    assert status(conn, "r", scope)["error"]["error"] == "OSError"


class PollingFakeConsumer(FakeConsumer):
    """FakeConsumer with the poll-loop surface examples/python/orders.py uses (poll, committed, close): the
    first poll delivers the assignment of every partition of the log in a new generation, as a join does."""

    generations = iter(range(10, 1000))

    def __init__(self, conf, logs):
        super().__init__(conf["group.id"], logs)

    def poll(self, timeout=None):
        if not self.positions:
            parts = sorted(k for k in self.logs if isinstance(k, tuple) and k[0] in self.topics)
            self.rebalance(next(self.generations), parts)
        got = self.consume(1)
        return got[0] if got else None

    def committed(self, partitions, timeout=None):
        return [TopicPartition(tp.topic, tp.partition, self.broker_committed.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in partitions]

    def commit(self, message=None, offsets=None, asynchronous=True):
        if message is not None:
            self.broker_committed[(message.topic(), message.partition())] = message.offset() + 1
        else:
            super().commit(offsets=offsets, asynchronous=asynchronous)

    def close(self):
        pass


def test_the_python_example_consume_loop(connect, monkeypatch):
    """examples/python/orders.py's consume() (its decorator and offsets now from this package), run twice
    against the fake broker side: the first run "crashes" before its last broker commit, the second finds
    nothing to redo, as in the example's own check against a real broker."""
    import importlib.util
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("orders_example", root / "examples" / "python" / "orders.py")
    orders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(orders)
    logs = {}
    monkeypatch.setattr(orders, "Consumer", lambda conf: PollingFakeConsumer(conf, logs))
    conn = connect()
    conn.execute("DROP TABLE IF EXISTS orders")
    conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, customer text, amount int)")
    for i in range(40):
        for _ in range(2 if i % 4 == 0 else 1):
            log = logs.setdefault((orders.TOPIC, i % 2), [])
            log.append(FakeMessage(orders.TOPIC, i % 2, len(log), f"cust-{i % 7}".encode(),
                                   json.dumps({"customer": f"cust-{i % 7}", "amount": 100 + i}).encode(),
                                   [("idempotency-key", f"order-{i}".encode())]))
    ends = {p: len(logs[(orders.TOPIC, p)]) for p in (0, 1)}
    applied, replayed = orders.consume(conn, ends, skip_last_broker_commit=True)
    applied2, replayed2 = orders.consume(conn, ends)
    assert (applied, replayed, applied2, replayed2) == (40, 10, 0, 0)
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 40
    conn.execute("DROP TABLE orders")


class RebalancingFakeConsumer(FakeConsumer):
    """A broker whose synchronous commit fails the way librdkafka's does during a rebalance."""

    def __init__(self, group, logs, code):
        super().__init__(group, logs)
        self.code, self.commit_calls = code, 0

    def commit(self, offsets=None, asynchronous=True):
        self.commit_calls += 1
        raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(self.code))


def test_broker_commit_failure_after_the_database_committed_is_not_raised(connect, table, scope, caplog):
    logs, calls = {}, []
    for i in range(3):
        produce(logs, "orders", 0, f"c{i}", b"v")
    produce(logs, "orders", 0, "c3", b"v")
    conn, group = connect(), "cm-" + scope
    c = RebalancingFakeConsumer(group, logs, confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["orders"])
    c.rebalance(2, [("orders", 0)])
    msgs = ic.poll_batch(3)
    with caplog.at_level("WARNING", logger="idempotency_client.kafka"):
        out = ic.process(msgs, make_apply(table, calls))  # the loop goes on: the database has committed
    assert [i.outcome for i in out] == ["processed"] * 3 and c.commit_calls == 1
    assert isinstance(ic.last_commit_error, confluent_kafka.KafkaException) and ic.commit_errors == 1
    assert ic.last_commit_error.args[0].code() == confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS
    assert any("broker offset commit" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert count(conn, table) == 3 and ic.stored_offsets() == {("orders", 0): 3}
    assert c.positions[("orders", 0)] == 3  # not rewound: the poll is done
    # handle() too
    (m,) = ic.poll_batch(1)
    assert ic.handle(m, make_apply(table, calls)) == ({"offset": 3}, False)
    assert ic.commit_errors == 2 and ic.stored_offsets() == {("orders", 0): 4}


def _hold_key(connect, scope, key, started, release):
    """Claims key in a transaction of its own and keeps it open until release, then commits."""
    from idempotency_client import idempotent_call

    conn = connect()
    with idempotent_call(conn, key, scope=scope) as call:
        started.set()
        release.wait(10)
        call.result = {"offset": "held"}


def test_process_retries_a_real_serialization_failure(connect, table, scope):
    """A concurrent transaction commits the key the poll waits on: at REPEATABLE READ the claim fails with
    40001; process() runs the whole poll again by default, which replays the key and processes the rest."""
    import threading

    logs, calls = {}, []
    produce(logs, "orders", 0, "held", b"v")
    produce(logs, "orders", 0, "free", b"v")
    conn, group = connect(), "ser-" + scope
    c = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["orders"])
    c.rebalance(3, [("orders", 0)])
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_key, args=(connect, scope, "held", started, release))
    holder.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()  # commits while the poll's claim waits on the key
    try:
        out = ic.process(ic.poll_batch(10), make_apply(table, calls), isolation="repeatable read")
    finally:
        holder.join(10)
    assert [(i.key, i.outcome) for i in out] == [("held", "replayed"), ("free", "processed")]
    assert out[0].result == {"offset": "held"} and calls == [1]  # the second attempt's handler only
    assert ic.stored_offsets() == {("orders", 0): 2} and c.broker_committed[("orders", 0)] == 2


def test_process_with_retries_0_raises_the_serialization_failure_and_rewinds(connect, table, scope):
    import threading

    import psycopg

    logs, calls = {}, []
    produce(logs, "orders", 0, "held", b"v")
    conn, group = connect(), "ser0-" + scope
    c = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["orders"])
    c.rebalance(3, [("orders", 0)])
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_key, args=(connect, scope, "held", started, release))
    holder.start()
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()
    try:
        with pytest.raises(psycopg.errors.SerializationFailure):
            ic.process(ic.poll_batch(10), make_apply(table, calls), isolation="repeatable read", retries=0)
    finally:
        holder.join(10)
    assert c.positions[("orders", 0)] == 0 and ic.stored_offsets() == {}


def test_handle_retries_a_deadlock_from_the_handler(connect, table, scope):
    import psycopg

    logs, calls = {}, []
    produce(logs, "t", 0, "d", b"v")
    conn, group = connect(), "hd-" + scope
    c = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["t"])
    c.rebalance(1, [("t", 0)])
    (m,) = ic.poll_batch(1)
    apply = make_apply(table, calls)

    def once_deadlocked(conn, msg):
        if not calls:
            calls.append("deadlock")
            raise psycopg.errors.DeadlockDetected("40P01 from the handler's writes")
        return apply(conn, msg)

    assert ic.handle(m, once_deadlocked) == ({"offset": 0}, False)
    assert calls == ["deadlock", 0] and count(conn, table) == 1 and ic.stored_offsets() == {("t", 0): 1}


class ErrorEvent:
    """What consume() hands back for a consumer error: a message object whose error() is set."""

    def __init__(self, err):
        self._err = err

    def error(self): return self._err
    def topic(self): return None
    def partition(self): return None
    def offset(self): return None


class ErroringFakeConsumer(FakeConsumer):
    """consume() mixes the queued error events in with the messages, after the first message, as librdkafka
    does when a broker connection drops in the middle of a fetch."""

    def __init__(self, group, logs):
        super().__init__(group, logs)
        self.errors = []

    def consume(self, num_messages=1, timeout=-1):
        got = super().consume(num_messages, timeout)
        out = got[:1] + [ErrorEvent(e) for e in self.errors] + got[1:]
        self.errors = []
        return out


def test_poll_batch_skips_non_fatal_errors_without_losing_the_messages_that_came_with_them(connect, table, scope,
                                                                                            caplog):
    from confluent_kafka import KafkaError, KafkaException

    logs, calls = {}, []
    for i in range(5):
        produce(logs, "orders", 0, f"e{i}", b"v")
    conn, group = connect(), "pe-" + scope
    c = ErroringFakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["orders"])
    c.rebalance(1, [("orders", 0)])
    c.errors = [KafkaError(KafkaError._TRANSPORT, "broker connection lost"), KafkaError(KafkaError._PARTITION_EOF)]
    with caplog.at_level("WARNING", logger="idempotency_client.kafka"):
        msgs = ic.poll_batch(3)
    assert [m.offset() for m in msgs] == [0, 1, 2]  # none dropped: the next poll goes on from 3
    assert ic.poll_errors == 1 and ic.last_poll_error.code() == KafkaError._TRANSPORT
    assert any("consumer error" in r.getMessage() for r in caplog.records)
    ic.process(msgs, make_apply(table, calls))
    # a fatal error: the consumer is unusable; the messages taken in the same call are sought back first
    c.errors = [KafkaError(KafkaError._FATAL, "fenced by a newer instance", fatal=True)]
    with pytest.raises(KafkaException):
        ic.poll_batch(10)
    assert c.positions[("orders", 0)] == 3
    assert [m.offset() for m in ic.poll_batch(10)] == [3, 4]
    assert calls == [0, 1, 2] and ic.stored_offsets() == {("orders", 0): 3}


def test_process_refuses_a_transaction_of_the_callers(connect, table, scope):
    """Inside the caller's transaction the broker commit would come before the database's: refused."""
    logs, calls = {}, []
    produce(logs, "orders", 0, "t0", b"v")
    conn, group = connect(), "tx-" + scope
    c = FakeConsumer(group, logs)
    ic = IdempotentConsumer(c, conn, group, scope=scope)
    ic.subscribe(["orders"])
    c.rebalance(1, [("orders", 0)])
    msgs = ic.poll_batch(1)
    with conn.transaction():
        with pytest.raises(ValueError):
            ic.process(msgs, make_apply(table, calls))
    assert calls == [] and c.broker_committed == {} and ic.stored_offsets() == {}
