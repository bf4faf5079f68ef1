"""Reference interpreter for WINDOW queries (docs/semantics.md, WINDOW).

This is the oracle. It does not use panes: it keeps every selected event of the windows
that are still open and, when a window is released, computes its rows directly from the
events it covers. Faster engines (panes, kernels) are tested against it.

Time windows `[RANGE r SLIDE s WATTR a]`:
- window `end` covers the window times `t` with `end - r < t <= end`, for every
  `end = k * s` (k an integer, negative ones included); an event belongs to every such window;
- event time is the largest window time seen (every event counts, selected or not) or the
  largest punctuation; a window is released once event time exceeds its end (an event with
  time == end does not release it); `flush()` releases every window still holding events;
- a selected event that would belong to a window already released is late: it goes to
  `dead_letters` as `(event, reason)` and into no window at all.

Count windows `[ROWS n SLIDE m]`:
- rows are numbered 1, 2, ... over every event this interpreter is given (before WHERE);
  window k (k >= 1) covers rows `(k*m - n, k*m]` and is released on row `k*m`;
  `window_start`/`window_end` are those row numbers. Windows not reached by the end of the
  stream are never released; punctuations do nothing.

Rows: per window, the selected events (those satisfying WHERE) are grouped by the GROUP BY
attributes; each non-empty group gives one row
`{"query", "key", "seq", "start_seq", "window_start", "window_end", <SELECT items>}`.
Rows released by one call come back in (window_end, key) order, keys ordered as
`cep_core.composite.sort_key` orders them.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from cep_core import ast
from cep_core.checked import CheckedQuery, select_name
from cep_core.composite import partition_key
from cep_core.events import Event
from cep_core.reference.expr import Env, evaluate, fold, holds

INFINITY = math.inf


# ---------------------------------------------------------------- naming and expressions


def aggregate_attr(node: ast.Aggregate) -> str | None:
    """The attribute an aggregate reads; None for count(*).

    The parser writes `count(price)` as Attr(name="", var="price") (its SEQ form,
    `count(dup)`); in a WINDOW query that names the attribute `price`."""
    if node.arg is None:
        return None
    if node.arg.name == "" and node.arg.var is not None:
        return node.arg.var
    return node.arg.name


class EventEnv(Env):
    """WHERE: attributes of the event being filtered."""

    def __init__(self, event: Event):
        self.event = event

    def attr(self, node: ast.Attr) -> Any:
        return self.event.attrs.get(node.name)


class GroupEnv(Env):
    """SELECT: one group of one window.

    An aggregate folds over the group's events in stream order, skipping missing (None)
    values; a sum or average of floats is exactly rounded (math.fsum). A GROUP BY
    attribute is the group's value; the window attribute is the window end."""

    def __init__(self, events: list[Event], group_attrs: set[str], window_attr: str,
                 window_end: int):
        self.events = events
        self.group_attrs = group_attrs
        self.window_attr = window_attr
        self.window_end = window_end

    def attr(self, node: ast.Attr) -> Any:
        if node.name in self.group_attrs:
            return self.events[0].attrs.get(node.name)  # the same for every event of the group
        if node.name == self.window_attr:
            return self.window_end
        raise TypeError(f"SELECT attribute {node.name} is neither a GROUP BY attribute nor "
                        "the window attribute")

    def aggregate(self, node: ast.Aggregate) -> Any:
        if node.func is ast.AggFunc.DELTA:
            raise TypeError("delta is not a window aggregate")
        name = aggregate_attr(node)
        if name is None:  # count(*)
            return len(self.events)
        values = [v for v in (e.attrs.get(name) for e in self.events) if v is not None]
        if node.func in (ast.AggFunc.SUM, ast.AggFunc.AVG) and \
                any(isinstance(v, float) for v in values):
            # Float sums are exactly rounded (the exact sum, rounded once), so they do not
            # depend on the order the values are added in: pane-wise and partial
            # aggregation give the same result (docs/semantics.md, WINDOW).
            total = math.fsum(values)
            return total if node.func is ast.AggFunc.SUM else total / len(values)
        return fold(node.func, values)


def key_order(key: object) -> bytes:
    """Group keys are ordered as the deterministic sort key orders them."""
    return orjson.dumps(key)


# ---------------------------------------------------------------- the interpreter


class WindowInterpreter:
    def __init__(self, checked: CheckedQuery):
        body = checked.query.body
        if not isinstance(body, ast.WindowQuery):
            raise TypeError(f"query {checked.name} is not a WINDOW query")
        self.checked = checked
        self.name = checked.name
        self.body = body
        self.items = [(select_name(item), item.expr) for item in body.items]
        self.group_by = body.group_by
        self.group_attrs = {a.name for a in body.group_by}
        self.dead_letters: list[tuple[Event, str]] = []

        window = body.window
        schema = checked.schema
        if isinstance(window, ast.RowWindow):
            self.rows_based = True
            self.n = window.rows
            self.m = window.slide
            self.window_attr = schema.time
            self.row = 0  # number of the last row seen
            self.recent: list[tuple[int, Event]] = []  # (row number, event) of selected events
        else:
            self.rows_based = False
            self.range = checked.time_units(window.range)
            self.slide = checked.time_units(window.slide)
            self.window_attr = window.attr or schema.time
            self.event_time: float = -INFINITY  # largest window time or punctuation seen
            self.kept: list[tuple[int, Event]] = []  # (window time, event), selected, in order
            self.pending: set[int] = set()  # ends of open windows holding a selected event

    # ------------------------------------------------------------ the Interpreter shape

    def process(self, event: Event) -> list[dict[str, Any]]:
        if self.rows_based:
            return self._process_rows(event)
        return self._process_time(event)

    def punctuate(self, ts: int) -> list[dict[str, Any]]:
        if self.rows_based:
            return []
        return self._advance(ts)

    def flush(self) -> list[dict[str, Any]]:
        if self.rows_based:
            return []
        return self._advance(INFINITY)

    # ------------------------------------------------------------ time windows

    def _window_time(self, event: Event) -> int:
        if self.window_attr == self.checked.schema.time:
            return event.ts
        t: int = event.attrs[self.window_attr]
        return t

    def _ends_of(self, t: int) -> list[int]:
        """Ends of the windows that hold time t: multiples of SLIDE with end - RANGE < t <= end."""
        end = -(-t // self.slide) * self.slide  # the smallest multiple of SLIDE >= t
        ends = []
        while end - self.range < t:
            ends.append(end)
            end += self.slide
        return ends

    def _process_time(self, event: Event) -> list[dict[str, Any]]:
        t = self._window_time(event)
        if holds(self.body.where, EventEnv(event)):
            ends = self._ends_of(t)
            released = [end for end in ends if end < self.event_time]
            if released:
                reason = (f"late event: window time {t} is not above the end {released[0]} "
                          f"of an already emitted window of query {self.name}")
                self.dead_letters.append((event, reason))
                return []
            self.kept.append((t, event))
            self.pending.update(ends)
        return self._advance(t)

    def _advance(self, time: float) -> list[dict[str, Any]]:
        """Event time reaches `time`: release every pending window whose end is below it."""
        if time <= self.event_time:
            return []
        self.event_time = time
        out: list[dict[str, Any]] = []
        for end in sorted(e for e in self.pending if e < self.event_time):
            covered = [ev for t, ev in self.kept if end - self.range < t <= end]
            out.extend(self._rows(covered, end - self.range, end))
            self.pending.discard(end)
        # An event is kept while one of its windows is still open.
        self.kept = [(t, ev) for t, ev in self.kept
                     if any(end >= self.event_time for end in self._ends_of(t))]
        return out

    # ------------------------------------------------------------ count windows

    def _process_rows(self, event: Event) -> list[dict[str, Any]]:
        self.row += 1
        if holds(self.body.where, EventEnv(event)):
            self.recent.append((self.row, event))
        # Keep only the rows a window still to be released can cover: the next window
        # ends at the next multiple of m at or after this row.
        next_end = -(-self.row // self.m) * self.m
        self.recent = [(r, ev) for r, ev in self.recent if r > next_end - self.n]
        if self.row % self.m != 0:
            return []
        end = self.row
        start = end - self.n
        covered = [ev for r, ev in self.recent if start < r <= end]
        return self._rows(covered, start, end)

    # ------------------------------------------------------------ rows of one window

    def _rows(self, events: list[Event], window_start: int,
              window_end: int) -> list[dict[str, Any]]:
        """One row per non-empty group of `events` (the window's selected events, in
        stream order), in key order."""
        groups: dict[bytes, tuple[object, list[Event]]] = {}
        for event in events:
            key = partition_key(self.group_by, event)
            groups.setdefault(key_order(key), (key, []))[1].append(event)
        rows = []
        for order in sorted(groups):
            key, members = groups[order]
            env = GroupEnv(members, self.group_attrs, self.window_attr, window_end)
            row: dict[str, Any] = {"query": self.name, "key": key,
                   "seq": members[-1].seq, "start_seq": members[0].seq,
                   "window_start": window_start, "window_end": window_end}
            for name, expr in self.items:
                row[name] = evaluate(expr, env)
            rows.append(row)
        return rows
