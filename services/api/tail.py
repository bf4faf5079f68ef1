"""Server-sent events of the composite events of one query (or of several: the
console's table), read from its INTO topic in order (offset order of each partition; the
coordinator writes an INTO topic in sort-key order). Only records the query's pipeline
wrote (header `cep.pipeline`) and whose `query` is the query's name are sent; each is
`event: composite`, `id: PARTITION:OFFSET`, `data:` the composite as JSON. One `event:
ready` comes first, once the reading is placed.
`from=beginning` (default `end`) replays what is there; `limit=N` ends the stream after N
events and `idle_s=S` after S seconds with none (for scripts).

No thread and no Kafka consumer per tail: `TailHub` has one thread and one consumer that
every tail from the end shares (assigned the INTO topics that have tails, each from its
end when its first tail comes), plus one consumer per replaying tail (`from=beginning`,
their number bounded by the `replay` limit), all polled by that thread. It decodes each
record once and hands the composite events to the tails' buffers on the event loop. A
tail's buffer holds at most `buffer` events: a reader that falls that far behind (its
socket does not drain) is dropped, its connection closed, and counted (`dropped`). A
tail whose client has gone ends within SWEEP_S (one timer looks at all of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections import Counter, deque
from enum import Enum, StrEnum
from typing import Any

import orjson
from aiohttp import web
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from cep_service.stream.checkpoint import PIPELINE_HEADER

HEARTBEAT_S = 15
POLL_S = 0.1  # the shared consumer's wait for records when it is the only one
IDLE_POLL_S = 0.02  # between rounds over several consumers that had nothing
BATCH = 500
SWEEP_S = 1.0  # how often the loop looks for tails whose client has gone

logger = logging.getLogger("cep.api")



class TailFrom(StrEnum):
    """Where a tail starts (the `from` of a tail's URL)."""

    BEGINNING = "beginning"  # a replay: the whole INTO topic, on a consumer of its own
    END = "end"  # what comes from now on


class _Command(Enum):
    """What the hub's thread is told to do (with a tail, or None)."""

    OPEN = "open"
    CLOSE = "close"
    STOP = "stop"

class Tail:
    """One tail's end on the event loop: a bounded buffer of SSE chunks."""

    __slots__ = ("wanted", "start", "buffer", "chunks", "wake", "ready", "dropped",
                 "ended", "transport", "hub")

    def __init__(self, hub: TailHub, wanted: dict[str, Any], start: TailFrom, buffer: int,
                 transport: Any):
        """`wanted`: INTO topic -> (the pipeline's tag, the names of the queries whose
        composite events it wants there); a replay (`start` beginning) reads one topic."""
        self.hub, self.wanted, self.start = hub, wanted, TailFrom(start)
        self.buffer = buffer
        self.chunks: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.ready = self.dropped = self.ended = False
        self.transport = transport

    def offer(self, chunks: list[bytes]) -> None:
        """Events from the hub (on the loop): buffered, or the reader is dropped."""
        if self.dropped or self.ended:
            return
        if len(self.chunks) + len(chunks) > self.buffer:
            self.dropped = True
            self.chunks.clear()
            self.hub.counters["dropped"] += 1
            if self.transport is not None:  # a writer blocked on the socket wakes up
                self.transport.abort()
        else:
            self.chunks.extend(chunks)
        self.wake.set()


class TailHub:
    """The tails of one API: `open(...)` on the event loop, `close(tail)` when it ends."""

    def __init__(self, settings: Any, buffer: int = 1024):
        self.settings, self.buffer = settings, buffer
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tails: set[Tail] = set()
        self.counters: Counter = Counter()  # opened, closed, dropped, consumers
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._sweeping: asyncio.TimerHandle | None = None  # the loop's timer of the next sweep

    # ------------------------------------------------------------ the loop's side

    def open(self, wanted: dict[str, Any], start: TailFrom, transport: Any = None) -> Tail:
        """A tail of the composite events `wanted` (INTO topic -> (tag, query names))."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        wanted = {topic: (tag.encode(), frozenset(names))
                  for topic, (tag, names) in wanted.items()}
        tail = Tail(self, wanted, start, self.buffer, transport)
        self.tails.add(tail)
        self.counters["opened"] += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="api-tails", daemon=True)
            self._thread.start()
        self._commands.put((_Command.OPEN, tail))
        if self._sweeping is None:
            self._sweeping = self.loop.call_later(SWEEP_S, self._sweep)
        return tail

    def _sweep(self) -> None:
        """End the tails whose client has gone (one timer for all of them: an idle tail
        would otherwise learn it only at its next heartbeat)."""
        self._sweeping = None
        for tail in self.tails:
            if tail.transport is not None and tail.transport.is_closing():
                tail.ended = True
                tail.wake.set()
        if self.tails and not self._closing.is_set() and self.loop is not None:
            self._sweeping = self.loop.call_later(SWEEP_S, self._sweep)

    def close(self, tail: Tail) -> None:
        if tail in self.tails:
            self.tails.discard(tail)
            tail.ended = True
            self.counters["closed"] += 1
            self._commands.put((_Command.CLOSE, tail))

    def stop(self) -> None:
        """End every tail and the thread (on the loop; `join` waits for the thread)."""
        self._closing.set()
        self._end_all()
        if self._sweeping is not None:
            self._sweeping.cancel()
        self._commands.put((_Command.STOP, None))

    def join(self) -> None:
        """Wait for the thread to close its consumers (not on the loop)."""
        if self._thread is not None:
            self._thread.join(30)

    def _deliver(self, batches: list) -> None:
        for tail, chunks, ready in batches:
            if ready and not tail.ready:
                tail.ready = True
                tail.wake.set()
            if chunks:
                tail.offer(chunks)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        loop = self.loop
        assert loop is not None  # (`open` sets it before it starts this thread)
        shared: Consumer | None = None  # the consumer of the tails from the end
        assigned: dict[str, list[TopicPartition]] = {}  # topic -> its partitions
        by_topic: dict[str, set[Tail]] = {}
        replays: dict[Tail, Consumer] = {}  # tail -> its own consumer
        unready: set[Tail] = set()
        try:
            while not self._closing.is_set():
                if by_topic or replays:
                    try:
                        command, tail = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                else:  # no tail: nothing to poll until one comes
                    command, tail = self._commands.get()
                while command is not None:
                    if command is _Command.STOP:
                        return
                    if command is _Command.OPEN:
                        if tail.start is TailFrom.BEGINNING:
                            consumer = self.settings.consumer()
                            self.counters["consumers"] += 1
                            consumer.assign([tp for topic in tail.wanted for tp in
                                             self._partitions(consumer, topic,
                                                              OFFSET_BEGINNING)])
                            replays[tail] = consumer
                        else:
                            if shared is None:
                                shared = self.settings.consumer()
                                self.counters["consumers"] += 1
                            for topic in tail.wanted:
                                if topic not in assigned:
                                    parts = self._partitions(shared, topic, OFFSET_END)
                                    shared.incremental_assign(parts)
                                    assigned[topic] = parts
                                by_topic.setdefault(topic, set()).add(tail)
                        unready.add(tail)
                    elif command is _Command.CLOSE:
                        unready.discard(tail)
                        consumer = replays.pop(tail, None)
                        if consumer is not None:
                            consumer.close()
                            self.counters["consumers"] -= 1
                        for topic in tail.wanted:
                            tails = by_topic.get(topic)
                            if tails is not None and tail in tails:
                                tails.discard(tail)
                                if not tails:
                                    del by_topic[topic]
                                    assert shared is not None  # (it reads by_topic's)
                                    shared.incremental_unassign(assigned.pop(topic))
                    try:
                        command, tail = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if not by_topic and not replays:
                    continue
                batches: dict[Tail, list] = {}
                polled = 0
                sources: list[tuple[Consumer, Tail | None]] = \
                    ([(shared, None)] if by_topic and shared is not None else []) + \
                    [(c, t) for t, c in replays.items()]
                wait = POLL_S if len(sources) == 1 else 0
                for consumer, own in sources:
                    messages = consumer.consume(BATCH, wait)
                    polled += len(messages)
                    self._route(messages, [own] if own is not None else None, by_topic,
                                batches)
                # placed: a fetch has been asked for since their assignment (librdkafka
                # resolves the end then; positions stay unknown until a record comes)
                ready = list(unready)
                unready.clear()
                out = [(t, batches.pop(t, None), True) for t in ready]
                out += [(t, chunks, False) for t, chunks in batches.items()]
                if out:
                    try:
                        loop.call_soon_threadsafe(self._deliver, out)
                    except RuntimeError:  # the loop is closed: the API stopped
                        return
                if not polled and wait == 0:
                    self._closing.wait(IDLE_POLL_S)
        except Exception:
            logger.exception("api: the tails' thread failed")
            self._closing.set()
            if self.loop is not None:
                with contextlib.suppress(RuntimeError):
                    self.loop.call_soon_threadsafe(self._end_all)
        finally:
            for consumer in [shared, *replays.values()]:
                if consumer is not None:
                    with contextlib.suppress(Exception):
                        consumer.close()

    def _end_all(self) -> None:
        for tail in list(self.tails):
            tail.ended = True
            tail.wake.set()

    @staticmethod
    def _partitions(consumer: Any, topic: str, offset: int) -> list[TopicPartition]:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        partitions = sorted(metadata.partitions) if metadata and metadata.error is None \
            else [0]
        return [TopicPartition(topic, p, offset) for p in partitions]

    @staticmethod
    def _route(messages: Any, only: Any, by_topic: Any, batches: Any) -> None:
        """Each record's composite to the tails it is for (`only`: a replay's tail)."""
        for message in messages:
            if message.error() is not None:
                continue
            tails = only if only is not None else by_topic.get(message.topic())
            if not tails:
                continue
            headers = dict(message.headers() or ())
            tag = headers.get(PIPELINE_HEADER)
            if tag is None:
                continue
            chunk = name = None
            for tail in tails:
                tail_tag, names = tail.wanted.get(message.topic(), (None, ()))
                if tail_tag != tag:
                    continue
                if name is None:
                    try:
                        composite = orjson.loads(message.value())
                    except orjson.JSONDecodeError:
                        break
                    name = composite.get("query") if isinstance(composite, dict) else ""
                    chunk = b"event: composite\nid: %d:%d\ndata: %s\n\n" % (
                        message.partition(), message.offset(), orjson.dumps(composite))
                if name in names:
                    batches.setdefault(tail, []).append(chunk)


async def stream(request: web.Request, hub: TailHub, wanted: dict, start: TailFrom,
                 limit: int | None, idle_s: float | None) -> web.StreamResponse:
    """The tail's response (`wanted`: INTO topic -> (tag, query names)), until `limit`
    events, `idle_s` without one, the client goes, it is dropped, or the API stops."""
    tail = hub.open(wanted, start, request.transport)
    try:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(b": tail of " + ", ".join(sorted(wanted)).encode() + b"\n\n")
        sent, announced = 0, False
        loop = asyncio.get_running_loop()
        last = beat = loop.time()
        while not tail.ended and not tail.dropped:
            if tail.ready and not announced:
                await response.write(b"event: ready\ndata: {}\n\n")
                announced = True
            if tail.chunks:
                chunks: list[bytes] = []
                while tail.chunks and (limit is None or sent + len(chunks) < limit):
                    chunks.append(tail.chunks.popleft())
                await response.write(b"".join(chunks))
                sent += len(chunks)
                last = loop.time()
                if limit is not None and sent >= limit:
                    break
                continue
            now = loop.time()
            waits = [beat + HEARTBEAT_S - now]
            if idle_s is not None:
                if now - last >= idle_s:
                    break
                waits.append(last + idle_s - now)
            tail.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(waits))):
                    await tail.wake.wait()
            if loop.time() - beat >= HEARTBEAT_S:
                await response.write(b": alive\n\n")
                beat = loop.time()
        if not tail.dropped:
            await response.write_eof()
        return response
    except ConnectionResetError:  # the client went, or was dropped as too slow
        return response
    finally:
        hub.close(tail)
