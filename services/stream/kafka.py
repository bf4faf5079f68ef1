"""Kafka client settings, topic names and creation, batched produce helpers.

Every client gets `bootstrap.servers` plus the extra librdkafka settings of the
`KafkaSettings` (from CEP_KAFKA_* variables: CEP_KAFKA_SECURITY_PROTOCOL=SASL_SSL becomes
`security.protocol`, and from a `--kafka-config` file of `key=value` lines). Consumers in
groups get short sessions (see docs/broker.md: joins wait half the session timeout);
producers use the murmur2 partitioner so every client agrees on key placement.
"""

from __future__ import annotations

# Deferred imports: Faust (a heavy import) loads only for the splitter's credentials; the
# workers, the coordinator and the CLI use Kafka without it.

import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cep_service.errors import BrokerUnreachable, DeliveryFailed
from cep_service.stream.topics import Topics, produce  # noqa: F401  (their home was here)

# Bounds on what a client holds in memory (backpressure instead of growth): the consumer
# prefetches at most this much per partition, the producer queues at most this much.
BOUNDED_CONSUMER = {"queued.max.messages.kbytes": 32 * 1024, "queued.min.messages": 1000}
BOUNDED_PRODUCER = {"queue.buffering.max.kbytes": 64 * 1024,
                    "queue.buffering.max.messages": 100000}


LIBRDKAFKA_LOG = logging.getLogger("librdkafka")

# tansu (the embedded broker, services/stream/broker.py) answers a fetch by listing every record
# batch stored in the partition (~0.5 us per batch here) and returns nothing once that
# listing outlasts the fetch's max wait; it stores every batch for good. So on tansu a
# fetch costs more the more batches its partitions hold, the pipeline stalled after
# ~150-175 s at 2 ms linger / 10 ms fetch wait, and broker CPU grows with (batches per
# second per partition)^2 x time. On tansu the clients therefore make one batch per
# partition per 200 ms at most (one produce request per linger) and give a fetch 100 ms:
# the soak at 10,000 events/s kept up for 30 minutes, the broker at 14% of a core on
# average (stalled at ~280 s with 2 ms / 10 ms; docs/reliability.md, "Soak"). CEP_KAFKA_* /
# --kafka-config values still win.
TANSU_PRODUCER_DEFAULTS = {"linger.ms": 200}
TANSU_CONSUMER_DEFAULTS = {"fetch.wait.max.ms": 100}


class BrokerKind(StrEnum):
    """Which client defaults a broker gets; the values are those `broker` and CEP_BROKER
    take."""

    TANSU = "tansu"
    KAFKA = "kafka"


_BROKER_KINDS: dict[str, BrokerKind] = {}  # bootstrap -> its kind, once known


@dataclass
class KafkaSettings:
    bootstrap: str
    extra: dict = field(default_factory=dict)
    session_timeout_ms: int = 6000
    heartbeat_ms: int = 1000
    # "tansu" or "kafka": which defaults the clients get; "" asks the broker (its cluster
    # id: tansu's is "tansu_cluster" unless configured) unless CEP_BROKER says
    broker: str = ""
    # replication factor of the topics the services create (CEP_REPLICATION_FACTOR; a
    # production cluster wants 3: a topic with one replica is lost with its broker)
    replication_factor: int = 1

    @classmethod
    def from_env(cls, bootstrap: str | None = None, config_file: Path | None = None,
                 session_timeout_ms: int | None = None) -> KafkaSettings:
        extra = {}
        if config_file is not None:
            for line in Path(config_file).read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    key, _, value = line.partition("=")
                    extra[key.strip()] = value.strip()
        for name, value in os.environ.items():
            if name.startswith("CEP_KAFKA_"):
                extra[name[len("CEP_KAFKA_"):].lower().replace("_", ".")] = value
        timeout = session_timeout_ms or int(os.environ.get("CEP_SESSION_TIMEOUT_MS", 6000))
        return cls(bootstrap or os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"), extra,
                   timeout, max(100, timeout // 4),
                   replication_factor=int(os.environ.get("CEP_REPLICATION_FACTOR", 1)))

    def base(self) -> dict:
        # Nagle's algorithm holds small frames (pulses, matches) back for tens of ms.
        # librdkafka's own messages go through Python's logging (JSON lines in services).
        return {"bootstrap.servers": self.bootstrap, "socket.nagle.disable": True,
                "logger": LIBRDKAFKA_LOG, **self.extra}

    # Tuning defaults; CEP_KAFKA_* / --kafka-config values of the same keys win over them.
    # What the services rely on (partitioner, group ids, manual commits) is set after.
    PRODUCER_DEFAULTS = {"linger.ms": 2, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 1000000,
                         "queue.buffering.max.kbytes": 1048576, "message.max.bytes": 16000000}
    CONSUMER_DEFAULTS = {"fetch.max.bytes": 64 * 1024 * 1024,
                         "max.partition.fetch.bytes": 16 * 1024 * 1024,
                         "fetch.wait.max.ms": 10}

    def broker_kind(self) -> BrokerKind:
        """`broker`, else CEP_BROKER, else the broker's cluster id (asked once per
        bootstrap; KAFKA while the broker cannot be reached)."""
        named = self.broker or os.environ.get("CEP_BROKER", "").lower()
        if named in BrokerKind.__members__.values():
            return BrokerKind(named)
        if self.bootstrap not in _BROKER_KINDS:
            try:
                cluster = AdminClient(self.base()).list_topics(timeout=3).cluster_id or ""
            except KafkaException:
                return BrokerKind.KAFKA  # not known yet: asked again by the next client
            _BROKER_KINDS[self.bootstrap] = (BrokerKind.TANSU if cluster.startswith("tansu")
                                             else BrokerKind.KAFKA)
        return _BROKER_KINDS[self.bootstrap]

    def producer_config(self, **overrides: Any) -> dict:
        tuned = TANSU_PRODUCER_DEFAULTS if self.broker_kind() is BrokerKind.TANSU else {}
        return {**self.PRODUCER_DEFAULTS, **tuned, **self.base(),
                "partitioner": "murmur2_random", **overrides}

    def producer(self, **overrides: Any) -> Producer:
        return Producer(self.producer_config(**overrides))

    def consumer_config(self, group: str | None = None, **overrides: Any) -> dict:
        tuned = TANSU_CONSUMER_DEFAULTS if self.broker_kind() is BrokerKind.TANSU else {}
        return {"session.timeout.ms": self.session_timeout_ms,
                "heartbeat.interval.ms": self.heartbeat_ms, **self.CONSUMER_DEFAULTS,
                **tuned, **self.base(),
                "group.id": group or f"cep-assign-{os.getpid()}-{time.time()}",
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "enable.partition.eof": False, **overrides}

    def consumer(self, group: str | None = None, **overrides: Any) -> Consumer:
        return Consumer(self.consumer_config(group, **overrides))

    def admin(self) -> AdminClient:
        return AdminClient(self.base())

    def faust_credentials(self) -> Any:
        """The security settings as Faust (aiokafka) credentials: `security.protocol`
        SSL / SASL_SSL / SASL_PLAINTEXT with `sasl.mechanism`, `sasl.username`,
        `sasl.password`, `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`
        (None for PLAINTEXT)."""
        protocol = self.extra.get("security.protocol", "PLAINTEXT").upper()
        if protocol == "PLAINTEXT":
            return None

        from faust.auth import SASLCredentials, SSLCredentials

        context = None
        if protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(cafile=self.extra.get("ssl.ca.location"))
            if "ssl.certificate.location" in self.extra:
                context.load_cert_chain(self.extra["ssl.certificate.location"],
                                        self.extra.get("ssl.key.location"),
                                        self.extra.get("ssl.key.password"))
        if protocol == "SSL":
            return SSLCredentials(context)
        if protocol not in ("SASL_SSL", "SASL_PLAINTEXT"):
            raise ValueError(f"security.protocol {protocol!r} is not supported")
        return SASLCredentials(username=self.extra.get("sasl.username"),
                               password=self.extra.get("sasl.password"), ssl_context=context,
                               mechanism=self.extra.get("sasl.mechanism", "PLAIN"))


def ensure_topics(settings: KafkaSettings, partitions: dict[str, int],
                  compacted: tuple[str, ...] = (), timeout_s: float = 15.0,
                  any_count: tuple[str, ...] = ()) -> dict[str, int]:
    """Create the topics that do not exist yet (name -> partition count); an existing topic
    with another partition count is an error (partitions cannot be added here), except for
    those in `any_count` (a user's source topic). Returns each topic's partition count."""
    admin = settings.admin()
    deadline = time.monotonic() + timeout_s
    try:
        existing = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as e:
        raise BrokerUnreachable(f"broker {settings.bootstrap}: {e.args[0].str()}") from None
    wanted = [NewTopic(name, count, settings.replication_factor,
                       config={"cleanup.policy": "compact"}
                       if name in compacted else {})
              for name, count in partitions.items() if name not in existing]
    if wanted:
        for _name, future in admin.create_topics(wanted).items():
            try:
                future.result(timeout_s)
            except KafkaException as e:
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        missing = [n for n in partitions if n not in topics or topics[n].error is not None]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics not created: {', '.join(missing)}")
        time.sleep(0.05)
    counts = {name: len(topics[name].partitions) for name in partitions}
    for name, count in partitions.items():
        if counts[name] != count and name not in any_count:
            raise RuntimeError(f"topic {name} has {counts[name]} partitions, {count} wanted")
    return counts


class Deliveries:
    """A producer's `on_delivery` callback that remembers the first failed delivery (then
    calls `also`, if given, for every report)."""

    def __init__(self, also: Callable[[Any, Any], None] | None = None) -> None:
        self.failed: str | None = None
        self.also = also

    def __call__(self, err: Any, message: Any) -> None:
        if err is not None and self.failed is None:
            self.failed = f"{message.topic()} [{message.partition()}]: {err}"
        if self.also is not None:
            self.also(err, message)

    def check(self, what: str = "messages") -> None:
        if self.failed is not None:
            raise DeliveryFailed(f"{what} not delivered: {self.failed}")


def flush_all(producer: Producer, timeout_s: float, deliveries: Deliveries | None = None,
              what: str = "messages") -> None:
    """Flush, raising DeliveryFailed when messages are still queued after `timeout_s` (the
    broker cannot be reached) or a delivery report was an error (`deliveries`)."""
    remaining = producer.flush(timeout_s)
    if remaining:
        raise DeliveryFailed(f"{remaining} {what} not delivered within {timeout_s:g} s "
                             "(is the broker reachable?)")
    if deliveries is not None:
        deliveries.check(what)


def produce_end(producer: Producer, topic: str) -> None:
    """The end-of-input marker on a source topic: an empty `kind=end` frame
    (services/stream/frames.py) in every partition of the topic; the input has ended once each
    source partition has given one (a partition's records come before its marker, but
    not before another partition's), and the pipeline flushes its engines there. Write
    it after the last records (their partitions' order puts it behind them)."""
    metadata = producer.list_topics(topic, timeout=10).topics.get(topic)
    partitions = sorted(metadata.partitions) if metadata is not None else []
    for p in partitions or [None]:
        produce(producer, topic, b"", partition=p, headers=[("kind", b"end")])


def consume_batch(consumer: Consumer, limit: int, timeout_s: float,
                  linger_s: float = 0.0) -> list:
    """Up to `limit` messages: waits at most `timeout_s` for the first one, then at most
    `linger_s` for more (Consumer.consume alone waits its whole timeout unless `limit`
    messages come)."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(limit - 1, linger_s)] if limit > 1 else [first]


def _caught_up(consumer: Consumer, partitions: list) -> bool:
    """Whether every partition's position reached the high-watermark of its last fetch."""
    for tp in consumer.position(partitions):
        _, high = consumer.get_watermark_offsets(tp, cached=True)
        if high < 0:
            return False  # no fetch answered yet
        if high > 0 and (tp.offset < 0 or tp.offset < high):
            return False
    return True


def read_all(settings: KafkaSettings, topic: str, idle_s: float = 0.5,
             timeout_s: float = 30.0) -> list:
    """Every message of a topic, reading until nothing new came for `idle_s` (the fetch
    high-watermark ends it sooner; ListOffsets is not trusted, see docs/broker.md)."""
    consumer = settings.consumer()
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException as e:
            raise BrokerUnreachable(f"broker {settings.bootstrap}: {e.args[0].str()}") \
                from None
        if metadata is None or metadata.error is not None:
            return []
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        consumer.assign(partitions)
        out = []
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < idle_s:
            messages = consumer.consume(10000, 0.05)
            got = [m for m in messages if not m.error()]
            if got:
                out.extend(got)
                quiet_since = time.monotonic()
            if _caught_up(consumer, partitions):
                break
        return out
    finally:
        consumer.close()
