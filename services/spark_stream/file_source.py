"""A PySpark streaming data source over a directory where event files arrive:
`spark.readStream.format("cep_files")`, for users without Kafka.

Files are JSON lines (.jsonl, .ndjson, .json), CSV or Parquet, read with `cep run`'s
reader (`cep_core.event_reader.iter_tables`: the same positions, seqs, checks and dead
letters as `cep run` over the files concatenated in name order). Names must sort in the
order files arrive (a counter or a time in the name); write a file under a name starting
with `.` or `_` and rename it when complete (such names are not read). A file whose name
ends in `.end` is an end of input (the engines flush, as at the end of `cep run`).

Offsets: the last file taken. Each micro-batch is one step (`sequencer.py`): the new files
in name order, in one Spark input partition, from the carry of the step before.

Options: `path`, `schema` (the stream's schema as JSON), `checkpoint` (the job's),
`routes` (the state keys, `packed.routes_option`), `max_files` (files per micro-batch,
optional). Rows: the sequencer's, packed by state key (`packed.py`).
"""

from __future__ import annotations

# Deferred imports: none; pyspark is imported at the top (this module is loaded only where the
# `spark` extra is installed).

import io
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from cep_core.event_io import FORMATS
from cep_core.event_reader import iter_tables
from cep_service.spark_stream.packed import PACKED_DDL, pack_all, routes_of
from cep_service.spark_stream.sequencer import (
    Carry,
    CarryStore,
    Sequencer,
    stream_schema,
)

END_SUFFIX = ".end"


class FileStep(InputPartition):
    def __init__(self, start: dict, end: dict, names: list[str]):
        super().__init__(orjson.dumps([start, end]))
        self.start, self.end, self.names = start, end, names


# Deliberately like services/spark_stream/kafka_source.py's KafkaEventSource: a PySpark data
# source declares its name, schema and reader each in its own class.
class FileEventSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cep_files"

    def schema(self) -> str:
        return PACKED_DDL

    def streamReader(self, schema: Any) -> FileStepReader:  # noqa: N802 (PySpark's name)
        return FileStepReader(self.options)


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


class FileStepReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        self.fs, self.root = pafs.FileSystem.from_uri(options["path"])
        self.max_files = int(options.get("max_files") or 0)

    def _names(self, after: str) -> list[str]:
        """Complete files named after `after`, in name order."""
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        names = sorted(info.base_name for info in self.fs.get_file_info(selector)
                       if info.type == pafs.FileType.File)
        return [n for n in names if n > after and not n.startswith((".", "_"))
                and (_suffix(n) in FORMATS or n.endswith(END_SUFFIX))]

    def initialOffset(self) -> dict:  # noqa: N802
        offset = {"last": ""}
        CarryStore(self.options["checkpoint"]).put(offset, Carry())
        return offset

    def latestOffset(self, start: dict, limit: Any = None) -> dict:  # noqa: N802
        names = self._names(start["last"])
        if self.max_files:
            names = names[:self.max_files]
        return {"last": names[-1]} if names else start

    def partitions(self, start: dict, end: dict) -> list[FileStep]:
        names = [n for n in self._names(start["last"]) if n <= end["last"]]
        return [FileStep(start, end, names)]

    # Spark hands back each partition `partitions` made: a FileStep
    def read(self, partition: FileStep) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """The step's rows, packed by state key (`packed.py`)."""
        yield from pack_all(routes_of(self.options), self._rows(partition))

    def _rows(self, partition: FileStep) -> Iterator[pa.RecordBatch | None]:
        schema = stream_schema(self.options)
        store = CarryStore(self.options["checkpoint"])
        sequencer = Sequencer(schema, store.get(partition.start))
        for name in partition.names:
            if name.endswith(END_SUFFIX):
                yield sequencer.end(0, 1)
                continue
            path = f"{self.root}/{name}"
            with self.fs.open_input_file(path) as source:
                # in memory: cep run's JSON reader reads lines past a block's end
                # (readline), which pyarrow's files do not offer
                f = io.BytesIO(source.read())
                for table, dead in iter_tables(f, schema, FORMATS[_suffix(name)], path,
                                               first_position=sequencer.carry.position,
                                               prev_max=sequencer.carry.last_seq,
                                               guard=sequencer.guard):
                    yield sequencer.table(table, dead, table.num_rows + len(dead))
        store.put(partition.end, sequencer.carry)

    def commit(self, end: dict) -> None:
        pass
