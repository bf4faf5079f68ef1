"""The stream's time rules of a splitter's router (services/stream/routing.py, whose
docstring has them): the guard against events too far ahead and the idle advance, with
the clocks they read. Kafka-free."""

from __future__ import annotations

import time
from collections.abc import Callable

from cep_core.schema import StreamSchema, time_amount, units_per_ms
from cep_core.time_guard import TimeGuard, wall_clock_units


class StreamTime:
    """`max_ahead`, `max_ahead_of_clock`, `idleness`: the options (None takes the
    schema's field); `clock` (seconds, monotonic) measures idleness, `wall_clock` (seconds
    since the epoch) is the time `max_ahead_of_clock` bounds; tests give fake ones."""

    def __init__(self, max_ahead: int | str | None = None,
                 max_ahead_of_clock: int | str | None = None,
                 idleness: int | str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.options = {"max_ahead": max_ahead, "max_ahead_of_clock": max_ahead_of_clock,
                        "idleness": idleness}
        self.clock, self.wall_clock = clock, wall_clock
        self.guard: TimeGuard | None = None  # made with the schema
        self.known = False  # False until the guard's time is taken (`guard_now`)
        self.idleness: int | None = None  # in the stream's time unit (ticks: ms)
        self.last_event: tuple[float, int | None] | None = None  # (clock, stream time) then
        self.idle_advances = 0  # pulses that advanced the time of an idle stream

    def setup(self, schema: StreamSchema) -> None:
        """The bounds on events too far ahead and the idleness in the schema's time unit
        (a new version of the schema keeps the time)."""
        previous = self.guard
        self.guard = TimeGuard.of(schema, self.options["max_ahead"],
                                  self.options["max_ahead_of_clock"], now=0)
        if previous is not None and previous.time is not None:
            self.guard.advance(previous.time)
        idleness = self.options["idleness"]
        self.idleness = schema.idleness_units if idleness is None else \
            time_amount(idleness, schema.time_unit, "idleness")

    def guard_now(self, schema: StreamSchema, restored: int | None) -> TimeGuard:
        """The guard, its wall clock read now. Its time is the largest event time
        accepted (or reached by an idle advance); after a restart it is taken, once, from
        `restored` (the checkpoint's `max_ts`, None before any seq)."""
        guard = self.guard
        assert guard is not None, "setup first"
        if not self.known:
            self.known = True
            if restored is not None:
                guard.advance(restored)
        if guard.ahead_of_clock is not None:
            guard.now = wall_clock_units(schema.time_unit, self.wall_clock())
        return guard

    def accepted(self) -> None:
        """An event was accepted: idle from now on, at the guard's time."""
        assert self.guard is not None
        self.last_event = (self.clock(), self.guard.time)

    def input_ended(self) -> None:
        """A next input has its own time."""
        assert self.guard is not None
        self.guard.time, self.last_event = None, None

    def idle_time(self, schema: StreamSchema | None,
                  restored: int | None) -> tuple[int, float] | None:
        """(time, idle ms) when no event was accepted for `idleness` by `clock`: the time
        at the last event plus the wall-clock time since (in the time unit, rounded
        down); None while not idle."""
        if self.idleness is None or schema is None:
            return None
        if self.last_event is None:  # a restart: idle from now on, at the restored time
            time_now = self.guard_now(schema, restored).time
            if time_now is not None:
                self.last_event = (self.clock(), time_now)
            return None
        since, base = self.last_event
        if base is None:  # (an accepted event always gives the guard a time)
            return None
        elapsed_ms = (self.clock() - since) * 1000
        per_ms = units_per_ms(schema.time_unit)
        if elapsed_ms * per_ms < self.idleness:
            return None
        return base + int(elapsed_ms * per_ms), elapsed_ms

    def advanced(self, ts: int, schema: StreamSchema, restored: int | None) -> None:
        """The stream's time moved to `ts` while idle."""
        self.guard_now(schema, restored).advance(ts)
        self.idle_advances += 1
