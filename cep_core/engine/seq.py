"""The jitted SEQ engine by column-based delayed processing (CDP, Cugola & Margara).

`SeqEngine(program, strings, **options)` holds the state of one query whose program (its
plan, `cep_core.compiler.seq_plan`, and generated numba kernel, `cep_core.compiler.seq_cdp`;
built by `cep_core.compiler.seq_programs.compile_cdp`) it is given: per-type columns per
partition, matches built back from each terminator. It evaluates skip-till-any-match
queries (with TESLA's EACH / LAST / FIRST).

The planner is `cep_core.engine_factory.create_engine`: skip-till-next-match,
strict-contiguity and a forced `algorithm="aip"` go to the incremental automata
(`cep_core.engine.seq_aip`), everything else here. Asked for a CDP engine
(`engine_factory.seq_engine(checked, strings, algorithm="auto"|"cdp")`) for "aip" or a run
strategy, the factory raises `NotSupportedError` naming it.

Options (others are ignored, so one option set can serve every engine kind):
- `max_matches_per_event` (default 1,000,000) and `max_subsets_per_event` (Kleene subsets
  examined, default 10,000,000): the most one arriving event may produce / examine. Under
  skip-till-any-match the number of matches is exponential in the worst case; past either
  limit the engine stops building matches for that event.
- `on_overflow`: "error" (default) raises `SeqOverflowError` naming the event and the limit
  (the engine's state is then undefined: restore a snapshot); "count" keeps the matches
  found up to the limit, drops the rest and counts the event in `metrics()["overflows"]`.
- `idle_timeout` (event-time units, None: never): idle partitions lose their stored
  events, counted in `metrics()["evicted_keys"]` (`cep_core.engine.seq_idle`).

Results (composite events, dead letters, pending matches released by punctuations or
flush) are identical to the reference interpreter's (`cep_core.reference.seq`). Composite
events are read-only: an event bound by several composites returned by one call is one
dict shared by them.

Memory: a partition keeps, per channel, the events within the query's horizon (WITHIN, or
the TESLA chain of `WITHIN w FROM y`, plus the longest window aggregate) of its latest
event or oldest pending match; older rows are evicted when its table fills or the arena is
compacted. Without any window the events are kept, as the reference keeps them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cep_core.batch import Batch, StringDictionary
from cep_core.composite_batch import CompositeBatch, to_dicts
from cep_core.engine.base import Arrays, Composite, Meta
from cep_core.engine.seq_base import BACKWARDS_TIME, Overflow, SeqEngineBase
from cep_core.engine.seq_checks import check_channel_state
from cep_core.engine.seq_idle import drop_events, idle_partitions
from cep_core.kernels.seq_layout import ERR, OVF, PALIVE

__all__ = ["BACKWARDS_TIME", "NotSupportedError", "SeqEngine", "SeqOverflowError"]


class NotSupportedError(NotImplementedError):
    """The engine cannot evaluate this query with the requested algorithm (yet)."""


class SeqOverflowError(RuntimeError):
    """One event would produce more matches (or examine more Kleene subsets) than allowed."""


class SeqEngine(SeqEngineBase):
    def __init__(self, program: Any, strings: StringDictionary,
                 max_matches_per_event: int = 1_000_000,
                 max_subsets_per_event: int = 10_000_000, on_overflow: str = "error",
                 idle_timeout: int | None = None, **_other_options: object):
        # `program`: `cep_core.compiler.seq_programs.compile_cdp`'s, shared by the query's
        # engines (Any: cep_core.engine does not import the compiler).
        super().__init__(program.checked, strings)
        self.plan = program.plan
        self.kernel = program.kernel
        self.algorithm = "cdp"
        self.max_matches = int(max_matches_per_event)
        self.max_subsets = int(max_subsets_per_event)
        self.pending_kleene_slots = np.array(self.kernel.kleene_slots, np.int64)
        self._setup(idle_timeout, on_overflow)
        self._reset()

    def _reset(self) -> None:
        self._reset_channels()

    # ------------------------------------------------------------ processing

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        pid = self._keyed(batch)
        if pid is None:
            return []
        n = len(pid)
        EI, EF = self._columns(batch)
        sc, tables = self._strings()
        stop = self.on_overflow is Overflow.ERROR
        (n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn, n_dead, dead, self.pd, self.pk,
         arenas) = self.module.process(
            n, pid, EI, EF, *self._arenas(), self.base, self.size, self.cnt, self.evicted,
            self.top, self.last_ts, self.pd, self.pk, self.phead, self.ptail, self.pdec,
            self.pfirst, self.ctr, self.punct, sc, *tables, self.max_matches,
            self.max_subsets, stop)
        # Deliberately like cep_core/engine/seq_aip.py's: each engine calls its own kernel, then
        # takes back what it grew
        self._take_arenas(arenas)
        self._reject_backwards(batch, dead, n_dead)
        if self.ctr[ERR] >= 0:
            t = int(self.ctr[ERR])
            raise SeqOverflowError(
                f"query {self.checked.name!r}: the event with seq {int(batch.seq[t])} would "
                f"build more than {self.max_matches} matches or examine more than "
                f"{self.max_subsets} Kleene subsets (options max_matches_per_event, "
                "max_subsets_per_event; on_overflow='count' drops the excess and counts it)")
        out = self._decode(n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn)
        self._maybe_compact_pending()
        self.idle.advance(batch.ts.max())
        self._sweep()
        return [out] if len(out) else []

    def punctuate(self, ts: int) -> list[Composite]:
        return to_dicts(self.punctuate_columns(ts))

    def punctuate_columns(self, ts: int) -> list[CompositeBatch]:
        if ts > self.punct:
            self.punct = int(ts)
        out = self._release_all(False)
        self.idle.advance(ts)
        self._sweep()
        return out

    def _sweep(self) -> None:
        timeout = self.idle.timeout
        if timeout is None or not self.idle.due():
            return
        P = self.P
        none_live = np.zeros(P, np.int64)
        parts = idle_partitions(self.idle.clock, timeout, self.last_ts, self.cnt,
                                self.phead, none_live, P, True)
        drop_events(parts, self.cnt, self.evicted)
        self.idle.evicted += len(parts)
        # then the partitions themselves: memory is bounded by those live within the
        # timeout (sound under eviction's own assumption, as for MATCH keys)
        self._release(idle_partitions(self.idle.clock, timeout, self.last_ts,
                                      self.cnt, self.phead, none_live, P, False))

    def flush(self) -> list[Composite]:
        return to_dicts(self.flush_columns())

    def flush_columns(self) -> list[CompositeBatch]:
        return self._release_all(True)

    def _release_all(self, force: bool) -> list[CompositeBatch]:
        if self.ctr[PALIVE] == 0:
            return []
        sc, tables = self._strings()
        res = self.module.release_all(
            self.punct, force, *self._arenas(), self.base, self.cnt, self.evicted, self.last_ts,
            self.pd,
            self.pk, self.phead, self.ptail, self.pdec, self.pfirst, self.ctr, sc, *tables)
        out = self._decode(*res)
        self._maybe_compact_pending()
        return [out] if len(out) else []

    def metrics(self) -> dict[str, int]:
        return {"partitions": self.P, "overflows": int(self.ctr[OVF]),
                "pending": int(self.ctr[PALIVE]),
                "stored_events": int(self.cnt[:self.P].sum()),
                "evicted_keys": self.idle.evicted, "released_keys": self.idle.released}

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[Meta, Arrays]:
        self._maybe_compact_pending(force=True)
        return self._channel_state()

    def load_state(self, meta: Meta, arrays: Arrays) -> None:
        check_channel_state(self, meta, arrays, len(self.strings))  # before any change
        self._reset()
        self._load_channel_state(meta, arrays)
