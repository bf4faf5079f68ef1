"""Server-sent events of one query's composite events, read from its INTO topic in
order (offset order of each partition; the coordinator writes an INTO topic in sort-key
order). Only records the query's pipeline wrote (header `cep.pipeline`) and whose `query`
is the query's name are sent; each is `event: composite`, `id: PARTITION:OFFSET`, `data:`
the composite as JSON. One `event: ready` comes first, once the consumer is placed.
`from=beginning` (default `end`) replays what is there; `limit=N` ends the stream after N
events and `idle_s=S` after S seconds with none (for scripts).
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

from services.api.errors import Refused
from services.stream.checkpoint import PIPELINE_HEADER
from services.stream.kafka import Topics

HEARTBEAT_S = 15


def _bad(message: str):
    return Refused(400, {"error": message})


def _number(request: web.Request, name: str, kind, low, high):
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise _bad(f"{name}: a number") from None
    if not low <= value <= high:
        raise _bad(f"{name}: between {low} and {high}")
    return value


async def tail_query(request: web.Request, api, name: str) -> web.StreamResponse:
    start = request.query.get("from", "end")
    if start not in ("beginning", "end"):
        raise _bad("from: beginning or end")
    limit = _number(request, "limit", int, 1, 1_000_000)
    idle_s = _number(request, "idle_s", float, 0.1, 3600)
    live = (await asyncio.to_thread(api.live)).live.get(name)
    if live is None:
        return web.json_response({"error": f"no live query {name!r}"}, status=404)
    topic = live.output
    tag = Topics(live.checked.schema.stream, prefix=api.config.prefix).group("coordinator")
    consumer = api.config.settings.consumer()
    try:
        metadata = (await asyncio.to_thread(consumer.list_topics, topic, 10)).topics.get(topic)
        partitions = sorted(metadata.partitions) if metadata and metadata.error is None \
            else [0]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if start == "beginning"
                                        else OFFSET_END) for p in partitions])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(b": tail of " + topic.encode() + b"\n\n")
        sent, last = 0, time.monotonic()
        beat, positioned = last, False
        while (limit is None or sent < limit) and not api.closing.is_set():
            messages = await asyncio.to_thread(consumer.consume, 500, 0.25)
            now = time.monotonic()
            if not positioned:  # the first fetch placed the consumer: say so
                await response.write(b"event: ready\ndata: {}\n\n")
                positioned = True
            for message in messages:
                if message.error() is not None or (PIPELINE_HEADER, tag.encode()) not in \
                        (message.headers() or ()):
                    continue
                composite = orjson.loads(message.value())
                if composite.get("query") != name:
                    continue
                await response.write(b"event: composite\nid: %d:%d\ndata: %s\n\n" % (
                    message.partition(), message.offset(), orjson.dumps(composite)))
                sent, last = sent + 1, now
                if limit is not None and sent >= limit:
                    break
            if idle_s is not None and now - last > idle_s:
                break
            if now - beat > HEARTBEAT_S:
                await response.write(b": alive\n\n")
                beat = now
        await response.write_eof()
        return response
    finally:
        await asyncio.to_thread(consumer.close)
