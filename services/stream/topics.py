"""Topic names of a stream's pipeline and `produce`, without a Kafka client: what the
Kafka-free cores (services/stream/routing.py, partition.py, merge.py) share with their
Kafka shells (services/stream/kafka.py makes the clients).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

# "from the partition's first record": librdkafka's RD_KAFKA_OFFSET_BEGINNING, the value of
# confluent_kafka.OFFSET_BEGINNING (tests/test_kafka_free_cores.py checks they agree)
OFFSET_BEGINNING = -2


class Producer(Protocol):
    """What `produce` needs of a producer: a confluent_kafka Producer, or an Outbox
    (services/stream/routing.py) that only records what is sent."""

    def produce(self, topic: str, value: bytes | None, *, key: bytes | None = ...,
                partition: int = ..., headers: Any = ...) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...


@dataclass
class Topics:
    """Topic and consumer-group names of one stream's pipeline.

    `prefix` (`--topic-prefix` / CEP_TOPIC_PREFIX) goes in front of every internal name
    (cep.<stream>.*, the groups, the default control topic), so separate deployments can
    share a broker; `run1` gives `run1.cep.trades.keyed`. The source topic and the queries'
    INTO topics are named by the user and are not prefixed.

    `shards` (`--coordinators` / CEP_COORDINATORS): coordinator shards. Every role must be
    given the same count: workers send each INTO topic's composites to the match topic of
    its shard (`shard_of`), and pulses and control frames to all of them."""

    stream: str
    source: str = ""
    control: str = ""
    prefix: str = ""
    shards: int = 1

    def __post_init__(self) -> None:
        if self.prefix and not self.prefix.endswith((".", "-", "_")):
            self.prefix += "."
        self.source = self.source or self.stream
        self.control = self.control or f"{self.prefix}cep.queries"

    def _internal(self, what: str) -> str:
        return f"{self.prefix}cep.{self.stream}.{what}"

    # Deliberately like services/stream/topics.py's keyed to dead_letters (each other): one
    # property per topic name
    @property
    def keyed(self) -> str:
        return self._internal("keyed")

    @property
    def matches(self) -> str:
        return self._internal("matches")

    def matches_of(self, shard: int) -> str:
        """The match topic of a coordinator shard: `matches` itself with one shard,
        `matches.<shard>` with more."""
        return self.matches if self.shards == 1 else f"{self.matches}.{shard}"

    def shard_of(self, output: str) -> int:
        """The coordinator shard that merges and writes an INTO topic: a stable hash of its
        name (BLAKE2b, not Python's salted `hash`), so every process agrees without asking
        anyone and a query keeps its shard across restarts."""
        if self.shards == 1:
            return 0
        digest = hashlib.blake2b(output.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.shards

    def coordinator_name(self, shard: int) -> str:
        """A shard's consumer group and checkpoint key: `coordinator` with one shard."""
        return "coordinator" if self.shards == 1 else f"coordinator.{shard}"

    @property
    def state(self) -> str:
        return self._internal("state")

    @property
    def status(self) -> str:
        return self._internal("status")

    @property
    def dead_letters(self) -> str:
        return self._internal("dead")

    @property
    def late(self) -> str:
        """Events that came later than the splitter's allowed lateness (--allowed-lateness-ms)."""
        return self._internal("late")

    def group(self, role: str) -> str:
        """The consumer group of a role (splitter, workers, coordinator)."""
        return self._internal(role)


def produce(producer: Producer, topic: str, value: bytes | None, key: bytes | None = None,
            partition: int | None = None, headers: Any = None) -> None:
    """Produce, waiting for room in the local queue when it is full."""
    while True:
        try:
            if partition is None:
                producer.produce(topic, value, key=key, headers=headers)
            else:
                producer.produce(topic, value, key=key, partition=partition, headers=headers)
            return
        except BufferError:
            producer.poll(0.01)
