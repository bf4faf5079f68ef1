"""The format of every snapshot and checkpoint: an envelope in front naming the kind and
the format version, and the migrations that bring older versions to the current one
(docs/snapshots.md).

Binary snapshots (an engine, a stream's engines, the Python API's Stream, a worker's
partition) are a header line, then the payload:

    {"cep_snapshot":"partition","format":1,"length":10774}\\n<10774 bytes>

JSON checkpoints (the splitter's, the coordinator's) are one JSON object whose first two
keys are the envelope: {"cep_snapshot":"splitter","format":1,"position":...}; they stay
JSON text because the splitter's also travels as the metadata string of a Kafka commit.

Both begin with MAGIC. Snapshots written before this envelope are version 0, told apart by
how they begin, which no envelope can: an engine's or engines' snapshot is a zip (np.savez,
b"PK\\x03\\x04"); a Stream's is 16 bytes of counters then such a zip; a partition's a
big-endian length and a JSON object of that length; the splitter's checkpoint begins
{"position": and the coordinator's {"offsets": (the first keys they were written with).
Anything else is refused.
"""

from __future__ import annotations

# Deferred imports: numpy, for the engines' npz snapshots only (pack_arrays/unpack_arrays): the
# splitter's and coordinator's checkpoints are JSON and their processes need no numpy for them.

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

import orjson

MAGIC = b'{"cep_snapshot":"'
_HEAD = re.compile(rb'\{"cep_snapshot":"([A-Za-z0-9_.-]{1,64})","format":(\d{1,9})')
_LENGTH = re.compile(rb',"length":(\d{1,19})\}\n')
_ZIP = b"PK\x03\x04"

REPLAY = ("or replay the input from its beginning into new engines")
DISCARD = ("or start this release afresh: stop the services, delete the topics and consumer "
           "groups cep.<stream>.* and start them again, which replays the source topic from "
           "its beginning (docs/snapshots.md)")


class SnapshotError(ValueError):
    """Bytes that this release cannot restore, with what was found and what to do."""


@dataclass(frozen=True)
class Kind:
    name: str
    version: int  # the format version this release writes
    json: bool  # a JSON checkpoint (else a binary snapshot)
    unversioned: Callable[[bytes], bool]  # do these bytes begin like a version-0 snapshot?
    discard: str  # how to go on without the state


def _zip_at(offset: int) -> Callable[[bytes], bool]:
    return lambda data: bytes(data[offset:offset + 4]) == _ZIP


def _partition_v0(data: bytes) -> bool:
    if len(data) < 6:
        return False
    (size,) = struct.unpack(">I", data[:4])
    return bytes(data[4:5]) == b"{" and 4 + size <= len(data) and \
        bytes(data[3 + size:4 + size]) == b"}"


def _starts(prefix: bytes) -> Callable[[bytes], bool]:
    return lambda data: bytes(data[:len(prefix)]) == prefix


KINDS = {k.name: k for k in [
    Kind("engine", 1, False, _zip_at(0), REPLAY),
    Kind("engines", 1, False, _zip_at(0), REPLAY),
    Kind("stream", 1, False, _zip_at(16), REPLAY),
    Kind("partition", 1, False, _partition_v0, DISCARD),
    Kind("splitter", 1, True, _starts(b'{"position":'), DISCARD),
    Kind("coordinator", 1, True, _starts(b'{"offsets":'), DISCARD),
]}

# (kind, version) -> the function taking that version's payload (bytes, or the dict of a
# JSON checkpoint) to the next version's
MIGRATIONS: dict[tuple[str, int], Callable] = {}


def migration(kind: str, version: int):
    """Register the step from `version` to `version + 1` of `kind`."""
    def register(step: Callable) -> Callable:
        MIGRATIONS[(kind, version)] = step
        return step
    return register


def _same_layout(payload):
    """Version 1 put the envelope in front of the version-0 layout, unchanged."""
    return payload


for _name in KINDS:
    migration(_name, 0)(_same_layout)


# ------------------------------------------------------------------ writing

def pack(kind: str, payload: bytes) -> bytes:
    """A binary snapshot of `kind`: the envelope, then `payload`."""
    k = _kind(kind, json=False)
    return b'%s%s","format":%d,"length":%d}\n' % (MAGIC, kind.encode(), k.version,
                                                  len(payload)) + payload


def pack_arrays(kind: str, meta: dict, arrays: dict) -> bytes:
    """A binary snapshot of `kind` whose payload is one npz: `meta` (JSON) and the named
    numpy arrays."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, __meta__=np.frombuffer(orjson.dumps(meta), dtype=np.uint8), **arrays)
    return pack(kind, buffer.getvalue())


def pack_json(kind: str, state: dict) -> bytes:
    """A JSON checkpoint of `kind`: the envelope's keys first, then those of `state`."""
    k = _kind(kind, json=True)
    return orjson.dumps({"cep_snapshot": kind, "format": k.version, **state})


# ------------------------------------------------------------------ reading

def unpack(kind: str, data: bytes) -> memoryview:
    """The payload of a binary snapshot of `kind`, in the current version's layout."""
    k = _kind(kind, json=False)
    head = _envelope(k, data)
    if head is None:
        return _migrate(k, 0, memoryview(data))
    version, end = head
    found = _LENGTH.match(bytes(data[end:end + 32]))
    if found is None:
        raise SnapshotError(f"this {kind} snapshot is truncated or damaged: its header "
                            f"ends without a length ({len(data)} bytes in all)")
    start = end + found.end()
    length, have = int(found.group(1)), len(data) - start
    if have != length:
        what = "truncated" if have < length else "longer than its header says"
        raise SnapshotError(f"this {kind} snapshot is {what}: its header says {length} "
                            f"bytes follow it, {have} do")
    return _migrate(k, version, memoryview(data)[start:])


def unpack_arrays(kind: str, data: bytes) -> tuple[dict, dict]:
    """(meta, arrays) of a snapshot that `pack_arrays` wrote, in the current layout."""
    import io

    import numpy as np

    with np.load(io.BytesIO(unpack(kind, data)), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    return orjson.loads(arrays.pop("__meta__").tobytes()), arrays


def unpack_json(kind: str, data: bytes | str) -> dict:
    """The state of a JSON checkpoint of `kind`, in the current version's layout."""
    k = _kind(kind, json=True)
    data = data.encode() if isinstance(data, str) else data
    head = _envelope(k, data)
    try:
        state = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise SnapshotError(f"this {kind} checkpoint is truncated or damaged ({len(data)} "
                            f"bytes): {e}") from None
    if head is None:
        return _migrate(k, 0, state)
    del state["cep_snapshot"], state["format"]
    return _migrate(k, head[0], state)


def describe(data: bytes) -> tuple[str, int] | None:
    """(kind, format version) of an enveloped snapshot; None for bytes without one."""
    found = _HEAD.match(bytes(data[:128]))
    return None if found is None else (found.group(1).decode(), int(found.group(2)))


def _kind(name: str, json: bool) -> Kind:
    k = KINDS.get(name)
    if k is None or k.json != json:
        raise ValueError(f"no {'JSON checkpoint' if json else 'binary snapshot'} kind "
                         f"{name!r} (kinds: {', '.join(KINDS)})")
    return k


def _envelope(k: Kind, data: bytes) -> tuple[int, int] | None:
    """(version, end of the kind and version) of data with an envelope of kind `k`; None
    for recognised version-0 bytes; else SnapshotError."""
    first = bytes(data[:128])
    if not first.startswith(MAGIC):
        if len(first) < len(MAGIC) and MAGIC.startswith(first) and first:
            raise SnapshotError(f"this {k.name} snapshot is truncated: {len(first)} bytes, "
                                "not even a whole header")
        if k.unversioned(data):
            return None
        raise SnapshotError(f"not a snapshot of kind {k.name!r}: no envelope "
                            f"({MAGIC.decode()}...) and not the beginning of an "
                            f"unversioned one (first bytes "
                            f"{first[:16]!r}, {len(data)} bytes in all)")
    found = _HEAD.match(first)
    if found is None:
        raise SnapshotError(f"this {k.name} snapshot is truncated or damaged: its header "
                            f"is incomplete (first bytes {first[:48]!r})")
    kind, version = found.group(1).decode(), int(found.group(2))
    if kind != k.name:
        known = "" if kind in KINDS else f", which this release does not know (it " \
            f"reads {', '.join(KINDS)}; a newer release wrote it?)"
        raise SnapshotError(f"expected a snapshot of kind {k.name!r}, found one of kind "
                            f"{kind!r} (format {version}){known}")
    if version > k.version:
        raise SnapshotError(
            f"this {kind} snapshot has format version {version}; this release reads {kind} "
            f"format versions 0 to {k.version}. A newer release wrote it: run that release "
            f"or a newer one, {k.discard}")
    return version, found.end()


def _migrate(k: Kind, version: int, payload):
    if version < k.version and isinstance(payload, memoryview):
        payload = bytes(payload)
    for v in range(version, k.version):
        payload = MIGRATIONS[(k.name, v)](payload)
    return payload
