"""Backfill input: history files -> one DataFrame of decoded events and dead letters.

Seqs, event times and dead-letter reasons are exactly those of `cep run` on the same file
(`cep_core.event_io`): a record's default seq is its 0-based position in the input (bad
records count, blank lines do not), seqs must strictly increase; a dead letter of a JSON
lines or CSV file names its line in that file (1-based, blank lines and the CSV header
counted). Several inputs are read
as if concatenated in the order given (a directory: its files in name order).

Positions without a single pass through one process: a cheap JVM job counts the records
(and the lines) of every file split (Spark partition); the decode tasks (Arrow, in the
Python workers) start from the sum of the counts before their split. The "seq must
increase" check needs the largest good seq before a row: each task keeps a running maximum
within its split (`_prev_max`), and the maxima of earlier splits are combined on the
driver.
"""

from __future__ import annotations

# Deferred imports: pyspark (the `spark` extra, may be missing) loads when a Spark frame is built;
# the decoding core is used and tested without it.

import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import reduce
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.arrow_numpy import from_numpy, to_numpy
from cep_core.errors import EventError
from cep_core.event_columns import decode_table, events_to_columns
from cep_core.event_io import FORMATS, EventFormat, InputError, _csv_records, decode_record
from cep_core.event_reader import _jsonl_block, _JsonParser, _Rows
from cep_core.arrow_numpy import ARROW_TYPES, arrow_schema
from cep_core.schema import StreamSchema
from cep_service.backfill.engines import map_in_arrow

SPARK_TYPES = {"int": "long", "timestamp": "long", "float": "double", "bool": "boolean",
               "string": "string"}
# Columns of the decoded DataFrame besides `seq` and the stream's attributes. `_file`: the
# input's place in the list of inputs (its source is named where dead letters are written).
BOOKKEEPING = "_file int, _position long, _line long, _chunk int, _prev_max long, " \
              "_error string, _raw string"
BLOCK = "_block"  # the split's byte offset in its file (_metadata.file_block_start)
_BLANK_JSON = "\\S"  # Java's \s is Python's bytes.strip() set: a line without \S is skipped


@dataclass(frozen=True)
class InputFile:
    path: str  # as Spark reads it
    source: str  # as dead letters name it (the path as given, like `cep run`)
    fmt: EventFormat


def list_inputs(spark: Any, paths: list[str]) -> list[InputFile]:
    """The files to read, in order: each path, or a directory's data files by name."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    files: list[InputFile] = []
    for given in paths:
        hpath = jvm.org.apache.hadoop.fs.Path(given)
        fs = hpath.getFileSystem(conf)
        if not fs.exists(hpath):
            raise InputError(f"{given}: no such file or directory")
        if not fs.getFileStatus(hpath).isDirectory():
            files.append(InputFile(given, given, _format_of(given)))
            continue
        names = sorted(s.getPath().getName() for s in fs.listStatus(hpath) if s.isFile())
        inside = [n for n in names if not n.startswith(("_", ".")) and _suffix(n) in FORMATS]
        if not inside:
            raise InputError(f"{given}: no .jsonl, .csv or .parquet files in this directory")
        for name in inside:
            path = f"{given.rstrip('/')}/{name}"
            files.append(InputFile(path, path, _format_of(path)))
    return files


def _suffix(name: str) -> str:
    return PurePosixPath(name).suffix.lower()


def _format_of(path: str) -> EventFormat:
    fmt = FORMATS.get(_suffix(path))
    if fmt is None:
        raise InputError(f"{path}: unknown event file format '{_suffix(path)}' "
                         f"(use {', '.join(FORMATS)})")
    return fmt


def decoded_schema(schema: StreamSchema) -> str:
    attrs = ", ".join(f"`{name}` {SPARK_TYPES[kind]}" for name, kind in
                      schema.attributes.items())
    return f"seq long, {attrs}, {BOOKKEEPING}"


# ------------------------------------------------------------------ the driver side


def read_decoded(spark: Any, files: list[InputFile], schema: StreamSchema) -> Any:
    """One DataFrame over every record of the inputs: `seq`, the attributes (null on bad
    rows) and the bookkeeping columns; `_error` is None on good rows.

    A split is named by its file and `_metadata.file_block_start` (its byte offset), so
    positions do not depend on how Spark numbers or packs partitions."""
    from pyspark.sql import functions as F

    raw_frames = [_raw_frame(spark, f) for f in files]
    counted = [df.groupBy(BLOCK).agg(F.count(F.when(_is_record(df, f), 1)).alias("count"),
                                     F.count(F.lit(1)).alias("lines"))
               .withColumn("file", F.lit(i)) for i, (f, df) in enumerate(zip(files, raw_frames))]
    counts: dict[int, dict[int, int]] = {i: {} for i in range(len(files))}
    lines: dict[int, dict[int, int]] = {i: {} for i in range(len(files))}
    for row in reduce(lambda a, b: a.unionByName(b), counted).collect():
        counts[row["file"]][row[BLOCK]] = row["count"]
        lines[row["file"]][row[BLOCK]] = row["lines"]
    frames = []
    position = chunk = 0
    for i, (f, df) in enumerate(zip(files, raw_frames)):
        header = None
        if f.fmt is EventFormat.CSV:
            first = df.where(F.col(BLOCK) == 0).head()
            header = first[0] if first is not None else None
            if counts[i]:
                counts[i][min(counts[i])] -= 1  # the header is no record
        splits = {}
        line = 1  # lines count per file, from 1
        for block in sorted(counts[i]):
            splits[block] = (position, chunk, line if f.fmt is not EventFormat.PARQUET else None)
            position += counts[i][block]
            line += lines[i][block]
            chunk += 1
        decoder = SplitDecoder(schema, f, header, splits, file_index=i)
        frames.append(map_in_arrow(df, decoder, decoded_schema(schema)))
    if not frames:
        raise InputError("no input files")
    return reduce(lambda a, b: a.unionByName(b), frames)


def _raw_frame(spark: Any, f: InputFile) -> Any:
    from pyspark.sql import functions as F

    if f.fmt is EventFormat.PARQUET:
        df = spark.read.parquet(f.path)
        return df.select("*", F.col("_metadata.file_block_start").alias(BLOCK))
    df = spark.read.text(f.path).select("value", F.col("_metadata.file_block_start")
                                        .alias(BLOCK))
    if f.fmt is EventFormat.JSONL:
        first = df.where(df.value.rlike(_BLANK_JSON)).head()
        if first is not None and first[0].lstrip().startswith("["):
            raise InputError(f"{f.source}: a JSON array file; backfill reads JSON lines "
                             "(one object per line)")
    return df


def _is_record(df: Any, f: InputFile) -> Any:
    """Whether a row of a raw frame is a record (the CSV header still included), not a
    blank line."""
    from pyspark.sql import functions as F

    if f.fmt is EventFormat.JSONL:
        return df.value.rlike(_BLANK_JSON)
    if f.fmt is EventFormat.CSV:
        return (df.value != "") & (df.value != '""')
    return F.lit(True)


def accept(decoded: Any) -> Any:
    """`decoded` with `_error` filled in for rows whose seq does not increase, like
    `cep run`: a good row's seq must exceed every earlier good row's. Their `raw` is the
    record as read, except for a Parquet row rejected only because of an earlier split's
    seqs: Spark's JSON of its decoded fields."""
    from pyspark.sql import functions as F

    maxima = {row["_chunk"]: row["m"] for row in decoded.where(F.col("_error").isNull())
              .groupBy("_chunk").agg(F.max("seq").alias("m")).collect()}
    prefix, running = [], -1
    for c in range(max(maxima, default=-1) + 1):
        prefix.append(running)
        running = max(running, maxima.get(c, -1))
    before = F.array(*[F.lit(v).cast("long") for v in prefix or [-1]])
    last = F.greatest(F.col("_prev_max"),
                      F.coalesce(F.try_element_at(before, F.col("_chunk") + 1),
                                 F.lit(-1).cast("long")))
    error = F.when(F.col("_error").isNull() & (F.col("seq") <= last),
                   F.concat(F.lit("seq "), F.col("seq").cast("string"),
                            F.lit(" does not increase (previous seq "), last.cast("string"),
                            F.lit(")"))).otherwise(F.col("_error"))
    rejected = F.col("_error").isNull() & (F.col("seq") <= last)
    raw = F.when(rejected, F.to_json(F.struct(*[F.col(c) for c in _record_columns(decoded)])))
    return decoded.withColumn("_raw", F.coalesce(F.col("_raw"), raw)) \
        .withColumn("_error", error)


def _record_columns(decoded: Any) -> list[str]:
    return [c for c in decoded.columns if not c.startswith("_")]


# ------------------------------------------------------------------ the worker side


class SplitDecoder:
    """The decode task of one input file (called by mapInArrow once per partition, which
    holds one or more splits of the file). `splits`: block start -> (position of the
    split's first record, chunk: the split's place among all splits of the input, the
    split's first line in its file: None for Parquet)."""

    def __init__(self, schema: StreamSchema, f: InputFile, header: str | None,
                 splits: dict[int, tuple[int, int, int | None]], file_index: int = 0):
        self.schema = schema
        self.file = f
        self.file_index = file_index
        self.header = header
        self.splits = splits
        self.first_block = min(splits, default=0)
        self._json_parser: _JsonParser | None = None

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        block, position, chunk, line, prev_max, skip_header = None, 0, 0, None, -1, False
        for batch in batches:
            blocks = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
            edges = [0, *(np.flatnonzero(np.diff(blocks)) + 1).tolist(), len(blocks)]
            for start, stop in zip(edges, edges[1:]):
                if blocks[start] != block:  # a new split: its own positions and seq check
                    block = int(blocks[start])
                    position, chunk, line = self.splits.get(block, (0, 0, None))
                    prev_max = -1
                    skip_header = self.file.fmt is EventFormat.CSV and block == self.first_block
                table = pa.Table.from_batches([batch.slice(start, stop - start)]).drop_columns(
                    [BLOCK])
                out, skip_header, prev_max = self._decode(table, position, chunk, line,
                                                          prev_max, skip_header)
                if line is not None:
                    line += stop - start  # every text row is a line, blank or not
                if out is not None:
                    position += out.num_rows
                    yield out

    def _decode(self, table: pa.Table, position: int, chunk: int, line: int | None,
                prev_max: int, skip_header: bool) -> tuple[pa.RecordBatch | None, bool, int]:
        if self.file.fmt is EventFormat.PARQUET:
            positions = np.arange(position, position + table.num_rows, dtype=np.int64)
            decoded = decode_table(table, self.schema, positions)
            seq, columns, errors, raw = decoded.seq, decoded.attributes, decoded.errors, \
                decoded.raw
            numbers = None  # no lines in Parquet
        elif self.file.fmt is EventFormat.JSONL:
            assert line is not None  # (every split of a text file counts its lines)
            seq, columns, errors, raw, numbers = self._decode_json_block(table.column(0),
                                                                         position, line)
        else:
            assert line is not None
            lines = table.column(0).to_pylist()
            if skip_header and lines:
                lines, skip_header, line = lines[1:], False, line + 1
            seq, columns, errors, raw, numbers = self._decode_lines(lines, position, line)
        n = len(seq)
        if n == 0:
            return None, skip_header, prev_max
        parquet = self.file.fmt is EventFormat.PARQUET
        good = ~decoded.bad if parquet else np.array([e is None for e in errors], dtype=bool)
        running = np.maximum.accumulate(np.concatenate([[prev_max], np.where(good, seq, -1)]))
        if parquet:
            # Raw records of Parquet rows are made for bad rows and rows whose seq does not
            # increase within the split; text rows keep their line (see `accept`).
            keep = ~good | (seq <= running[:-1])
            missing = [r for r in np.flatnonzero(keep).tolist() if raw[r] is None]
            if missing:
                for r, record in zip(missing, table.take(pa.array(missing)).to_pylist()):
                    raw[r] = orjson.dumps(record, default=str).decode()
            if not keep.any():  # every row good and in order: no per-row lists to convert
                errors = raw = pa.nulls(n, pa.string())
        out = pa.RecordBatch.from_arrays(
            [pa.array(seq, pa.int64()), *columns.values(),
             pa.array(np.full(n, self.file_index, dtype=np.int32)),
             pa.array(np.arange(position, position + n, dtype=np.int64)),
             pa.nulls(n, pa.int64()) if numbers is None else pa.array(numbers, pa.int64()),
             pa.array(np.full(n, chunk, dtype=np.int32)),
             pa.array(running[:-1], pa.int64()),
             errors if isinstance(errors, pa.Array) else pa.array(errors, pa.string()),
             raw.cast(pa.string()) if isinstance(raw, pa.Array) else pa.array(raw, pa.string())],
            names=["seq", *columns, "_file", "_position", "_line", "_chunk", "_prev_max",
                   "_error", "_raw"])
        return out, skip_header, int(running[-1])

    def _decode_json_block(self, lines: pa.ChunkedArray, position: int,
                           line: int) -> tuple[Any, ...]:
        """JSON lines through `event_reader`'s block decoder (pyarrow's parser, records it
        cannot vouch for by `event_io`'s reader): the same records, seqs and reasons as
        `cep run`; `line`: the file's line number of lines[0]. Every record keeps its
        stripped line as `raw` (an earlier split's seqs may still reject it)."""
        if self._json_parser is None:
            self._json_parser = _JsonParser(self.schema)
        stripped = pc.ascii_trim_whitespace(lines)  # bytes.strip()'s set: ASCII spaces
        records = to_numpy(pc.not_equal(pc.binary_length(stripped), 0))
        raw = stripped.filter(from_numpy(records))
        n = len(raw)
        block = "\n".join(lines.to_pylist()).encode("utf-8")
        rows = _Rows(self.schema, self.file.source)
        if _jsonl_block(block, line, position, rows, self._json_parser) != n:
            raise RuntimeError("the block decoder and the split disagree on its records")
        source_row = np.full(n, -1, dtype=np.int64)  # record -> row of the good table
        good = pa.concat_tables([p.table for p in rows.pieces]) if rows.pieces else None
        if good is not None:
            positions = np.concatenate([p.positions for p in rows.pieces]) - position
            source_row[positions] = np.arange(len(positions))
        bad = source_row < 0
        errors: list = [None] * n
        for letter in rows.dead:
            errors[letter.position - position] = letter.reason
        if good is None:
            good = pa.Table.from_batches([], arrow_schema(self.schema))
            source_row[:] = 0
        taken = good.take(pa.array(source_row, mask=bad)) if good.num_rows else None
        seq = np.arange(position, position + n, dtype=np.int64)
        if taken is not None:
            seq = np.where(bad, seq, to_numpy(taken.column("seq")))
        columns = {name: (taken.column(name).combine_chunks() if taken is not None
                          else pa.nulls(n, ARROW_TYPES[kind]))
                   for name, kind in self.schema.attributes.items()}
        numbers = np.flatnonzero(records) + line
        return seq, columns, errors, raw.combine_chunks(), numbers

    def _decode_lines(self, lines: list[str], position: int, line: int) -> tuple[Any, ...]:
        """JSON lines or CSV rows through `cep_core.event_io`'s own decoding; `line`: the
        file's line number of lines[0]."""
        text = self.file.fmt is EventFormat.CSV
        records = _csv_lines(self.header, lines, line) if text else _json_lines(lines, line)
        seqs, events, errors, raws, numbers = [], [], [], [], []
        for offset, (raw, record, error, number) in enumerate(records):
            event = None
            if error is None:
                try:
                    event = decode_record(record, self.schema, position + offset, text=text)
                except EventError as e:
                    error = str(e)
            seqs.append(event.seq if event is not None else position + offset)
            events.append(event)
            errors.append(error)
            raws.append(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
            numbers.append(number)
        return (np.array(seqs, dtype=np.int64), events_to_columns(events, self.schema),
                errors, raws, numbers)


def _json_lines(lines: list[str], first: int) -> Iterator[tuple[bytes, Any, str | None, int]]:
    """(raw, record, error, line) per non-blank line, as `event_io` reads a JSON lines
    file; `first`: the line number of lines[0]."""
    for i, line in enumerate(lines):
        data = line.encode("utf-8").strip()
        if not data:
            continue
        try:
            yield data, orjson.loads(data), None, first + i
        except orjson.JSONDecodeError as e:
            yield data, None, f"not valid JSON: {e}", first + i


def _csv_lines(header: str | None, lines: list[str],
               first: int) -> Iterator[tuple[Any, Any, str | None, int]]:
    """(raw, record, error, line) per CSV row, as `event_io` reads a CSV file; `first`: the
    line number of lines[0] (the header goes before them, as line 1 of the text read)."""
    if header is None:
        return
    text = io.StringIO("\n".join([header, *lines]) + "\n", newline="")
    for raw, record, error, line in _csv_records(text):
        # (a CSV record always has its line)
        yield raw, record, error, first + line - 2  # type: ignore[operator]
