"""The coordinator's merge, without Kafka: composite events by sequence number.

`Merger` tracks, per keyed partition, `upto` (processed up to that seq) and the stream
time `ts` there. A composite event with seq s is final once no partition can still
produce one with a smaller sort key:

- MATCH (horizon 0): every partition has passed s.
- Queries that report late (SEQ windows, time windows; horizon H in time units): the
  slowest partition's stream time T is such that every event up to s had time < T - H.
- Unbounded horizons (count windows, windows over another attribute): end of input.
- MATCH_RECOGNIZE: as MATCH, but below the smallest seq any partition says it `held` (a
  match waiting behind an earlier partial one leaves later with its last row's seq; every
  other one up to a partition's `upto` has left it, as a match completes on its last row).

The Kafka shell (`Coordinator`, services/stream/coordinator.py) consumes the match topic,
feeds the frames here, writes what `release` gives and checkpoints `state()`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque

import orjson

from cep_core.ast import QueryKind
from cep_core.composite import sort_key
from cep_core.control_message import INFINITE, QUERY, LiveRegistry, check_query, horizon
from cep_core.schema import SchemaRegistry
from cep_service.stream import frames
from cep_service.stream.frames import Frame, LiveSetFrame


class QueryInfo:
    def __init__(self, name: str, index: int, output: str, horizon_: int | None,
                 text: str = "", held: bool = False) -> None:
        self.name, self.index, self.output, self.horizon = name, index, output, horizon_
        self.text = text
        self.held = held  # its composites may be held back (MATCH_RECOGNIZE)


class Merger:
    """The release logic, without Kafka: feed frames, take what is final."""

    def __init__(self, partitions: int, stream: str,
                 registry: LiveRegistry | SchemaRegistry | None = None) -> None:
        self.partitions = partitions
        self.stream = stream
        self.registry = registry if isinstance(registry, LiveRegistry) else \
            LiveRegistry(registry)
        self.upto = [-1] * partitions
        self.held: list[int | None] = [None] * partitions  # each one's smallest held seq
        self.pulses: deque[tuple[int, int]] = deque()  # (upto, ts), increasing upto
        self.ends: dict[int, set[int]] = {}  # end-of-input seq -> partitions that reached it
        self.queries: dict[str, QueryInfo] = {}
        self.pending: dict[str, list] = {}  # output topic -> heap
        self.counter = itertools.count()
        self.control_seen: dict[tuple, set[int]] = {}
        self.live_events: list[dict] = []  # (name, op, at, latency) once all partitions had it
        self.ended: list[int] = []  # ends of input whose composite events are all released
        self.received = 0  # composite events fed
        self.released: dict[str, tuple] = {}  # output -> (sort key, composite, query index)
        self.repeats = 0  # composite events dropped as already released
        self.frames: dict[int, tuple] = {}  # partition -> (ts, Unix time) of its last frame

    def feed(self, frame: Frame) -> None:
        part = frame.get("part")
        if frame.kind is frames.CONTROL:
            self._control(frame, part)
            return
        if frame.payload:
            composites = orjson.loads(frame.payload)
            self.received += len(composites)
            for composite in composites:
                info = self.queries.get(composite["query"])
                if info is None:
                    continue
                key = sort_key(composite, info.index)
                heapq.heappush(self.pending.setdefault(info.output, []),
                               (key, next(self.counter), composite))
        upto, ts = frame.get("upto"), frame.get("ts")
        if upto is None or upto < self.upto[part]:
            return
        self.frames[part] = (ts, time.time())
        self.upto[part] = upto
        self.held[part] = frame.get("held")
        # a pulse with a later time at the same upto: an idle stream's time advanced
        if ts is not None and (not self.pulses or upto > self.pulses[-1][0] or
                               (upto == self.pulses[-1][0] and ts > self.pulses[-1][1])):
            self.pulses.append((upto, ts))
        if frame.kind is frames.END:
            self.ends.setdefault(upto, set()).add(part)

    def _control(self, frame: Frame, part: int) -> None:
        change = frames.control_of(frame)
        if isinstance(change, LiveSetFrame):
            for entry in change.streams:
                self.registry.learn(entry["name"], entry["text"], entry["version"])
            entries, changes = list(change.queries), list(change.changes)
            name, kind, marked = None, QUERY, None
        else:
            if change.of_stream:
                # a stream's change holds its text (empty once removed) and version
                assert change.text is not None and change.version is not None
                self.registry.learn(change.name, change.text, change.version)
            entries = [] if change.of_stream else [change.query_entry()]
            changes = [] if change.key is None else [change.named()]
            name, kind, marked = change.name, change.kind, change.key or change.name
        for entry in entries:
            if entry.get("text"):
                self._add_query(entry)
        marker = (change.op, marked, frame.get("at"))
        seen = self.control_seen.setdefault(marker, set())
        seen.add(part)
        if len(seen) == self.partitions:
            del self.control_seen[marker]
            sent = frame.get("sent_ms")
            self.live_events.append({"op": change.op, "name": name, "kind": kind,
                                     "at": frame.get("at"), "latency_ms": None if sent is None
                                     else round(time.time() * 1000 - sent, 1),
                                     "changes": changes})

    def summary(self) -> dict:
        """What is live here: query names with their index, stream versions."""
        return {"queries": {q.name: q.index for q in self.queries.values()},
                "streams": self.registry.versions()}

    def _add_query(self, entry: dict) -> None:
        checked = check_query(entry["name"], entry["text"], self.registry)
        held = checked.query.kind is QueryKind.RECOGNIZE  # released as MATCH, below `held`
        self.queries[entry["name"]] = QueryInfo(entry["name"], entry["index"],
                                                checked.query.output,
                                                0 if held else horizon(checked),
                                                entry["text"], held)

    def mark_released(self, output: str, composite: dict, index: int) -> None:
        """Record that `composite` is on `output` (found there after a restart)."""
        key = sort_key(composite, index)
        if output not in self.released or self.released[output][0] < key:
            self.released[output] = (key, composite, index)

    # ------------------------------------------------------------ checkpoints

    def state(self) -> dict:
        return {"upto": self.upto, "held": self.held, "pulses": list(self.pulses),
                "ends": [[e, sorted(p)] for e, p in self.ends.items()],
                "queries": [{"name": q.name, "index": q.index, "text": q.text}
                            for q in self.queries.values()],
                "pending": {o: [[c, k[1]] for k, _, c in sorted(h)]
                            for o, h in self.pending.items()},
                "control_seen": [[list(m), sorted(p)] for m, p in self.control_seen.items()],
                "ended": self.ended, "received": self.received,
                "released": {o: [c, i] for o, (_, c, i) in self.released.items()}}

    def load_state(self, state: dict) -> None:
        self.upto = state["upto"]
        self.held = list(state.get("held") or [None] * len(self.upto))  # not kept before
        self.pulses = deque(tuple(p) for p in state["pulses"])
        self.ends = {e: set(p) for e, p in state["ends"]}
        self.queries = {}
        for entry in state["queries"]:
            self._add_query(entry)
        self.pending = {}
        for output, entries in state["pending"].items():
            self.pending[output] = [(sort_key(c, i), next(self.counter), c) for c, i in entries]
            heapq.heapify(self.pending[output])
        self.control_seen = {tuple(m): set(p) for m, p in state["control_seen"]}
        self.ended, self.received = state["ended"], state["received"]
        self.released = {}
        for output, (composite, index) in state["released"].items():
            self.mark_released(output, composite, index)

    def bound(self, output: str) -> int:
        """The largest seq up to which composite events for `output` are final."""
        low = min(self.upto)
        ended = max(self.ended, default=-1)
        if any(q.held for q in self.queries.values() if q.output == output):
            low = min([low] + [h - 1 for h in self.held if h is not None])
        horizons = [q.horizon for q in self.queries.values() if q.output == output]
        finite = [h for h in horizons if h is not INFINITE and h is not None]
        if len(finite) < len(horizons):  # an INFINITE horizon
            return ended
        widest = max(finite, default=0)
        if widest == 0:
            return max(low, ended)
        now = next((ts for upto, ts in reversed(self.pulses) if upto <= low), None)
        if now is None:
            return ended
        final = max([upto for upto, ts in self.pulses if upto <= low and ts < now - widest],
                    default=-1)
        return max(final, ended)

    def release(self) -> list[tuple[str, dict]]:
        for end in sorted(e for e, parts in self.ends.items() if len(parts) == self.partitions):
            del self.ends[end]
            self.ended.append(end)
        out = []
        for output, heap in self.pending.items():
            if not heap:
                continue
            limit = self.bound(output)
            last = self.released.get(output)
            while heap and heap[0][0][0] <= limit:
                key, _, composite = heapq.heappop(heap)
                if last is not None and key <= last[0]:
                    self.repeats += 1
                    continue
                last = (key, composite, key[1])
                out.append((output, composite))
            if last is not None:
                self.released[output] = last
        self._prune()
        return out

    def _prune(self) -> None:
        """Keep the pulses a bound can still need."""
        widest = max([q.horizon or 0 for q in self.queries.values()], default=0)
        low = min(self.upto)
        now = next((ts for upto, ts in reversed(self.pulses) if upto <= low), None)
        if now is None:
            return
        while len(self.pulses) > 2 and self.pulses[1][0] <= low and \
                self.pulses[1][1] < now - widest:
            self.pulses.popleft()
