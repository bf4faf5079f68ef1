"""Parquet inputs read by pyarrow inside the Python tasks, not by Spark's reader.

Spark's Parquet reader turns columns into rows and back into Arrow batches for the Python
decoder; here each task opens its files with `pyarrow.fs` and reads its split (a row group,
or a row range of one when row groups are larger than `spark.sql.files.maxPartitionBytes`)
straight into `event_columns.decode_table`, as `cep run` reads Parquet. Positions come from
the footers (row counts), so no counting pass is needed. When the footers' `seq` statistics
prove that every split's seqs exceed every earlier split's (or the file has no `seq`
column: seqs are positions), no row can be rejected for an earlier split's seq, so the
tasks decide every dead letter themselves and the job needs neither the driver-side seq
check nor a cache of the decoded events: the engines read the good rows (`GOOD`), the dead
letters are read again by a second pass that yields only the bad ones (`BAD`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs  # noqa: F401 (pa.fs)
import pyarrow.parquet as pq

from cep_core.event_io import EventFormat, seq_not_increasing
from cep_core.schema import StreamSchema
from cep_service.backfill.engines import map_in_arrow
from cep_service.backfill.ingest import InputFile, SplitDecoder, decoded_schema

ALL, GOOD, BAD = "all", "good", "bad"  # every decoded row, accepted events, dead letters


@dataclass(frozen=True)
class Split:
    file: int  # index into the inputs
    row_group: int
    offset: int  # first row within the row group
    rows: int
    position: int  # the input position (default seq) of its first row


@dataclass(frozen=True)
class ParquetInput:
    files: list[InputFile]
    uris: list[str]  # as pyarrow.fs opens them
    splits: list[Split]
    rows: int  # records in all inputs
    splits_ordered: bool  # every split's seqs exceed every earlier split's (footers)

    def frame(self, spark: Any, schema: StreamSchema, mode: str = ALL, bad_counts: Any = None,
              split_ids: list[int] | None = None) -> Any:
        """The decoded rows as a DataFrame, one task per split: ALL (the columns of
        `backfill_ingest.read_decoded`), GOOD (`seq` and the attributes of accepted
        events; needs `splits_ordered`) or BAD (dead letters, decoded columns).
        `bad_counts` (an accumulator with `SplitCounts`): GOOD tasks put the number of
        dead letters of their split there. `split_ids`: only these splits."""
        if mode != ALL and not self.splits_ordered:
            raise ValueError("splits whose seqs may overlap need the driver's seq check")
        out_schema = decoded_schema(schema)
        if mode == GOOD:
            out_schema = out_schema.split(", _file ")[0]
        ids = list(range(len(self.splits))) if split_ids is None else sorted(split_ids)
        if not ids:
            return spark.createDataFrame([], out_schema)
        tasks = spark.createDataFrame([(i,) for i in ids], "id long").repartition(
            len(ids), "id") if split_ids is not None else spark.range(
            0, len(ids), 1, numPartitions=len(ids))
        return map_in_arrow(tasks, SplitReader(self, schema, mode, bad_counts), out_schema)


class SplitCounts:
    """An AccumulatorParam of a dict ({split id: count}; the scan's counts and dead
    letters by position): a task run twice sets the same entries."""

    def zero(self, value: dict[Any, Any]) -> dict[Any, Any]:
        return {}

    def addInPlace(self, value1: dict[Any, Any],  # noqa: N802 (PySpark's name)
                   value2: dict[Any, Any]) -> dict[Any, Any]:
        value1.update(value2)
        return value1


def parquet_input(spark: Any, files: list[InputFile]) -> ParquetInput | None:
    """Splits of the inputs when every one is Parquet that pyarrow can open from here;
    else None (Spark's reader and the counting pass then do it). A split is at most
    `spark.sql.files.maxPartitionBytes` (compressed) and 1/defaultParallelism of the
    input, so every core gets a share."""
    if not files or any(f.fmt is not EventFormat.PARQUET for f in files):
        return None
    max_bytes = spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes()
    try:
        metas = [_metadata(_uri(f.path)) for f in files]
    except (OSError, ValueError, pa.ArrowException):
        return None
    total = sum(meta.num_rows for meta in metas)
    share = max(1, -(-total // spark.sparkContext.defaultParallelism))
    splits, position, ordered, last_max = [], 0, True, -1
    for i, (f, meta) in enumerate(zip(files, metas)):
        seq_column = _seq_column(meta)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.num_rows == 0:
                continue
            size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            step = max(1, min(share, int(max_bytes * group.num_rows // max(size, 1))))
            pieces = [(offset, min(step, group.num_rows - offset))
                      for offset in range(0, group.num_rows, step)]
            for low, high in _seq_ranges(f, meta, g, seq_column, pieces, position):
                ordered = ordered and low is not None and low > last_max
                last_max = high if high is not None else last_max
            for offset, rows in pieces:
                splits.append(Split(i, g, offset, rows, position))
                position += rows
    return ParquetInput(files, [_uri(f.path) for f in files], splits, position, ordered)


def _metadata(uri: str) -> pq.FileMetaData:
    fs, path = pa.fs.FileSystem.from_uri(uri)
    with fs.open_input_file(path) as handle:
        return pq.ParquetFile(handle).metadata


def _seq_ranges(f: InputFile, meta: pq.FileMetaData, group: int, seq_column: int | None,
                pieces: list[tuple[int, int]],
                position: int) -> list[tuple[int | None, int | None]]:
    """(min, max) seq of each piece of a row group; (None, None) where unknown. From the
    footer's statistics for a whole row group, else from its `seq` column, read alone."""
    if seq_column is None:  # seqs are positions
        return [(position + offset, position + offset + rows - 1) for offset, rows in pieces]
    if seq_column < 0:
        return [(None, None)]
    if len(pieces) == 1:
        return [_seq_range(meta.row_group(group).column(seq_column))]

    fs, path = pa.fs.FileSystem.from_uri(_uri(f.path))
    with fs.open_input_file(path) as handle:
        seq = pq.ParquetFile(handle).read_row_group(group, columns=["seq"]).column(0)
    if seq.null_count:
        return [(None, None)]
    values = seq.to_numpy()
    return [(int(values[o:o + n].min()), int(values[o:o + n].max())) for o, n in pieces]


def _uri(path: str) -> str:
    return path if "://" in path or path.startswith("file:") else os.path.abspath(path)


def _seq_column(meta: pq.FileMetaData) -> int | None:
    """The index of the `seq` column; -1 when it is not a signed integer (then its
    statistics prove nothing); None when there is none."""
    names = [meta.schema.column(c).path for c in range(meta.num_columns)]
    if "seq" not in names:
        return None
    arrow = meta.schema.to_arrow_schema()
    seq_type = arrow.field("seq").type if "seq" in arrow.names else None
    return names.index("seq") if seq_type and pa.types.is_signed_integer(seq_type) else -1


def _seq_range(column: Any) -> tuple[int | None, int | None]:
    """(min, max) of a row group's `seq` column without nulls, else (None, None)."""
    stats = None if column is None else column.statistics
    if stats is None or not stats.has_min_max or stats.null_count != 0:
        return None, None
    return int(stats.min), int(stats.max)


class SplitReader:
    """The task: reads the splits named by the ids it receives and decodes them with the
    Parquet `SplitDecoder` (64Ki rows at a time), keeping the rows of its mode."""

    def __init__(self, source: ParquetInput, schema: StreamSchema, mode: str,
                 bad_counts: Any = None):
        self.source, self.schema, self.mode = source, schema, mode
        self.bad_counts = bad_counts
        self.names = ["seq", *schema.attributes]

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for split_id in batch.column(0).to_pylist():
                split = self.source.splits[split_id]
                fs, path = pa.fs.FileSystem.from_uri(self.source.uris[split.file])
                with fs.open_input_file(path) as handle:
                    table = pq.ParquetFile(handle).read_row_group(split.row_group)
                table = table.slice(split.offset, split.rows)
                yield from self._decode(table, split, split_id)

    def _decode(self, table: pa.Table, split: Split, chunk: int) -> Iterator[pa.RecordBatch]:
        decoder = SplitDecoder(self.schema, self.source.files[split.file], None, {},
                               file_index=split.file)
        prev_max, position, bad = -1, split.position, 0
        for start in range(0, table.num_rows, 65_536):
            piece = table.slice(start, 65_536)
            out, _, prev_max = decoder._decode(piece, position + start, chunk, None,
                                               prev_max, False)
            if out is None:
                continue
            if self.mode == ALL:
                yield out
                continue
            seq, last = out.column("seq"), out.column("_prev_max")
            good = pc.and_(pc.is_null(out.column("_error")), pc.greater(seq, last))
            if self.mode == GOOD:
                kept = out.filter(good)
                bad += out.num_rows - kept.num_rows
                yield kept.select(self.names)
            else:
                yield _with_seq_errors(out, seq, last).filter(pc.invert(good))
        if self.bad_counts is not None:
            self.bad_counts.add({chunk: bad})


def _with_seq_errors(out: pa.RecordBatch, seq: Any, last: Any) -> pa.RecordBatch:
    """`out` with the "seq does not increase" reason on good rows whose seq is not above
    the running maximum of their split."""
    errors = out.column("_error").to_pylist()
    rejected = np.flatnonzero(to_bool(pc.and_(pc.is_null(out.column("_error")),
                                              pc.less_equal(seq, last))))
    if len(rejected) == 0:
        return out
    seqs, lasts = seq.to_pylist(), last.to_pylist()
    for r in rejected.tolist():
        errors[r] = seq_not_increasing(seqs[r], lasts[r])
    index = out.schema.get_field_index("_error")
    return out.set_column(index, "_error", pa.array(errors, pa.string()))


def to_bool(array: Any) -> npt.NDArray[np.bool_]:
    return array.to_numpy(zero_copy_only=False).astype(bool)
