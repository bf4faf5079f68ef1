"""A splitter's answer to a change it refuses (see docs/live.md, Compaction): on the
compacted control topic the last record of a key must stay what is live under it, so the
refused record is followed by the live record again (a tombstone where none is live),
marked `cep.refused` (and `cep.version` for a stream); that record coming back is
recognised and changes nothing. `router` is the splitter's routing core
(services/stream/routing.py): its live set, topics and outbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from cep_core.control_message import (REFUSED_HEADER, STREAM, VERSION_HEADER, ControlMessage,
                                      ControlMessageError, ControlRecord, parse_key, validate)
from cep_core.control_ops import Op
from cep_core.errors import QueryError, QueryErrors
from cep_core.parser import parse
from cep_service.stream.topics import produce
from cep_service.stream.serve import log

if TYPE_CHECKING:  # routing imports this module
    from cep_service.stream.routing import Router


def write_back(router: Router, record: ControlRecord) -> None:
    """After a refusal, the live record under the refused key again (a tombstone where
    none is live), marked with the refused offset: on the compacted topic the last
    record of a key stays what is live. Another pipeline's query is not written over."""
    key = record.key
    try:
        kind, name = parse_key(key)
    except ControlMessageError:
        return
    assert key is not None  # parse_key refuses a missing key
    text = router.queries.live_text(kind, name)
    if kind is STREAM and name != router.topics.stream or \
            text is None and kind is not STREAM and _reads_another_stream(router, record):
        return
    headers = [(REFUSED_HEADER, str(record.offset).encode())]
    value = None
    if text is not None:
        value = ControlMessage(Op.ADD, name, text, kind=kind).to_json()
        if kind is STREAM:
            version = router.queries.registry.streams[name][1]
            headers.append((VERSION_HEADER, str(version).encode()))
    log("change_written_back", key=key.decode(errors="replace"),
        refused=record.offset, tombstone=value is None)
    produce(router.out, router.topics.control, value, key=key, headers=headers)


def _reads_another_stream(router: Router, record: ControlRecord) -> bool:
    """Whether a refused query record reads another pipeline's stream (as far as its
    text parses): that pipeline answers for it."""
    if record.value is None:  # a tombstone
        return False
    try:
        text = orjson.loads(record.value)["text"]
        return any(q.stream != router.topics.stream for q in parse(text).queries)
    except (QueryError, QueryErrors, orjson.JSONDecodeError, KeyError, TypeError):
        return False


def came_back(router: Router, record: ControlRecord) -> None:
    """A record a splitter wrote again after a refusal: nothing to do where it holds
    what is live here (no status, no frame, no engine reset). Where a change came in
    between (or another splitter wrote it), the record live here is written again;
    another pipeline's stream is learnt as it says."""
    try:
        change = validate(record.value, record.key, router.queries.registry,
                          router.topics.stream)
    except ControlMessageError:
        return  # another pipeline's query, or one this splitter cannot check
    if router.queries.unchanged(change):
        return
    if change.kind is STREAM and change.name != router.topics.stream:
        try:
            router.queries.apply(change, record.version, starting=True)
        except ControlMessageError:
            pass
        return
    write_back(router, record)
