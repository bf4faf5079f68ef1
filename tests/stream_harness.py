"""Shared steps of the tests that run the service (splitter, workers, coordinator) in
process on a real broker: fresh topics with a query file's queries added, and a stream
produced to its end."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cep_core.checker import load_queries
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, produce, produce_end, read_all
from cep_service.stream.pipeline import (
    LocalPipeline,
    create_topics,
    flush_progressing,
    wait_progressing,
)


def topics_with_queries(settings: KafkaSettings, query_file: Path, source: str, prefix: str,
                        partitions: int = 4):
    """(queries, topics, before): new topics for the stream of `query_file`'s queries
    (source topic `source`, the others named after `prefix`), every query added on the
    control topic; `before`: how many records each INTO topic held already."""
    queries = load_queries(query_file)
    topics = Topics(queries[0].schema.stream, source=source, prefix=prefix)
    outputs = [q.query.output for q in queries]
    create_topics(settings, topics, partitions, outputs)
    before = {topic: len(read_all(settings, topic)) for topic in outputs}
    for name, text in split_query_file(query_file.read_text()):
        publish(settings, topics.control, ControlMessage("add", name, text))
    return queries, topics, before


def file_records(path: Path) -> list[bytes]:
    """The non-blank lines of an events file."""
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def produce_lines(settings: KafkaSettings, topic: str, lines: Iterable[bytes],
                  end: bool = True) -> None:
    """One record per line to `topic`, then (`end`) the end of input; flushed."""
    producer = settings.producer()
    for line in lines:
        produce(producer, topic, line)
    if end:
        produce_end(producer, topic)
    producer.flush(30)


def produce_to_end(settings: KafkaSettings, pipeline: LocalPipeline, source: str,
                   records: Iterable[bytes]) -> None:
    """Every record to `source`, then the end of input; returns once the coordinator has
    released the end, waiting as long as the pipeline makes progress
    (`LocalPipeline.progress`; a cold kernel cache on a loaded machine only takes longer)."""
    producer = settings.producer()
    for record in records:
        produce(producer, source, record)
    produce_end(producer, source)
    flush_progressing(producer, "source records")
    wait_progressing(lambda: pipeline.coordinator.merger.ended, pipeline.progress,
                     "end of input released")
