"""Queries that change while the Spark job runs: from the query file (read again when its
text changes) and from the control topic the Kafka service reads (`cep query add`, the
HTTP API), applied as the service's splitter applies them (cep_core/control_message.py).

The design: **a restart between micro-batches, the unchanged queries' state carried
over.** Spark fixes a streaming query's plan, and with it the function of
`applyInPandasWithState` and its state keys, when the query starts. So `LiveJob`, on the
driver, looks for changes between micro-batches (`QueryWatch.poll`); when the live set
changed, it waits until no micro-batch is running, stops the streaming query and starts
it again on the same checkpoint with the new queries (same SparkSession, same Python
workers: no JVM start). Each shard's state holds its queries' fingerprints
(keyed_state.py), so an unchanged query gets its state back, an added or changed one
starts fresh, a removed one's state is dropped. The change holds from the first
micro-batch after the restart: from the seq after the last one the job had taken
(`at`), which is where the service's splitter applies a change, "at the seq it has
reached" (docs/live.md): an added query's output is `cep run`'s over the events from
`at` on. Each restart is logged in `CHECKPOINT/changes.jsonl` (batch, at, added,
removed, changed).

Where the queries come from: the query file's queries (in file order), then the control
topic's live queries of the job's stream (in the order they were added); a control-topic
query of a file query's name replaces it. At start, the control topic is read as a
starting splitter reads it (`replayed`: what compaction leaves); while running, each new
record is applied as a running splitter applies it (`LiveSet.apply`: refusals are logged
and change nothing). A query file whose new text does not check is refused the same way.
"""

from __future__ import annotations

# Deferred imports: the control topic's consumer (confluent_kafka) loads only with --control.

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from cep_core.checked import CheckedQuery
from cep_core.checker import load_query_text
from cep_core.control_message import (
    ControlMessageError,
    ControlRecord,
    LiveSet,
    OtherStream,
    replayed,
    validate,
)
from cep_core.errors import QueryError, QueryErrors
from cep_core.schema import SchemaError, SchemaRegistry
from cep_service.spark_stream.sequencer import CarryStore
from cep_service.stream.control import split_query_file

if TYPE_CHECKING:
    from cep_service.stream.kafka import KafkaSettings


class NoQueries(ValueError):
    """Nothing to run: no query file and no live query of the stream on the control topic."""


@dataclass(frozen=True)
class QuerySet:
    queries: list[CheckedQuery]  # with their output order (`index`)
    texts: dict[str, str]  # each query's text, by name (fingerprints)

    def fingerprints(self) -> dict[str, str]:
        from cep_service.spark_stream.keyed_state import fingerprint

        return {name: fingerprint(text) for name, text in self.texts.items()}


class QueryWatch:
    """The job's live queries: a query file and/or a control topic (`control`: a
    (KafkaSettings, topic) pair). `poll()` takes what changed since; `current()` is the
    set to run."""

    def __init__(self, registry: SchemaRegistry | None = None, query_file: Path | None = None,
                 control: tuple | None = None, stream: str | None = None,
                 log: Callable[[str], None] = lambda line: None):
        self.registry = registry or SchemaRegistry()
        self.query_file = query_file
        self.log = log
        self.file_text: str | None = None
        self.file_queries: list[CheckedQuery] = []
        if query_file is not None:
            self.file_text = query_file.read_text()
            self.file_queries = load_query_text(self.file_text, self.registry, str(query_file))
        streams = {q.schema.stream for q in self.file_queries} | ({stream} if stream else set())
        if len(streams) > 1:
            raise ValueError(f"the queries read several streams ({', '.join(sorted(streams))}); "
                             "a streaming job takes one stream")
        if not streams:
            raise NoQueries("no stream: give a query file or --stream")
        self.stream = streams.pop()
        self.consumer: Any = None
        self.live: LiveSet | None = None
        if control is not None:
            self._open(*control)

    def _open(self, settings: KafkaSettings, topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from cep_service.stream.control import control_log

        records = control_log(settings, topic)
        self.live = replayed(records, self.stream, self.registry)
        self.consumer = settings.consumer()
        self.tp = TopicPartition(topic, 0)
        last = max((r.offset for r in records if r.offset is not None), default=-1)
        self.consumer.assign([TopicPartition(topic, 0, last + 1 if records
                                             else OFFSET_BEGINNING)])

    def current(self) -> QuerySet:
        live = self.live.live.values() if self.live is not None else []
        topic = {q.name: q for q in live}
        out: list[CheckedQuery] = []
        texts: dict[str, str] = {}
        file_texts = dict(split_query_file(self.file_text, str(self.query_file))) \
            if self.file_text is not None else {}
        for q in self.file_queries:
            if q.name not in topic:
                out.append(replace(q, index=len(out)))
                texts[q.name] = file_texts[q.name]
        base = len(self.file_queries)
        for entry in sorted(live, key=lambda e: e.index):
            out.append(replace(entry.checked, index=base + entry.index))
            texts[entry.name] = entry.text
        if not out:
            raise NoQueries(f"no live query of stream {self.stream!r}")
        return QuerySet(out, texts)

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Take the changes made since the last poll; whether the live set changed."""
        changed = self._poll_file()
        if self.consumer is not None:
            changed = self._poll_control(timeout_s) or changed
        return changed

    def _poll_file(self) -> bool:
        if self.query_file is None:
            return False
        # Deliberately like LiveJob.check's read of the queries: each logs its own failure
        # and keeps what runs.
        try:
            text = self.query_file.read_text()
        except OSError as e:
            self.log(f"query file {self.query_file}: {e}; the queries stay as they are")
            return False
        if text == self.file_text:
            return False
        try:
            queries = load_query_text(text, self.registry, str(self.query_file))
            other = {q.schema.stream for q in queries} - {self.stream}
            if other:
                raise ValueError(f"its queries read {', '.join(sorted(other))}, the job reads "
                                 f"{self.stream}")
        except (QueryError, QueryErrors, SchemaError, ValueError) as e:
            errors = getattr(e, "errors", None)
            reason = "\n".join(str(x) for x in errors) if errors else str(e)
            self.log(f"query file {self.query_file} changed but is refused:\n{reason}")
            self.file_text = text  # refused once, not at every poll
            return False
        self.file_text, self.file_queries = text, queries
        return True

    def _poll_control(self, timeout_s: float) -> bool:
        changed = False
        assert self.live is not None
        for message in self.consumer.consume(1000, timeout_s):
            if message.error():
                continue
            record = ControlRecord.of(message)
            try:
                change = validate(record.value, record.key, self.live.registry, self.stream)
                if self.live.unchanged(change):
                    continue
                self.live.apply(change, record.version)
            except OtherStream:
                continue
            except ControlMessageError as e:
                self.log(f"control record at offset {record.offset} refused: {e}")
                continue
            self.log(f"control record at offset {record.offset}: {change.kind} "
                     f"{change.name} {change.op}")
            changed = True
        return changed

    def caught_up(self) -> bool:
        """Whether every control record there is now has been polled (file: always)."""
        if self.consumer is None:
            return True
        _, high = self.consumer.get_watermark_offsets(self.tp, timeout=10)
        position = self.consumer.position([self.tp])[0].offset
        return high <= 0 or position >= high

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


def committed_at(checkpoint: str) -> tuple[int, int]:
    """(the next micro-batch's id, the first seq it can hold) after the last micro-batch
    the job committed in `checkpoint`: where a change made now holds from."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(checkpoint.rstrip("/"))
    root = root.rstrip("/")
    selector = pafs.FileSelector(f"{root}/spark/commits", allow_not_found=True)
    batches = [int(i.base_name) for i in fs.get_file_info(selector)
               if i.type == pafs.FileType.File and i.base_name.isdigit()]
    if not batches:
        return 0, 0
    last = max(batches)
    with fs.open_input_stream(f"{root}/spark/offsets/{last}") as f:
        offset = orjson.loads(f.read().decode().splitlines()[-1])
    carry = CarryStore(checkpoint).get(offset)
    return last + 1, carry.last_seq + 1


def log_change(checkpoint: str, entry: dict) -> None:
    """One line of `CHECKPOINT/changes.jsonl`."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(checkpoint.rstrip("/"))
    path = f"{root.rstrip('/')}/changes.jsonl"
    before = b""
    try:
        with fs.open_input_stream(path) as f:
            before = f.read()
    except FileNotFoundError:
        pass
    with fs.open_output_stream(path + ".tmp") as f:
        f.write(before + orjson.dumps(entry) + b"\n")
    fs.move(path + ".tmp", path)


def read_changes(checkpoint: str) -> list[dict]:
    path = Path(checkpoint) / "changes.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] \
        if path.exists() else []


class LiveJob:
    """The streaming query, started again on its checkpoint whenever the live queries
    change (see the module's docstring). `start_job(queries, texts)` starts the streaming
    query (`job.start` with the source, a sink for these queries and the options)."""

    def __init__(self, watch: QueryWatch, checkpoint: str,
                 start_job: Callable[[list[CheckedQuery], dict[str, str]], object],
                 log: Callable[[str], None] = lambda line: None):
        self.watch = watch
        self.checkpoint = checkpoint.rstrip("/")
        self.start_job = start_job
        self.log = log
        self.job: Any = None  # pyspark's StreamingQuery
        self.running: Any = None  # the QuerySet running
        self.restarts = 0

    def start(self) -> None:
        self.running = self.watch.current()
        self.job = self.start_job(self.running.queries, self.running.texts)

    def check(self, timeout_s: float = 0.0) -> bool:
        """Take changes; restart the streaming query on them. Whether it restarted."""
        if not self.watch.poll(timeout_s):
            return False
        # Deliberately like QueryWatch._poll_file's read: each logs its own failure and keeps
        # what runs.
        try:
            wanted = self.watch.current()
        except NoQueries as e:
            self.log(f"{e}: the job keeps its queries until one is added")
            return False
        before, after = self.running.fingerprints(), wanted.fingerprints()
        if before == after and [q.index for q in self.running.queries] == \
                [q.index for q in wanted.queries]:
            return False
        self._stop_between_batches()
        batch, at = committed_at(self.checkpoint)
        entry = {"batch": batch, "at": at,
                 "added": sorted(set(after) - set(before)),
                 "removed": sorted(set(before) - set(after)),
                 "changed": sorted(n for n in set(before) & set(after)
                                   if before[n] != after[n])}
        log_change(self.checkpoint, entry)
        self.log(f"queries changed ({', '.join(f'{k} {v}' for k, v in entry.items())}): "
                 "the streaming query starts again on its checkpoint")
        self.running = wanted
        self.job = self.start_job(wanted.queries, wanted.texts)
        self.restarts += 1
        return True

    def _stop_between_batches(self) -> None:
        """Stop the streaming query, when no micro-batch is running if it comes to that
        soon (a micro-batch stopped midway runs again after the restart: the same output)."""
        job = self.job
        deadline = time.monotonic() + 30
        while job.isActive and job.status.get("isTriggerActive") and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        job.stop()
        if job.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {job.exception()}")

    def run(self, once: bool = False, poll_s: float = 1.0) -> None:
        """Until the streaming query ends (or, `once`, until the source has nothing new
        and no change is pending)."""
        if self.job is None:
            self.start()
        while True:
            if once:
                self.job.processAllAvailable()
                if not self.check(0.1) and self.watch.caught_up():
                    self.job.stop()
                    return
                continue
            self.job.awaitTermination(poll_s)
            if not self.job.isActive:
                exception = self.job.exception()
                if exception is not None:
                    raise RuntimeError(str(exception))
                return
            self.check()

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()
        self.watch.close()
