"""The splitter's consumption order, logged in its keyed frames and taken again after a
restart, so that with several source partitions a record keeps its seq across restarts.

A seq is a record's place in consumption order, and with several source partitions that
order is whatever the consumer happened to return. So each step (a batch the splitter
takes) writes its runs of messages, `[partition, first offset, last offset]`, into the
header `order` of every frame it sends, to every keyed partition. Kafka keeps each
partition's records in produce order, so the keyed partition holding the newest step
also holds every step before it: after a restart, reading the keyed topic from the
checkpoint's offsets finds every step anyone may have seen. `LoggedOrder` then holds
consumed messages until each logged step can be taken again exactly as it was, in the
same order and with the same cuts, which stamps the same seqs; after the last logged step
the splitter takes batches as they come. Without Kafka: reading the logged steps back is
`cep_service.stream.checkpoint.logged_steps`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

ORDER_HEADER = "order"


def runs_of(messages: Iterable[Any]) -> list[list[int]]:
    """The runs of consecutive messages of one source partition, in consumption order."""
    runs: list[list[int]] = []
    for message in messages:
        if message.error():
            continue
        p, offset = message.partition(), message.offset()
        if runs and runs[-1][0] == p:
            runs[-1][2] = offset
        else:
            runs.append([p, offset, offset])
    return runs


class LoggedOrder:
    """Turns consumed messages into steps: the logged ones first, exactly as logged."""

    def __init__(self, steps: list[list[list[int]]] | None = None):
        self.pending = deque(steps or [])
        self.held: dict[int, deque] = {}  # source partition -> messages not taken yet

    @property
    def holding(self) -> bool:
        return bool(self.pending) or any(self.held.values())

    def steps(self, messages: list, hold: bool = False) -> list[list]:
        """The steps `messages` (with those held from before) complete, in order; with
        `hold`, none yet: the messages are only kept (the caller is not ready to take a
        step)."""
        if not self.holding and not hold:
            return [messages] if messages else []
        for message in messages:
            if not message.error():
                self.held.setdefault(message.partition(), deque()).append(message)
        if hold:
            return []
        out = []
        while self.pending and self._complete(self.pending[0]):
            out.append(self._take(self.pending.popleft()))
        if not self.pending:
            rest = [m for queue in self.held.values() for m in queue]
            self.held.clear()
            if rest:
                out.append(rest)
        return out

    def _complete(self, runs: list[list[int]]) -> bool:
        for p, _, last in runs:
            queue = self.held.get(p)
            if not queue or queue[-1].offset() < last:
                return False
        return True

    def _take(self, runs: list[list[int]]) -> list:
        step = []
        for p, first, last in runs:
            queue = self.held[p]
            while queue and queue[0].offset() <= last:
                message = queue.popleft()
                if message.offset() >= first:
                    step.append(message)
        return step
