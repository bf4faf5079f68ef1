"""Keyed query groups without Spark's shuffle: every engine task scans the whole Parquet
input itself and keeps the events whose keys hash to its partition.

Spark's way (`repartition` by the keys, `sortWithinPartitions("seq")`, `mapInArrow`) moves
every event from a Python decode task into the JVM, through the shuffle and its sort, and
back into a Python engine task as Arrow. Measured on 10M finance events in `local[2]`, that
costs ~3.3 us of core time per event beside the engines; reading and decoding a Parquet
split with pyarrow in the task costs ~0.2 us per event. Here the events never leave Python:
task p of P reads every split in order with the GOOD pass's `SplitReader` and feeds its
engines the rows whose keys hash to p (`key_partitions`). The input is read P times, so
this pays while P * 0.2 < 3.3: `auto` scans up to `SCAN_MAX_PARTITIONS` partitions.

It needs what the GOOD pass needs: Parquet inputs that pyarrow opens, whose footers prove
that every split's seqs are above every earlier split's. Then the rows of a scan arrive in
seq order and every dead letter is decided within its split, as in the shuffled job.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from services.backfill.engines import map_in_arrow
from services.backfill.parquet import GOOD, ParquetInput, SplitReader

AUTO, SHUFFLE, SCAN = "auto", "shuffle", "scan"
SCAN_MAX_PARTITIONS = 16
_MIX = np.uint64(0x9E3779B97F4A7C15)  # mixes the hashes of several key columns


def use_scan(exchange: str, direct: ParquetInput | None, partitions: int) -> bool:
    """Whether keyed groups scan (see the module docstring); `exchange` is AUTO, SHUFFLE
    or SCAN. SCAN on an input that cannot be scanned is a ValueError saying why."""
    if exchange not in (AUTO, SHUFFLE, SCAN):
        raise ValueError(f"exchange must be {AUTO}, {SHUFFLE} or {SCAN}, not {exchange!r}")
    eligible = direct is not None and direct.splits_ordered
    if exchange == SCAN and not eligible:
        raise ValueError("--exchange scan needs Parquet inputs that pyarrow opens and whose "
                         "footers prove the seqs ordered across row groups; use auto or "
                         "shuffle")
    return exchange == SCAN or (exchange == AUTO and eligible
                                and partitions <= SCAN_MAX_PARTITIONS)


def scan_frame(spark, source: ParquetInput, schema, keys: tuple[str, ...], partitions: int,
               runner, result_schema: str, bad_counts=None):
    """The engine tasks of one query group as a DataFrame of `runner`'s results: one task
    per partition (one in all when `keys` is empty), each scanning the whole input."""
    partitions = partitions if keys else 1
    tasks = spark.range(0, partitions, 1, numPartitions=partitions)
    return map_in_arrow(tasks, KeyScan(source, schema, keys, partitions, runner, bad_counts),
                        result_schema)


class KeyScan:
    """The task: for each partition id it receives, `runner` over the rows of the whole
    input whose keys fall in that partition, in seq order."""

    def __init__(self, source: ParquetInput, schema, keys: tuple[str, ...], partitions: int,
                 runner, bad_counts=None):
        self.source, self.schema, self.keys = source, schema, keys
        self.partitions, self.runner, self.bad_counts = partitions, runner, bad_counts

    def __call__(self, batches):
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                yield from self.runner(self._events(partition))

    def _events(self, partition: int):
        # Every task reads every split, so each counts every split's dead letters: the
        # counts are keyed by split, and each task sets the same entries.
        reader = SplitReader(self.source, self.schema, GOOD, self.bad_counts)
        ids = pa.record_batch([pa.array(range(len(self.source.splits)), pa.int64())],
                              names=["id"])
        for batch in reader([ids]):
            if self.keys and batch.num_rows:
                mine = key_partitions(batch, self.keys, self.partitions) == partition
                batch = batch.filter(pa.array(mine))
            yield batch


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


def _value_hash(value) -> int:
    if isinstance(value, float) and value == 0:
        value = 0.0  # -0.0 equals 0.0: one key
    return zlib.crc32(repr(value).encode()) + 1  # + 1: apart from null's 0
