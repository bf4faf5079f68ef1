"""The bound on events too far ahead: one rule for every reader of a stream.

A device with a wrong clock sends an event with a time far in the future (`ts = 1e15` among
trades of today). Taken as it is, it moves the stream's time there: every window ends, and
every later valid event is late (dead letters, "event time goes backwards"), for everyone.
So an event whose time is more than `max_ahead` after the stream's time (the largest event
time accepted so far), or, optionally, more than `max_ahead_of_clock` after the wall clock,
goes to the dead letters with the reason `too far ahead: ...` and changes nothing: neither
the stream's time nor the order of seqs (docs/semantics.md, "Events too far ahead").

Checks come in this order, for every reader: decoding, then the seq order (a seq not above
every seq accepted before it), then this bound. The first event of a stream sets its time
(only the wall-clock bound, when set, can refuse it).

`TimeGuard` holds a stream's bounds and time. `check` takes one event (the record reader,
`event_io.iter_events`); `accept` a whole block of seqs and times at once (the columnar
reader `event_reader`, the Python API, the streaming service's routing core), vectorised,
with the same outcome. Without numpy until a block is checked: `cep run --engine
reference` imports none.
"""

from __future__ import annotations

# Deferred imports: numpy, when a block is checked (`accept`): the record reader of `cep run
# --engine reference` checks events one by one and imports no numpy.

import time as _time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cep_core.schema import NANOS_PER_UNIT, StreamSchema, time_amount

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

TOO_FAR_AHEAD = "too far ahead"
_UNIT_WORDS = {"ms": "ms", "s": "s", "us": "us", "ns": "ns", "ticks": "ticks"}
_FIRST_WINDOW = 4096  # rows checked at once after a rejection (see `accept`)


def wall_clock_units(time_unit: str, now_s: float | None = None) -> int:
    """The wall clock (`now_s` seconds since the epoch, default now) in a time unit."""
    if time_unit not in NANOS_PER_UNIT:
        raise ValueError(f"a stream timed in {time_unit} has no wall-clock time")
    nanos = _time.time_ns() if now_s is None else round(now_s * 1e9)
    return nanos // NANOS_PER_UNIT[time_unit]


def seq_not_increasing(seq: int, last_seq: int) -> str:
    return f"seq {seq} does not increase (previous seq {last_seq})"


@dataclass
class TimeGuard:
    """A stream's bounds (in its time unit; None: no bound) and its time so far.

    `time`: the largest event time accepted (or reached by a punctuation, `advance`), None
    before the first. `now`: the wall clock in the time unit, for `ahead_of_clock` (the
    readers take it once, when they start; the streaming service at every step)."""

    ahead: int | None
    ahead_of_clock: int | None = None
    unit: str = "ms"
    time: int | None = None
    now: int | None = None

    @classmethod
    def of(cls, schema: StreamSchema, max_ahead: object = None, max_ahead_of_clock: object = None,
           now: int | None = None) -> TimeGuard:
        """The guard of a stream: its schema's bounds, or `max_ahead` /
        `max_ahead_of_clock` where given (an option: an int in the time unit, a duration
        text, "none"). With a wall-clock bound and no `now`, the clock is read now."""
        ahead = schema.ahead_bound if max_ahead is None else \
            time_amount(max_ahead, schema.time_unit, "max_ahead")
        of_clock = schema.ahead_of_clock_bound if max_ahead_of_clock is None else \
            time_amount(max_ahead_of_clock, schema.time_unit, "max_ahead_of_clock")
        if of_clock is not None and now is None:
            now = wall_clock_units(schema.time_unit)
        return cls(ahead, of_clock, schema.time_unit, None, now)

    @property
    def bounded(self) -> bool:
        return self.ahead is not None or self.ahead_of_clock is not None

    def advance(self, ts: int) -> None:
        """Time reached `ts` (a punctuation, an event accepted elsewhere)."""
        if self.time is None or ts > self.time:
            self.time = int(ts)

    def reason(self, ts: int) -> str | None:
        """Why an event with time `ts` is too far ahead now, or None."""
        unit = _UNIT_WORDS.get(self.unit, self.unit)
        if self.ahead_of_clock is not None and self.now is not None and \
                ts - self.now > self.ahead_of_clock:
            return (f"{TOO_FAR_AHEAD}: event time {ts} is more than {self.ahead_of_clock} "
                    f"{unit} (max_ahead_of_clock) after the wall clock's time {self.now}")
        if self.ahead is not None and self.time is not None and ts - self.time > self.ahead:
            return (f"{TOO_FAR_AHEAD}: event time {ts} is more than {self.ahead} {unit} "
                    f"(max_ahead) after the stream's time {self.time}")
        return None

    def check(self, ts: int) -> str | None:
        """One event: the reason it is too far ahead (time unchanged), or None (accepted:
        time moves to `ts` when later)."""
        why = self.reason(ts)
        if why is None:
            self.advance(ts)
        return why

    def accept(self, ts: npt.NDArray[np.int64], seq: npt.NDArray[np.int64] | None = None,
               last_seq: int = -1) -> tuple[npt.NDArray[np.bool_], dict[int, str], int]:
        """A block of events in order, as `check` takes them one by one after the seq
        check: with `seq`, a row whose seq is not above `last_seq` and every seq accepted
        before it is refused first (`seq_not_increasing`). A refused row changes nothing
        (neither the time nor the largest seq). Returns the rows kept (bool), the reasons of
        the others (row -> reason, in row order) and the largest seq accepted (`last_seq`
        when none).

        Vectorised: the rows are checked as if none were refused (running maxima); the
        first refusal found is one, and the check goes on after it from the state there,
        a window of rows at a time (a burst of bad rows costs a small window each)."""
        import numpy as np

        ts = np.asarray(ts, dtype=np.int64)
        if seq is not None:
            seq = np.asarray(seq, dtype=np.int64)
        n = len(ts)
        keep = np.ones(n, dtype=bool)
        reasons: dict[int, str] = {}
        start, window = 0, _FIRST_WINDOW
        while start < n:
            stop = min(n, start + window)
            part = None if seq is None else seq[start:stop]
            bad = self._first_refusal(ts[start:stop], part, last_seq)
            if bad is None:
                last_seq = self._commit(ts[start:stop], part, last_seq)
                start, window = stop, window * 2
                continue
            row = start + bad
            last_seq = self._commit(ts[start:row], None if seq is None else seq[start:row],
                                    last_seq)
            keep[row] = False
            if seq is not None and int(seq[row]) <= last_seq:
                reasons[row] = seq_not_increasing(int(seq[row]), last_seq)
            else:
                why = self.reason(int(ts[row]))
                assert why is not None  # the row was refused for its time
                reasons[row] = why
            start, window = row + 1, _FIRST_WINDOW
        return keep, reasons, last_seq

    def _first_refusal(self, ts: npt.NDArray[np.int64], seq: npt.NDArray[np.int64] | None,
                       last_seq: int) -> int | None:
        """The first row that the seq check or a bound refuses, every row before it
        accepted; None when there is none."""
        import numpy as np

        low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        refused = np.zeros(len(ts), dtype=bool)
        if seq is not None:
            before = np.maximum.accumulate(np.concatenate(([last_seq], seq[:-1])))
            refused |= seq <= before
        if self.ahead_of_clock is not None and self.now is not None:
            refused |= ts > min(high, self.now + self.ahead_of_clock)
        if self.ahead is not None:
            start = low if self.time is None else self.time
            before = np.maximum.accumulate(np.concatenate(([start], ts[:-1])))
            # ts - before > ahead without overflow: before + ahead saturates; no time yet
            # (the stream's first event): no bound
            limit = np.where(before > high - self.ahead, high, before + self.ahead)
            refused |= (before != low) & (ts > limit)
        found = np.flatnonzero(refused)
        return int(found[0]) if len(found) else None

    def _commit(self, ts: npt.NDArray[np.int64], seq: npt.NDArray[np.int64] | None,
                last_seq: int) -> int:
        """Rows accepted: the time and the largest seq move on."""
        if len(ts):
            self.advance(int(ts.max()))
            if seq is not None:
                last_seq = max(last_seq, int(seq.max()))
        return last_seq
