"""Keyed query groups without Spark's shuffle: every engine task reads the whole input
itself, with `cep run`'s own reader, and keeps the events whose keys hash to its partition.

Spark's way (decode tasks, then `repartition` by the keys, `sortWithinPartitions("seq")`,
`mapInArrow`) moves every event from a Python decode task into the JVM, through the shuffle
and its sort, and back into a Python engine task as Arrow; JSON lines and CSV also take a
counting pass and a cache. Measured on 10M finance events in `local[2]`, the shuffle costs
~3.3 us of core time per event beside the engines; reading and decoding Parquet with
pyarrow in the task costs ~0.2 us per event (JSON lines ~1 us). Here the events never leave
Python: task p of P reads the inputs in order, as one stream, with
`event_reader.iter_tables` (a block at a time: the positions, seqs, seq checks, bound on
events too far ahead and dead letters of `cep run`, one bound and time over all the inputs),
and feeds its engines the rows whose keys hash to p
(`key_partitions`). The input is read P times, so this pays while P stays small: `auto`
scans up to `SCAN_MAX_PARTITIONS` partitions. The first task of the first group also
reports the input's dead letters and counts (accumulators keyed by position, so a task run
again sets the same entries).

It needs inputs that pyarrow opens from the driver (local paths, `file:`, filesystems
`pyarrow.fs` knows), which the tasks open the same way.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs  # noqa: F401 (pa.fs)

from cep_core.event_io import EventFormat
from cep_core.event_reader import iter_tables
from cep_core.time_guard import TimeGuard, wall_clock_units
from cep_service.backfill.engines import map_in_arrow
from cep_service.backfill.ingest import InputFile
from cep_service.backfill.parquet import _uri

AUTO, SHUFFLE, SCAN = "auto", "shuffle", "scan"
SCAN_MAX_PARTITIONS = 16
_MIX = np.uint64(0x9E3779B97F4A7C15)  # mixes the hashes of several key columns
GOOD_ROWS, BAD_ROWS = "good", "bad"  # the entries of the counts accumulator


@dataclass(frozen=True)
class ScanInput:
    files: list[InputFile]
    uris: list[str]  # as pyarrow.fs opens them


def scan_input(files: list[InputFile]) -> ScanInput | None:
    """The inputs when pyarrow opens every one of them from here; else None."""
    uris = [_uri(f.path) for f in files]
    try:
        for uri in uris:
            fs, path = pa.fs.FileSystem.from_uri(uri)
            if fs.get_file_info(path).type != pa.fs.FileType.File:
                return None
    except (OSError, ValueError, pa.ArrowException):
        return None
    return ScanInput(files, uris) if files else None


def use_scan(exchange: str, source: ScanInput | None, partitions: int) -> bool:
    """Whether keyed groups scan (see the module docstring); `exchange` is AUTO, SHUFFLE
    or SCAN. SCAN on inputs that cannot be scanned is a ValueError saying why."""
    if exchange not in (AUTO, SHUFFLE, SCAN):
        raise ValueError(f"exchange must be {AUTO}, {SHUFFLE} or {SCAN}, not {exchange!r}")
    if exchange == SCAN and source is None:
        raise ValueError("--exchange scan needs inputs that pyarrow can open from here "
                         "(local paths, file: or a filesystem pyarrow.fs knows); use auto "
                         "or shuffle")
    return exchange == SCAN or (exchange == AUTO and source is not None
                                and partitions <= SCAN_MAX_PARTITIONS)


def scan_frame(spark: Any, source: ScanInput, schema: Any, keys: tuple[str, ...],
               partitions: int, runner: Callable[..., Any], result_schema: str,
               report: Any = None) -> Any:
    """The engine tasks of one query group as a DataFrame of `runner`'s results: one task
    per partition (one in all when `keys` is empty), each reading the whole input.
    `report`: (counts, dead letters) accumulators that the group's first task fills."""
    partitions = partitions if keys else 1
    tasks = spark.range(0, partitions, 1, numPartitions=partitions)
    return map_in_arrow(tasks, KeyScan(source, schema, keys, partitions, runner, report),
                        result_schema)


class KeyScan:
    """The task: for each partition id it receives, `runner` over the events of the whole
    input whose keys fall in that partition, in seq order."""

    def __init__(self, source: ScanInput, schema: Any, keys: tuple[str, ...],
                 partitions: int, runner: Callable[..., Any], report: Any = None):
        self.source, self.schema, self.keys = source, schema, keys
        self.partitions, self.runner, self.report = partitions, runner, report
        # a wall-clock bound: the clock read once, here on the driver, for every task
        self.now = None if schema.ahead_of_clock_bound is None else \
            wall_clock_units(schema.time_unit)

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[Any]:
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                yield from self.runner(self._events(partition))

    def _events(self, partition: int) -> Iterator[pa.RecordBatch]:
        reporting = self.report is not None and partition == 0
        good = bad = position = 0
        prev_max, dead_rows = -1, {}
        guard = TimeGuard.of(self.schema, now=self.now)  # the inputs: one stream, one time
        for f, uri in zip(self.source.files, self.source.uris):
            fs, path = pa.fs.FileSystem.from_uri(uri)
            with fs.open_input_file(path) as opened:
                handle = (opened if f.fmt is EventFormat.PARQUET
                          else io.BufferedReader(opened, 1 << 20))
                for table, dead in iter_tables(handle, self.schema, f.fmt, f.source,
                                               first_position=position, prev_max=prev_max,
                                               guard=guard):
                    position += table.num_rows + len(dead)
                    if reporting:
                        good, bad = good + table.num_rows, bad + len(dead)
                        for letter in dead:
                            row = letter.to_json()
                            dead_rows[letter.position] = (
                                0, None, row["source"], row.get("line"), row["position"],
                                row["reason"], row["raw"])
                    if not table.num_rows:
                        continue
                    # seqs only rise (a refused event's seq does not count)
                    prev_max = int(table.column("seq")[-1].as_py())
                    for batch in table.combine_chunks().to_batches():
                        if self.keys:
                            mine = key_partitions(batch, self.keys, self.partitions) == partition
                            batch = batch.filter(pa.array(mine))
                        yield batch
        if reporting:
            counts, dead_letters = self.report
            counts.add({GOOD_ROWS: good, BAD_ROWS: bad})
            dead_letters.add(dead_rows)


def key_partitions(batch: pa.RecordBatch, keys: tuple[str, ...], partitions: int) -> np.ndarray:
    """The partition (0..partitions-1) of each row, from a hash of its `keys` values that
    every process computes alike (CRC-32 of each distinct value's repr, not Python's
    salted `hash`). Equal keys get equal partitions; nulls are one value."""
    mixed = np.zeros(batch.num_rows, np.uint64)
    for name in keys:
        encoded = batch.column(name).dictionary_encode()
        hashes = np.array([_value_hash(v) for v in encoded.dictionary.to_pylist()] + [0],
                          np.uint64)
        indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy()
        mixed = mixed * _MIX + hashes[indices]
    return (mixed % np.uint64(partitions)).astype(np.int64)


def _value_hash(value: Any) -> int:
    if isinstance(value, float) and value == 0:
        value = 0.0  # -0.0 equals 0.0: one key
    return zlib.crc32(repr(value).encode()) + 1  # + 1: apart from null's 0
