"""A MATCH_RECOGNIZE query over columnar batches, run by the reference interpreter
(`cep_core.reference.recognize.RecognizeInterpreter`, Flink 2.3's NFA replayed row by row).

This is the engine every place that runs queries gets for a MATCH_RECOGNIZE query where no
jitted kernel takes it (`cep_core.engine_factory.recognize_engine`): `cep run`, the Python
API, the service's workers, the backfill. It decodes each batch's rows into Events, as the
reference path does (`cep_core.event_reader.events_from_table`), and hands them to the
interpreter, so its composite events are the reference's, dict for dict. It is plain Python
per row and per partial match (docs/queries.md says how fast).

Its state is JSON (no pickle: a snapshot is hostile input): per partition its key, its row
count and last time, the rows its matches hold (once each, by partition-local row index),
and both queues of matches in their exact array order (Java's PriorityQueue order decides
ties, so it must survive a restore), each match as its automaton state (an index in a
stable numbering of the automaton's states) and its rows as (variable, row index).
`load_state` checks all of it and refuses damaged or foreign state (`RecognizeStateError`).
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from cep_core.batch import Batch, StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.composite import partition_key
from cep_core.engine.base import Engine
from cep_core.events import Event
from cep_core.reference import recognize as ref
from cep_core.reference.priority_queue import JavaPriorityQueue
from cep_core.schema import AttrType

STATE_VERSION = 1
_FINAL_ID = -1  # the final state the interpreter gives matches completed by a PROCEED
_KNOWN = ("partial", "completed", "count", "last_ts")  # a partition's fields saved by name
_SCALARS = (int, float, str, bool, type(None))


class RecognizeStateError(ValueError):
    """Saved state that is damaged, or not this query's automaton's."""


class RecognizeInterpreterEngine(Engine):
    """Runs one MATCH_RECOGNIZE query with the reference interpreter (see the module)."""

    def __init__(self, checked: CheckedQuery, strings: StringDictionary,
                 **_options: Any) -> None:
        super().__init__(checked, strings)
        self.interpreter = ref.RecognizeInterpreter(checked)
        self._names = list(self.schema.attributes)
        self._kinds = [self.schema.attributes[n] for n in self._names]
        self._numbering, self._states = ref.number_states(self.interpreter.nfa.start)
        self._variables = {e.var for e in self.interpreter.nfa.elements}

    # ------------------------------------------------------------ running

    def process(self, batch: Batch) -> list[dict[str, Any]]:
        if not len(batch):
            return []
        strings = self.strings.strings
        columns = []
        for name, kind in zip(self._names, self._kinds):
            values = batch.columns[name].tolist()
            columns.append([strings[c] for c in values] if kind is AttrType.STRING else values)
        names, step = self._names, self.interpreter.process
        out: list[dict[str, Any]] = []
        for seq, ts, *values in zip(batch.seq.tolist(), batch.ts.tolist(), *columns):
            found = step(Event(seq, ts, dict(zip(names, values))))
            if found:
                out += found
        self._take_dead_letters()
        return out

    def punctuate(self, ts: int) -> list[dict[str, Any]]:
        out = self.interpreter.punctuate(int(ts))
        self._take_dead_letters()  # (ORDER BY ts, col...: rows held till then, late)
        return out

    def flush(self) -> list[dict[str, Any]]:
        out = self.interpreter.flush()
        self._take_dead_letters()
        return out

    def held_seq(self) -> int | None:
        """The smallest seq of a composite event still to come that ends at or before the
        last row given (None: none can): a completed match waiting behind an earlier
        partial one, or a row of `ORDER BY ts, col` waiting for its time to end. Every
        other such composite has left: a match completes on its last row, so one still to
        complete ends after the rows given."""
        interp = self.interpreter
        waiting = [c.rows[-1][1].seq for part in interp.partitions.values()
                   for c in part.completed.items]
        # ORDER BY ts, col...: rows of one time not taken yet may end a match
        waiting += [e.seq for rows in getattr(interp, "pending", {}).values() for e in rows]
        return min(waiting, default=None)

    def _take_dead_letters(self) -> None:
        dead = self.interpreter.dead_letters
        if dead:
            self.dead_letters.extend((event.seq, reason) for event, reason in dead)
            dead.clear()

    # ------------------------------------------------------------ strings

    def string_codes(self) -> npt.NDArray[np.int64]:
        return np.empty(0, np.int64)  # rows are held decoded: no code to keep

    def remap_strings(self, new_code: npt.NDArray[np.int64]) -> None:
        pass

    # ------------------------------------------------------------ state

    def state(self) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
        interp = self.interpreter
        partitions = []
        for slot, part in interp.partitions.items():
            rows: dict[int, Event] = {}
            queues: dict[str, list[Any]] = {}
            for name in ("partial", "completed"):
                queues[name] = [self._computation(c, rows) for c in getattr(part, name).items]
            extra = {k: v for k, v in vars(part).items() if k not in _KNOWN}
            for k, v in extra.items():
                if not isinstance(v, _SCALARS):
                    raise TypeError(f"a MATCH_RECOGNIZE partition's {k!r} is not a value "
                                    "the engine's state can hold")
            partitions.append({
                "key": interp.keys[slot], "count": part.count, "last_ts": part.last_ts,
                "rows": [[i, *self._saved_row(e)] for i, e in sorted(rows.items())],
                **queues, "extra": extra})
        # ORDER BY ts, col...: the rows of a partition's latest time, not taken yet
        pending = [[self._saved_row(e) for e in rows]
                   for rows in getattr(interp, "pending", {}).values() if rows]
        return {"recognize": {"version": STATE_VERSION, "automaton": self._signature(),
                              "partitions": partitions, "pending": pending}}, {}

    def _saved_row(self, e: Event) -> list[Any]:
        return [e.seq, e.ts, [_save(e.attrs.get(n)) for n in self._names]]

    def _computation(self, c: ref.Computation, rows: dict[int, Event]) -> list[Any]:
        for (_, event), index in zip(c.rows, c.indexes):
            rows[index] = event
        state = _FINAL_ID if c.state is ref._FINAL else self._numbering[id(c.state)]
        return [state, [[var, index] for (var, _), index in zip(c.rows, c.indexes)]]

    def _signature(self) -> list[Any]:
        """The automaton as numbered: each state's variable, whether it is final, and its
        edges (action, target, the DEFINE it reads, the DEFINEs it must not satisfy)."""
        return [[s.var, s.final, [[t.action, self._numbering[id(t.target)],
                                   t.condition.var, list(t.condition.unless)]
                                  for t in s.transitions]] for s in self._states]

    def load_state(self, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]]) -> None:
        try:
            partitions, keys = self._loaded(meta, arrays)
            pending = self._pending(meta["recognize"].get("pending"), partitions)
        except RecognizeStateError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise RecognizeStateError(f"query {self.checked.name!r}: damaged MATCH_RECOGNIZE "
                                      f"state ({type(e).__name__}: {e})") from None
        interp = self.interpreter
        interp.partitions, interp.keys = partitions, keys
        interp.dead_letters = []
        if hasattr(interp, "pending"):
            interp.pending = pending

    def _refuse(self, why: str) -> NoReturn:
        raise RecognizeStateError(f"query {self.checked.name!r}: MATCH_RECOGNIZE state "
                                  f"refused: {why}")

    def _loaded(self, meta: Any, arrays: dict[str, npt.NDArray[Any]]
                ) -> tuple[dict[Any, ref._Partition], dict[Any, Any]]:
        refuse = self._refuse
        state = meta.get("recognize") if isinstance(meta, dict) else None
        if not isinstance(state, dict) or arrays:
            refuse("not the state of a MATCH_RECOGNIZE engine")
        if state.get("version") != STATE_VERSION:
            refuse(f"state version {state.get('version')!r}, this engine reads "
                   f"{STATE_VERSION}")
        if state.get("automaton") != self._signature():
            refuse("it was saved by another pattern's automaton")
        if not isinstance(state.get("partitions"), list):
            refuse("no list of partitions")
        partitions: dict[Any, ref._Partition] = {}
        keys: dict[Any, Any] = {}
        for at, saved in enumerate(state["partitions"]):
            if not isinstance(saved, dict) or set(saved) != {
                    "key", "count", "last_ts", "rows", "partial", "completed", "extra"}:
                refuse(f"partition {at}: not a partition's fields")
            key = saved["key"]
            if len(self.query.partition_by) > 1:
                if not (isinstance(key, list) and len(key) == len(self.query.partition_by)
                        and all(isinstance(k, _SCALARS) for k in key)):
                    refuse(f"partition {at}: key {key!r} is not one value per PARTITION BY "
                           "attribute")
            elif not isinstance(key, _SCALARS) or (key is not None and
                                                    not self.query.partition_by):
                refuse(f"partition {at}: key {key!r} is not a PARTITION BY value")
            slot = ref._hashable(key)
            if slot in partitions:
                refuse(f"partition {at}: key {key!r} appears twice")
            part = ref._Partition(self.interpreter.nfa.start)
            count, last_ts = saved["count"], saved["last_ts"]
            if not _is_int(count) or count < 0:
                refuse(f"partition {at}: row count {count!r}")
            if not (last_ts is None or _is_int(last_ts)) or (last_ts is None) != (count == 0):
                refuse(f"partition {at}: last time {last_ts!r} after {count} rows")
            part.count, part.last_ts = count, last_ts
            rows = self._rows(saved["rows"], count, last_ts, at)
            partial = self._queue(saved["partial"], rows, False, at)
            completed = self._queue(saved["completed"], rows, True, at)
            starts = [c for c in partial.items if not c.rows]
            if len(starts) != 1 or starts[0].state is not self.interpreter.nfa.start:
                refuse(f"partition {at}: the start computation is missing or doubled")
            part.partial, part.completed = partial, completed
            extra, fields = saved["extra"], sorted(k for k in vars(part) if k not in _KNOWN)
            if not isinstance(extra, dict) or sorted(extra) != fields:
                refuse(f"partition {at}: extra fields {extra!r}, this engine's partitions "
                       f"have {fields}")
            for k, v in extra.items():
                if type(v) is not type(getattr(part, k)) and getattr(part, k) is not None:
                    refuse(f"partition {at}: field {k!r} = {v!r}")
                setattr(part, k, v)
            partitions[slot], keys[slot] = part, key
        return partitions, keys

    def _rows(self, saved: Any, count: int, last_ts: Any, at: int) -> dict[int, Event]:
        refuse = self._refuse
        rows: dict[int, Event] = {}
        if not isinstance(saved, list):
            refuse(f"partition {at}: rows are not a list")
        for row in saved:
            if not (isinstance(row, list) and len(row) == 4):
                refuse(f"partition {at}: a row is not [index, seq, ts, values]")
            index = row[0]
            if not (_is_int(index) and 0 <= index < count) or index in rows:
                refuse(f"partition {at}: row index {index!r} (of {count} rows)")
            rows[index] = self._loaded_row(row[1:], f"partition {at}: row {index}")
            if rows[index].ts > last_ts:
                refuse(f"partition {at}: row {index}: time {rows[index].ts} after the "
                       f"partition's last, {last_ts}")
        return rows

    def _loaded_row(self, row: Any, where: str) -> Event:
        """[seq, ts, values] as the Event it was."""
        refuse = self._refuse
        if not (isinstance(row, list) and len(row) == 3):
            refuse(f"{where}: not [seq, ts, values]")
        seq, ts, values = row
        if not (_is_int(seq) and _is_int(ts)):
            refuse(f"{where}: seq {seq!r}, time {ts!r}")
        if not (isinstance(values, list) and len(values) == len(self._names)):
            refuse(f"{where}: not one value per attribute")
        attrs: dict[str, Any] = {}
        for name, kind, value in zip(self._names, self._kinds, values):
            loaded = _load(kind, value)
            if loaded is _BAD:
                refuse(f"{where}: {name} = {value!r} is not a {kind}")
            attrs[name] = loaded
        if attrs.get(self.schema.time, ts) != ts:
            refuse(f"{where}: its time is not its {self.schema.time}")
        return Event(seq, ts, attrs)

    def _pending(self, saved: Any, partitions: dict[Any, ref._Partition]
                 ) -> dict[Any, list[Event]]:
        """ORDER BY ts, col...: each partition's rows of one time, waiting to go in."""
        refuse = self._refuse
        if saved is None or not isinstance(saved, list):
            refuse("no list of pending rows")
        if saved and not hasattr(self.interpreter, "pending"):
            refuse("rows waiting to be sorted, which this engine does not keep")
        pending: dict[Any, list[Event]] = {}
        for at, rows in enumerate(saved):
            if not (isinstance(rows, list) and rows):
                refuse(f"pending rows {at}: not a list of rows")
            events = [self._loaded_row(row, f"pending rows {at}") for row in rows]
            slots = {ref._hashable(partition_key(self.query.partition_by, e)) for e in events}
            if len(slots) != 1 or len({e.ts for e in events}) != 1:
                refuse(f"pending rows {at}: not rows of one partition and one time")
            [slot] = slots
            part = partitions.get(slot)
            if slot in pending or (part is not None and part.last_ts is not None and
                                   events[0].ts < part.last_ts):
                refuse(f"pending rows {at}: a partition's twice, or before its last time")
            pending[slot] = events
        return pending

    def _queue(self, saved: Any, rows: dict[int, Event], final: bool,
               at: int) -> JavaPriorityQueue[ref.Computation]:
        refuse = self._refuse
        which = "completed" if final else "partial"
        if not isinstance(saved, list):
            refuse(f"partition {at}: {which} matches are not a list")
        items: list[ref.Computation] = []
        for entry in saved:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
                refuse(f"partition {at}: a {which} match is not [state, rows]")
            state_id, taken = entry
            if state_id == _FINAL_ID:
                state = ref._FINAL
            elif _is_int(state_id) and 0 <= state_id < len(self._states):
                state = self._states[state_id]
            else:
                refuse(f"partition {at}: a {which} match in state {state_id!r}")
            if state.final != final or (final and not taken):
                refuse(f"partition {at}: a {which} match in state {state_id!r} with "
                       f"{len(taken)} rows")
            pairs: list[tuple[str, Event]] = []
            indexes: list[int] = []
            for item in taken:
                if not (isinstance(item, list) and len(item) == 2 and
                        item[0] in self._variables and _is_int(item[1]) and item[1] in rows):
                    refuse(f"partition {at}: a {which} match's row {item!r}")
                if indexes and item[1] <= indexes[-1]:
                    refuse(f"partition {at}: a {which} match's rows are out of order")
                pairs.append((item[0], rows[item[1]]))
                indexes.append(item[1])
            items.append(ref.Computation(state, pairs, indexes))
        queue = ref._queue([])
        queue.items = items  # the exact array order: ties leave in the order Java's heap gives
        for i in range(1, len(items)):
            if items[(i - 1) >> 1].start > items[i].start:
                refuse(f"partition {at}: the {which} matches are not in heap order")
        return queue


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _save(value: object) -> object:
    """A row's value as JSON: a float that JSON cannot hold (NaN, infinities) as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


_BAD = object()


def _load(kind: AttrType, value: object) -> object:
    if value is None:
        return None
    if kind is AttrType.STRING:
        return value if isinstance(value, str) else _BAD
    if kind is AttrType.BOOL:
        return value if isinstance(value, bool) else _BAD
    if kind in (AttrType.INT, AttrType.TIMESTAMP):
        return value if _is_int(value) else _BAD
    if kind is AttrType.FLOAT:
        if isinstance(value, str):
            return float(value) if value in ("nan", "inf", "-inf") else _BAD
        return float(value) if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else _BAD
    return _BAD
