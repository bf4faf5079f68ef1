"""The engines in Spark's keyed state: `applyInPandasWithState` over (group, shard, slot).

The job routes every event to one shard of each query group (`plan.py`'s groups: MATCH
and SEQ with PARTITION BY split by a hash of their keys into `shards`, everything else in
shard 0), so a Spark state key is one shard of one group, like a keyed partition of the
Kafka service. For each key and micro-batch, `ShardRunner`:

1. gets the shard's `StreamEngines`: the ones this Python worker kept from the last
   micro-batch when the state's version says they are that state, else fresh engines
   restored from the state's snapshot (a restart, a task moved to another worker);
2. runs the micro-batch's events in the sequencer's order, which is seq order (the
   packed rows of `packed.py`, put back in order by their part number: no sort; an end
   of input flushes, as at the end of `cep run`, and the engines start afresh after it);
3. stores the engines' snapshot (`StreamEngines.snapshot`) as the new state, with the
   version and the queries' fingerprints, and yields composite events and rejected
   events as rows (`cep_service.backfill.engines.result_batches`).

Queries that change (the job restarted from its checkpoint with another query file): a
query whose fingerprint is in the state gets its state back; a new or changed one starts
afresh; a removed one's state is dropped (`kept_snapshot`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from cep_core import snapshot_format
from cep_core.checked import CheckedQuery
from cep_core.runner import new_engines
from cep_service.backfill.engines import RESULT_NAMES, _rejected_rows, result_batches
from cep_service.spark_stream.packed import DEAD_GROUP, pack_results, unpack_rows
from cep_service.spark_stream.sequencer import DEAD, DEAD_LETTER, END, KIND

STATE_SCHEMA = "version long, snapshot binary, fingerprints string"
SLICE_ROWS = 65_536
_COMMENT_LINE = re.compile(r"^\s*--.*$", re.MULTILINE)
# Engines kept by this Python worker between micro-batches: (job, the group's query
# fingerprints, group, shard) -> (state version, engines, encoder). Spark reuses its
# Python workers, so the next micro-batch of a shard usually finds its engines here and
# restores nothing.
_KEPT: dict[tuple, tuple] = {}
# One CheckedQuery per query text and place in this Python worker: every task unpickles its
# own copies, and the compiled programs (numba kernels) are kept per CheckedQuery object
# (`cep_core.compiler.programs.once_per_query`), so engines made from the first copy seen
# share its programs instead of compiling them again.
_CANONICAL: dict[tuple, CheckedQuery] = {}


def fingerprint(text: str) -> str:
    """A query's text as the query file gives it (`cep_service.stream.control.split_query_file`),
    whole-line comments and the spacing aside: equal for the same query, whatever version
    of the code (unlike its AST) reads it."""
    words = _COMMENT_LINE.sub("", text).split()
    return hashlib.blake2b(" ".join(words).encode(), digest_size=12).hexdigest()


def kept_snapshot(data: bytes, names: set[str], groupings: set[tuple]) -> bytes:
    """An engines snapshot holding only the queries `names` (and of the WINDOW key
    indexes, those of `groupings`), to restore into engines made for those queries."""
    meta, arrays = snapshot_format.unpack_arrays("engines", data)
    keep = {f"e{i}" for i, name in enumerate(meta["engines"]) if name in names}
    out = {f"e{i}": arrays[k] for i, k in enumerate(sorted(keep, key=lambda k: int(k[1:])))}
    engines = [name for name in meta["engines"] if name in names]
    windows = meta["windows"]
    if windows is not None:
        queries = [(i, q) for i, q in enumerate(windows["queries"]) if q["name"] in names]
        for new, (old, _) in enumerate(queries):
            prefix = f"w_q{old}_"
            out.update({f"w_q{new}_{k[len(prefix):]}": v for k, v in arrays.items()
                        if k.startswith(prefix)})
        windows = {"queries": [q for _, q in queries],
                   "groupings": [g for g in windows["groupings"]
                                 if tuple(g["attrs"]) in groupings]} if queries else None
    meta = {**meta, "engines": engines, "windows": windows}
    return snapshot_format.pack_arrays("engines", meta, out)


class ShardRunner:
    """The function `applyInPandasWithState` calls for each (group, shard, slot) key."""

    def __init__(self, job: str, groups: dict[str, list[CheckedQuery]], kernel_cache: str,
                 fingerprints: dict[str, str]):
        self.job = job
        self.groups = groups
        self.kernel_cache = kernel_cache
        self._canonical = False
        self.fingerprints = {g: {q.name: fingerprints[q.name] for q in qs}
                             for g, qs in groups.items()}
        self.kept_as = {g: orjson.dumps(f).decode() for g, f in self.fingerprints.items()}

    def __call__(self, key: tuple[str, int, int], frames: Iterable[Any],
                 state: Any) -> Iterator[Any]:
        group, shard, _ = key  # the slot: where Spark runs it (packed.Route)
        table = unpack_rows(frames)  # in the sequencer's order: seq order, ends in place
        if group == DEAD_GROUP:
            yield pack_results(_dead_rows(table))
            return
        os.environ["CEP_KERNEL_CACHE"] = self.kernel_cache
        self._share_programs()
        version, engines, encoder = self._engines(group, shard, state)
        kept_key = (self.job, self.kept_as[group], group, shard)
        _KEPT.pop(kept_key, None)  # mutated from here on
        queries = self.groups[group]
        index = {q.name: q.index for q in queries}
        kinds = table.column(KIND).to_numpy(zero_copy_only=False)
        events = table.drop_columns([KIND, DEAD_LETTER])
        start = 0
        for end in [*np.flatnonzero(kinds == END), len(kinds)]:
            for lo in range(start, end, SLICE_ROWS):
                part = events.slice(lo, min(SLICE_ROWS, end - lo))
                found = engines.process_columns(encoder.from_arrow(part))
                rejected = _rejected_rows(engines.take_dead_letters(), part)
                yield from _frames(result_batches(found, index, rejected))
            if end < len(kinds):  # an end of input
                found = engines.flush_columns()
                rejected = [(q, seq, reason, None) for q, seq, reason in
                            engines.take_dead_letters()]
                yield from _frames(result_batches(found, index, rejected))
                engines, encoder = new_engines(queries)
            start = end + 1
        version += 1
        state.update((version, engines.snapshot(), self.kept_as[group]))
        _KEPT[kept_key] = (version, engines, encoder)

    def _share_programs(self) -> None:
        if self._canonical:
            return
        for group, queries in self.groups.items():
            self.groups[group] = [_CANONICAL.setdefault(
                (self.fingerprints[group][q.name], q.name, q.index), q) for q in queries]
        self._canonical = True

    def _engines(self, group: str, shard: int, state: Any) -> tuple[int, Any, Any]:
        queries = self.groups[group]
        if not state.exists:
            return (0, *new_engines(queries))
        version, snapshot, fingerprints = state.get
        kept = _KEPT.get((self.job, self.kept_as[group], group, shard))
        if kept is not None and kept[0] == version:
            return kept
        before = orjson.loads(fingerprints)
        same = {name for name, f in self.fingerprints[group].items() if before.get(name) == f}
        if not same:
            return (version, *new_engines(queries))
        engines, encoder = new_engines([q for q in queries if q.name in same])
        groupings = set(engines.windows.groupings) if engines.windows is not None else set()
        engines.restore(kept_snapshot(bytes(snapshot), same, groupings))
        for q in queries:
            if q.name not in same:
                engines.add(q)  # new or changed: fresh state
        return version, engines, encoder


def _frames(batches: Iterable[pa.RecordBatch]) -> Iterator[Any]:
    for batch in batches:
        yield pack_results(batch)


def _dead_rows(table: pa.Table) -> pa.Table:
    n = table.num_rows
    letters = table.column(DEAD_LETTER).to_pylist()
    return pa.Table.from_arrays([
        pa.array([DEAD] * n, pa.string()), pa.nulls(n, pa.string()),
        pa.array(np.full(n, -1, np.int32)), pa.nulls(n, pa.string()),
        table.column("seq").cast(pa.int64()), pa.nulls(n, pa.int64()),
        pa.array([orjson.loads(d)["reason"] for d in letters], pa.string()),
        pa.array(letters, pa.string())], names=RESULT_NAMES)

