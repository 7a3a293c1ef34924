"""A confluent-kafka consumer helper: positions from the database, fencing by group generation, the offset
recorded in the same transaction as the work.

    from confluent_kafka import Consumer
    from idempotency_client.kafka import IdempotentConsumer

    consumer = Consumer({"bootstrap.servers": ..., "group.id": "billing", "enable.auto.commit": False})
    ic = IdempotentConsumer(consumer, conn, group="billing", scope="payments")
    ic.subscribe(["payments"])
    while running:
        for item in ic.process(ic.poll_batch(500, timeout=1.0), apply_payment):   # one transaction per poll
            if item.outcome == "failed":
                dead_letter(item.item, item.error)

The generation. Fencing needs a number that grows at every rebalance and that the group coordinator (not the
consumer) assigns: Kafka's group generation id. confluent-kafka (checked up to 2.16, librdkafka 2.16) has no
public accessor for it: ``Consumer.consumer_group_metadata()`` is documented as an opaque object for
``Producer.send_offsets_to_transaction``; ``memberid()`` is public but is not ordered. So ``group_generation``
reads it the way the repository's examples did: the metadata is librdkafka's serialization
(``rd_kafka_consumer_group_metadata_write``): the magic ``b"CGMDv2:"`` then the generation id as a native-endian
int32. This is a private format: the function checks the magic and raises ``UnsupportedGroupMetadata``
rather than guess when it changes; pass ``generation=`` your own callable (e.g. an epoch you keep) to avoid it.
A substitute drawn by the consumer itself (a sequence read in on_assign) is not used because a consumer that
stalls before its own on_assign would draw a larger number than the consumer that replaced it and fence the
live one.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from psycopg.pq import TransactionStatus

from ._sync import BatchItem, IdempotentCall, offsets, process_batch, record_offset, retry
from .errors import DEFAULT_RETRIES, Failed, Mismatch

try:  # the optional extra; the module stays importable for its pure functions
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
except ImportError:  # pragma: no cover
    KafkaError = KafkaException = TopicPartition = None

logger = logging.getLogger("idempotency_client.kafka")
_COMMIT_ERRORS = (KafkaException,) if KafkaException is not None else ()

__all__ = ["IdempotentConsumer", "group_generation", "header_key", "UnsupportedGroupMetadata"]

_MAGIC = b"CGMDv2:"


class UnsupportedGroupMetadata(RuntimeError):
    """consumer_group_metadata() is not in the librdkafka format this helper knows."""


def group_generation(consumer) -> Optional[int]:
    """The consumer group generation id (None before the consumer joined a group: librdkafka writes -1)."""
    meta = consumer.consumer_group_metadata()
    if not isinstance(meta, (bytes, bytearray)) or meta[:len(_MAGIC)] != _MAGIC or len(meta) < len(_MAGIC) + 4:
        raise UnsupportedGroupMetadata(
            f"consumer_group_metadata() is {type(meta).__name__} {bytes(meta[:16]) if isinstance(meta, (bytes, bytearray)) else ''!r},"
            " not librdkafka's CGMDv2 serialization: pass generation= to IdempotentConsumer")
    generation = int.from_bytes(meta[len(_MAGIC):len(_MAGIC) + 4], sys.byteorder, signed=True)
    return generation if generation >= 0 else None


def header_key(name: str = "idempotency-key", fallback_to_message_key: bool = True) -> Callable[[Any], str]:
    """A key function: the header ``name`` (UTF-8), else the message key."""

    def key(msg) -> str:
        for h, v in msg.headers() or ():
            if h == name and v is not None:
                return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v)
        k = msg.key() if fallback_to_message_key else None
        if k is None:
            raise ValueError(f"message {msg.topic()}[{msg.partition()}]@{msg.offset()} has no {name!r} header"
                             + (" and no key" if fallback_to_message_key else ""))
        return k.decode("utf-8") if isinstance(k, (bytes, bytearray)) else str(k)

    return key


def _position(msg) -> Tuple[str, int, int]:
    return msg.topic(), msg.partition(), msg.offset()


class IdempotentConsumer:
    """Wraps a confluent_kafka.Consumer (subscribe / poll / consume / assign / incremental_assign / seek /
    commit) and a psycopg connection (idle between polls; autocommit recommended).

    * ``subscribe(topics)``: on every assignment, each partition is positioned at the database's
      ``idem_offsets(group)`` next offset (the broker's committed offset, or auto.offset.reset, where the
      database has none), and the group generation is read for fencing. ``cooperative=True`` for the
      cooperative-sticky assignor (incremental_assign instead of assign).
    * ``process(messages, handler)``: one transaction per poll (process_batch): idem_claim_batch,
      ``handler(conn, msg)`` for new keys, idem_complete_batch, idem_record_offset(group, topic, partition,
      last offset, generation) per partition; then, as a courtesy, the broker commit. A serialization
      failure or deadlock (40001 / 40P01) runs the whole poll's transaction again (``retries``, default 4:
      5 attempts in all). When the batch raises (a retryable handler failure, a database error, the last
      40001), each partition of the batch is sought back to its first offset so the messages come again,
      and the error propagates; ``Fenced`` means this consumer is a zombie (a newer generation owns a
      partition).
    * ``handle(message, handler)``: the same for one message, with IdempotentCall (savepoint, idem_fail).
    * ``poll_batch(n, timeout)``: consume(); non-fatal consumer errors are logged and skipped (kept in
      ``last_poll_error``, counted in ``poll_errors``), never at the cost of the messages that came with
      them; a fatal one rewinds those messages and raises.

    The broker commit is best-effort: it comes after the database committed, which holds the positions the
    helper seeks to; a ``KafkaException`` from it (a rebalance in progress, an unknown member, a coordinator
    that moved) is logged as a warning on the ``idempotency_client.kafka`` logger, kept in
    ``last_commit_error`` (counted in ``commit_errors``) and not raised: the poll is done.
    """

    def __init__(self, consumer, conn, group: str, *, scope: Optional[str] = None,
                 key: Callable[[Any], str] = header_key(), generation: Callable[[Any], Optional[int]] = group_generation,
                 cooperative: bool = False, commit_to_broker: bool = True):
        self.consumer, self.conn, self.group = consumer, conn, group
        self.scope = scope if scope is not None else group
        self.key, self._generation_of = key, generation
        self.cooperative, self.commit_to_broker = cooperative, commit_to_broker
        self.generation: Optional[int] = None
        self.assigned: Dict[Tuple[str, int], int] = {}  # partition -> offset it was positioned at
        self.last_commit_error: Optional[BaseException] = None  # the last failed broker commit's error
        self.commit_errors = 0
        self.last_poll_error = None  # the last non-fatal KafkaError poll_batch skipped
        self.poll_errors = 0
        self._user_on_assign = self._user_on_revoke = None

    # ---- assignment

    def subscribe(self, topics: Sequence[str], on_assign=None, on_revoke=None, on_lost=None):
        self._user_on_assign, self._user_on_revoke = on_assign, on_revoke
        kwargs = {"on_assign": self._on_assign, "on_revoke": self._on_revoke}
        if on_lost is not None:
            kwargs["on_lost"] = on_lost
        self.consumer.subscribe(list(topics), **kwargs)

    def stored_offsets(self) -> Dict[Tuple[str, int], int]:
        """{(topic, partition): next offset} from the database (idem_offsets)."""
        if self.conn.info.transaction_status == TransactionStatus.IDLE:
            with self.conn.transaction():
                return offsets(self.conn, self.group)
        return offsets(self.conn, self.group)

    def _on_assign(self, consumer, partitions):
        self.generation = self._generation_of(consumer)
        stored = self.stored_offsets()
        for tp in partitions:
            n = stored.get((tp.topic, tp.partition))
            if n is not None:
                tp.offset = n
            self.assigned[(tp.topic, tp.partition)] = tp.offset
        if self.cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if self._user_on_assign is not None:
            self._user_on_assign(consumer, partitions)

    def _on_revoke(self, consumer, partitions):
        for tp in partitions:
            self.assigned.pop((tp.topic, tp.partition), None)
        if self._user_on_revoke is not None:
            self._user_on_revoke(consumer, partitions)

    # ---- polling

    def poll_batch(self, max_messages: int = 500, timeout: float = 1.0) -> List[Any]:
        """consume() up to max_messages; returns the messages, never drops one.

        The error events consume() mixes in with the messages: partition EOF is skipped; a non-fatal error
        (a broker connection lost, a coordinator moving, a poll interval exceeded: librdkafka recovers from
        them itself) is logged as a warning, kept in ``last_poll_error`` (counted in ``poll_errors``) and
        skipped, and the messages of the same call are returned; a fatal error (``KafkaError.fatal()``: the
        consumer instance is unusable) seeks the partitions of the messages already taken in this call back
        to their first offsets and raises ``KafkaException``. Raising on a non-fatal error instead would
        lose the messages that came in the same call to a caller that catches it and polls on: librdkafka
        has moved its positions past them, and the next poll's offset would be recorded beyond them."""
        out, errors = [], []
        for msg in self.consumer.consume(num_messages=max_messages, timeout=timeout):
            err = msg.error()
            if err is None:
                out.append(msg)
            elif KafkaError is not None and err.code() == KafkaError._PARTITION_EOF:
                continue
            elif hasattr(err, "fatal") and err.fatal():
                self._rewind(out)
                raise KafkaException(err) if KafkaException is not None else RuntimeError(str(err))
            else:
                errors.append(err)
        for err in errors:
            self.last_poll_error = err
            self.poll_errors += 1
            logger.warning("group %r: consumer error (not fatal, librdkafka recovers; %d messages of the same"
                           " poll returned): %s", self.group, len(out), err)
        return out

    def process(self, messages: Sequence[Any], handler: Callable[[Any, Any], Any], **options) -> List[BatchItem]:
        """One poll in one transaction (see the class doc); options go to process_batch (ttl, terminal,
        isolation, retries, ...). The connection must be idle: the helper commits the poll, then the
        broker. (Inside a transaction of the caller's, the broker commit would precede the database's, and
        a rollback after it would leave the broker's offset past work the database does not have.)"""
        messages = list(messages)
        if not messages:
            return []
        if self.conn.info.transaction_status != TransactionStatus.IDLE:
            raise ValueError("process needs an idle connection: it commits the poll and its offsets, then the"
                             " broker's")
        try:
            out = process_batch(self.conn, messages, handler, key=self.key, scope=self.scope, group=self.group,
                                position=_position, generation=self.generation, **options)
        except BaseException:
            self._rewind(messages)
            raise
        self._commit_to_broker(messages)
        return out

    def handle(self, message, handler: Callable[..., Any], *, retries: int = DEFAULT_RETRIES,
               backoff: float = 0.05, **options) -> Tuple[Any, bool]:
        """One message in one transaction: IdempotentCall (claim, handler(conn, message), complete) and
        idem_record_offset, committed together. Returns (result, replayed).

        When it raises: a retryable handler failure is recorded (idem_fail, committed without the offset)
        and the partition sought back to the message; a terminal one (TerminalError, ``terminal`` types)
        and the outcomes Failed / Mismatch are committed WITH the offset (the message is done: route it to
        a dead-letter topic); InProgress, Fenced and database errors roll back and seek back. 40001 / 40P01
        run the whole transaction again, handler included (``retries``, default 4)."""
        if self.conn.info.transaction_status != TransactionStatus.IDLE:
            raise ValueError("handle needs an idle connection: it commits the message and its offset together")
        k = self.key(message)
        topic, partition, offset = _position(message)

        def once():
            settled = None  # the exception to raise after the commit
            advance = True
            with self.conn.transaction():
                call = IdempotentCall(self.conn, k, scope=self.scope, **options)
                try:
                    with call:
                        if not call.replayed:
                            call.result = handler(self.conn, message)
                except (Failed, Mismatch) as e:
                    settled = e
                except Exception as e:
                    if call.failure is None:  # nothing recorded: roll back everything
                        raise
                    settled, advance = e, call.failure == "failed"  # terminal now: done, dead-letter it
                if advance:
                    record_offset(self.conn, self.group, topic, partition, offset, self.generation)
            return call, settled, advance

        try:
            call, settled, advance = retry(once, attempts=retries + 1, backoff=backoff, conn=self.conn)
        except BaseException:
            self._rewind([message])
            raise
        if not advance:
            self._rewind([message])
            raise settled
        self._commit_to_broker([message])
        if settled is not None:
            raise settled
        return call.result, call.replayed

    def _rewind(self, messages):
        first: Dict[Tuple[str, int], int] = {}
        for m in messages:
            t, p, o = _position(m)
            first[(t, p)] = min(o, first.get((t, p), o))
        for (t, p), o in first.items():
            try:
                self.consumer.seek(TopicPartition(t, p, o))
            except Exception:  # a partition revoked meanwhile: its next owner positions it from the database
                pass

    def _commit_to_broker(self, messages):
        """The courtesy commit (the database is the truth): next offset of each partition, synchronously,
        best-effort. A KafkaException (e.g. REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID during a rebalance)
        comes after the database committed: it is logged and kept in ``last_commit_error``, not raised;
        the next owner of the partition seeks to the database's offset anyway."""
        if not self.commit_to_broker:
            return
        last: Dict[Tuple[str, int], int] = {}
        for m in messages:
            t, p, o = _position(m)
            last[(t, p)] = max(o, last.get((t, p), o))
        try:
            self.consumer.commit(offsets=[TopicPartition(t, p, o + 1) for (t, p), o in last.items()],
                                 asynchronous=False)
        except _COMMIT_ERRORS as e:
            self.last_commit_error = e
            self.commit_errors += 1
            logger.warning("group %r: broker offset commit of %s failed after the database committed (the "
                           "database's offsets stay the truth): %s", self.group,
                           ", ".join(f"{t}[{p}]@{o + 1}" for (t, p), o in last.items()), e)
