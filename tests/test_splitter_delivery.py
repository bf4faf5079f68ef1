"""A record the broker never took (a delivery report with an error) must not be skipped
by the splitter's next checkpoint: the checkpoint refuses, the splitter stops with an
error, and its restart stamps and sends everything after the last checkpoint again."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from cep_service.stream.routing import PlainMessage
from cep_service.stream.splitter import SPLITTER_KEY
from tests.test_splitter_end import Source, new_splitter, source_messages


def Report(topic: str, partition: int, offset: int) -> PlainMessage:
    """What a delivery report hands the callback: the record's topic and place."""
    return PlainMessage(topic, partition, offset, None)


def checkpoints(splitter) -> list:
    return [value for topic, value, key, _, _ in splitter.producer.sent
            if topic == splitter.topics.state and key == SPLITTER_KEY]


def test_no_checkpoint_past_a_frame_that_was_not_delivered():
    source = source_messages()
    splitter = new_splitter(0)
    splitter.take(source[0][:100])
    splitter.source = Source({0: 100, 1: 0, 2: 0})
    splitter._delivered(None, Report(splitter.topics.keyed, 0, 7))
    splitter.commit()
    assert len(checkpoints(splitter)) == 1

    splitter.take(source[0][100:200])
    splitter.source = Source({0: 200, 1: 0, 2: 0})
    splitter._delivered(KafkaError(KafkaError._MSG_TIMED_OUT),
                        Report(splitter.topics.keyed, 1, -1))
    splitter._delivered(None, Report(splitter.topics.keyed, 0, 9))
    with pytest.raises(RuntimeError, match="not delivered"):
        splitter.commit()
    assert len(checkpoints(splitter)) == 1  # the last checkpoint still says where to resume
