"""The format of every snapshot and checkpoint: an envelope in front naming the kind, the
format version and a checksum of the whole, and the migrations that bring older versions
to the current one (docs/snapshots.md).

Binary snapshots (an engine, a stream's engines, the Python API's Stream, a worker's
partition) are a header line, then the payload:

    {"cep_snapshot":"partition","format":2,"crc32":"1c291ca3","length":10774,
     "stream":"trades","partition":0,"generation":5}\\n<10774 bytes>

(one line). JSON checkpoints (the splitter's, the coordinator's) are one JSON object whose
first keys are the envelope: {"cep_snapshot":"splitter","format":2,"crc32":"...",
"stream":"trades","generation":5,"position":...}; they stay JSON text because the
splitter's also travels as the metadata string of a Kafka commit.

`crc32` (zlib's CRC-32, eight lowercase hex digits) covers every byte of the snapshot but
its own eight digits: the envelope and the whole payload. CRC-32 detects every change
within 32 consecutive bits, so any single changed byte is caught, and a random change of
more with a chance of 1 in 4e9 of slipping through. Then the identity in the envelope
(`stream`, `partition`, `shard`) must be what the reader expects, so a snapshot restored
under the wrong key or into another stream is refused too. `generation` numbers a
service's checkpoints (services/stream/checkpoint.py keeps the last two).

All begin with MAGIC. Format 1 had the envelope without the checksum and identity: it is
still restored (its layout is the same), without a check of its bytes, and a warning
(UncheckedSnapshot) says so. Snapshots written before the envelope are version 0, told
apart by how they begin, which no envelope can: an engine's or engines' snapshot is a zip
(np.savez, b"PK\\x03\\x04"); a Stream's is 16 bytes of counters then such a zip; a
partition's a big-endian length and a JSON object of that length; the splitter's
checkpoint begins {"position": and the coordinator's {"offsets": (the first keys they
were written with). Anything else is refused.
"""

from __future__ import annotations

# Deferred imports: numpy, for the engines' npz snapshots only (pack_arrays/unpack_arrays): the
# splitter's and coordinator's checkpoints are JSON and their processes need no numpy for them.

import re
import struct
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import orjson

if TYPE_CHECKING:
    import numpy.typing as npt

MAGIC = b'{"cep_snapshot":"'
_HEAD = re.compile(rb'\{"cep_snapshot":"([A-Za-z0-9_.-]{1,64})","format":(\d{1,9})')
_LENGTH = re.compile(rb',"length":(\d{1,19})\}\n')
_CRC = re.compile(rb',"crc32":"')
_HEX = re.compile(rb'([0-9a-f]{8})"')
_ZIP = b"PK\x03\x04"
# A snapshot's payload: bytes (or a view of them) of a binary snapshot, the state of a JSON
# checkpoint. A migration takes one version's payload to the next version's.
Binary = bytes | memoryview
Payload = bytes | memoryview | dict[str, Any]
Migration = Callable[[Payload], Payload]
HEADER_MAX = 4096  # a binary snapshot's header line is shorter than this

# the envelope's keys after the checksum, in the order they are written: what the snapshot
# is of (checked against what the reader expects) and which of a service's checkpoints
IDENTITY = ("stream", "partition", "shard")
ENVELOPE = ("cep_snapshot", "format", "crc32", "length", *IDENTITY, "generation")

REPLAY = ("or replay the input from its beginning into new engines")
DISCARD = ("or start this release afresh: stop the services, delete the topics and consumer "
           "groups cep.<stream>.* and start them again, which replays the source topic from "
           "its beginning (docs/snapshots.md)")


class SnapshotError(ValueError):
    """Bytes that this release cannot restore, with what was found and what to do."""


class UncheckedSnapshot(UserWarning):
    """A snapshot from before checksums (format 0 or 1) was restored without a check of its
    bytes."""


@dataclass(frozen=True)
class Kind:
    name: str
    version: int  # the format version this release writes
    json: bool  # a JSON checkpoint (else a binary snapshot)
    unversioned: Callable[[Binary], bool]  # do these bytes begin like a version-0 snapshot?
    discard: str  # how to go on without the state
    checked_since: int = 2  # the first format version with a checksum


@dataclass(frozen=True)
class Envelope:
    """What the envelope of a restored snapshot said."""

    kind: str
    version: int  # as written (0: no envelope)
    checked: bool  # its checksum was verified (False: a format from before checksums)
    stream: str | None = None
    partition: int | None = None
    shard: int | None = None
    generation: int | None = None


def _zip_at(offset: int) -> Callable[[Binary], bool]:
    return lambda data: bytes(data[offset:offset + 4]) == _ZIP


def _partition_v0(data: Binary) -> bool:
    if len(data) < 6:
        return False
    (size,) = struct.unpack(">I", data[:4])
    return bytes(data[4:5]) == b"{" and 4 + size <= len(data) and \
        bytes(data[3 + size:4 + size]) == b"}"


def _starts(prefix: bytes) -> Callable[[Binary], bool]:
    return lambda data: bytes(data[:len(prefix)]) == prefix


KINDS = {k.name: k for k in [
    Kind("engine", 2, False, _zip_at(0), REPLAY),
    Kind("engines", 2, False, _zip_at(0), REPLAY),
    Kind("stream", 2, False, _zip_at(16), REPLAY),
    Kind("partition", 2, False, _partition_v0, DISCARD),
    Kind("splitter", 2, True, _starts(b'{"position":'), DISCARD),
    Kind("coordinator", 2, True, _starts(b'{"offsets":'), DISCARD),
]}

# (kind, version) -> the function taking that version's payload (bytes, or the dict of a
# JSON checkpoint) to the next version's
MIGRATIONS: dict[tuple[str, int], Migration] = {}


def migration(kind: str, version: int) -> Callable[[Migration], Migration]:
    """Register the step from `version` to `version + 1` of `kind`."""
    def register(step: Migration) -> Migration:
        MIGRATIONS[(kind, version)] = step
        return step
    return register


def _same_layout(payload: Payload) -> Payload:
    """Version 1 put the envelope in front of the version-0 layout, unchanged; version 2
    added the checksum and identity to the envelope, the payload unchanged."""
    return payload


for _name in KINDS:
    migration(_name, 0)(_same_layout)
    migration(_name, 1)(_same_layout)


# ------------------------------------------------------------------ writing

def pack(kind: str, payload: bytes, **identity: object) -> bytes:
    """A binary snapshot of `kind`: the envelope (with `identity`: stream=, partition=,
    shard=, generation=, those given), then `payload`."""
    k = _kind(kind, json=False)
    rest = orjson.dumps({"length": len(payload), **_identity(identity)})
    return _sealed(b'%s%s","format":%d,"crc32":"' % (MAGIC, kind.encode(), k.version),
                   b'",' + rest[1:] + b"\n", payload)


def pack_arrays(kind: str, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]],
                **identity: object) -> bytes:
    """A binary snapshot of `kind` whose payload is one npz: `meta` (JSON) and the named
    numpy arrays."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, __meta__=np.frombuffer(orjson.dumps(meta), dtype=np.uint8),
             **arrays)  # type: ignore[arg-type]  # numpy's stub: a name could be allow_pickle
    return pack(kind, buffer.getvalue(), **identity)


def pack_json(kind: str, state: dict[str, Any], **identity: object) -> bytes:
    """A JSON checkpoint of `kind`: the envelope's keys first (with `identity`, as for
    `pack`), then those of `state`."""
    k = _kind(kind, json=True)
    clash = set(ENVELOPE) & set(state)
    if clash:
        raise ValueError(f"a {kind} checkpoint cannot have the envelope's keys "
                         f"{sorted(clash)} in its state")
    rest = orjson.dumps({**_identity(identity), **state})
    return _sealed(b'%s%s","format":%d,"crc32":"' % (MAGIC, kind.encode(), k.version),
                   b'"' + (b"}" if rest == b"{}" else b"," + rest[1:]), b"")


def _identity(identity: dict[str, object]) -> dict[str, object]:
    unknown = set(identity) - set(IDENTITY) - {"generation"}
    if unknown:
        raise TypeError(f"not an envelope field: {', '.join(sorted(unknown))}")
    return {name: identity[name] for name in (*IDENTITY, "generation")
            if identity.get(name) is not None}


def _sealed(before: bytes, after: bytes, payload: bytes) -> bytes:
    """before + the CRC-32 of everything else as 8 hex digits + after + payload."""
    crc = zlib.crc32(payload, zlib.crc32(after, zlib.crc32(before)))
    return b"".join((before, b"%08x" % crc, after, payload))


# ------------------------------------------------------------------ reading

def read(kind: str, data: Binary, where: str | None = None,
         **expect: object) -> tuple[Envelope, bytes | memoryview]:
    """(envelope, payload in the current version's layout) of a binary snapshot of `kind`,
    checked: its checksum, and its identity against `expect` (stream=, partition=,
    shard=). `where` (a file, a record) begins the message of a refusal."""
    try:
        return _read(_kind(kind, json=False), data, expect)
    except SnapshotError as e:
        raise _located(e, where) from None


def unpack(kind: str, data: Binary, where: str | None = None,
           **expect: object) -> bytes | memoryview:
    """The payload of a binary snapshot of `kind`, in the current version's layout (see
    `read`)."""
    return read(kind, data, where, **expect)[1]


def unpack_arrays(kind: str, data: Binary, where: str | None = None,
                  **expect: object) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """(meta, arrays) of a snapshot that `pack_arrays` wrote, in the current layout."""
    import io

    import numpy as np

    with np.load(io.BytesIO(unpack(kind, data, where, **expect)),
                 allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    return orjson.loads(arrays.pop("__meta__").tobytes()), arrays


def read_json(kind: str, data: bytes | str, where: str | None = None,
              **expect: object) -> tuple[Envelope, dict[str, Any]]:
    """(envelope, state in the current version's layout) of a JSON checkpoint of `kind`,
    checked as `read` checks a binary snapshot."""
    try:
        return _read_json(_kind(kind, json=True), data, expect)
    except SnapshotError as e:
        raise _located(e, where) from None


def unpack_json(kind: str, data: bytes | str, where: str | None = None,
                **expect: object) -> dict[str, Any]:
    """The state of a JSON checkpoint of `kind`, in the current version's layout."""
    return read_json(kind, data, where, **expect)[1]


def check(kind: str, data: Binary | str, where: str | None = None,
          **expect: object) -> Envelope:
    """The envelope of a snapshot or checkpoint of `kind` whose checksum and identity
    hold (SnapshotError otherwise), without decoding its payload."""
    k = _kind(kind, json=KINDS[kind].json if kind in KINDS else False)
    data = data.encode() if isinstance(data, str) else data
    try:
        head = _envelope(k, data)
        if head is None:
            return _unchecked(k, 0, {}, warn=False)
        version, end, checked = head
        if k.json:
            return _read_json(k, data, expect, warn=False)[0]
        return _binary_envelope(k, data, version, end, checked, expect, warn=False)[0]
    except SnapshotError as e:
        raise _located(e, where) from None


def describe(data: Binary) -> tuple[str, int] | None:
    """(kind, format version) of an enveloped snapshot; None for bytes without one."""
    found = _HEAD.match(bytes(data[:128]))
    return None if found is None else (found.group(1).decode(), int(found.group(2)))


def _located(error: SnapshotError, where: str | None) -> SnapshotError:
    return error if where is None else SnapshotError(f"{where}: {error}")


def _read(k: Kind, data: Binary, expect: dict[str, object]
          ) -> tuple[Envelope, bytes | memoryview]:
    head = _envelope(k, data)
    if head is None:
        return _unchecked(k, 0, {}), _migrate(k, 0, memoryview(data))
    version, end, checked = head
    envelope, start = _binary_envelope(k, data, version, end, checked, expect)
    return envelope, _migrate(k, version, memoryview(data)[start:])


def _binary_envelope(k: Kind, data: Binary, version: int, end: int, checked: bool,
                     expect: dict[str, object], warn: bool = True) -> tuple[Envelope, int]:
    """(envelope, start of the payload) of a binary snapshot whose header's kind and
    format are read (and checksum verified when `checked`)."""
    if not checked:
        found = _LENGTH.match(bytes(data[end:end + 32]))
        if found is None:
            raise SnapshotError(f"this {k.name} snapshot is truncated or damaged: its header "
                                f"ends without a length ({len(data)} bytes in all)")
        start = end + found.end()
        _length(k, int(found.group(1)), len(data) - start)
        return _unchecked(k, version, {}, warn), start
    line_end = bytes(data[:HEADER_MAX]).find(b"\n")
    try:  # its checksum held: it is as written, unless it was made to look so
        fields = orjson.loads(bytes(data[:line_end])) if line_end > 0 else None
    except orjson.JSONDecodeError:
        fields = None
    if not isinstance(fields, dict):
        raise SnapshotError(f"this {k.name} snapshot is damaged: its header is not one "
                            f"line of JSON (first bytes {bytes(data[:64])!r})")
    start = line_end + 1
    _length(k, fields.get("length"), len(data) - start)
    return _identified(k, version, fields, expect), start


def _length(k: Kind, length: object, have: int) -> None:
    """Refuse a payload of another length than the header's (`length`: as the header
    says it, which may be anything)."""
    if not isinstance(length, int) or isinstance(length, bool):
        raise SnapshotError(f"this {k.name} snapshot is damaged: its header's length is "
                            f"{length!r}, not a number of bytes")
    if have != length:
        what = "truncated" if have < length else "longer than its header says"
        raise SnapshotError(f"this {k.name} snapshot is {what}: its header says {length} "
                            f"bytes follow it, {have} do")


def _read_json(k: Kind, data: Binary | str, expect: dict[str, object],
               warn: bool = True) -> tuple[Envelope, dict[str, Any]]:
    data = data.encode() if isinstance(data, str) else data
    head = _envelope(k, data)
    try:  # an object: the data begins as the envelope or a version-0 checkpoint does
        state: dict[str, Any] = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise SnapshotError(f"this {k.name} checkpoint is truncated or damaged ({len(data)} "
                            f"bytes): {e}") from None
    if head is None:
        return _unchecked(k, 0, {}, warn), _migrate(k, 0, state)
    version, _, checked = head
    fields = {name: state.pop(name) for name in ENVELOPE if name in state}
    later = sorted(set(fields) - {"cep_snapshot", "format"})
    if not checked and later:
        raise SnapshotError(f"this {k.name} checkpoint is damaged: its header says format "
                            f"version {version}, which had no {', '.join(later)}, and it "
                            f"has them")
    envelope = _identified(k, version, fields, expect) if checked else \
        _unchecked(k, version, fields, warn)
    return envelope, _migrate(k, version, state)


def _identified(k: Kind, version: int, fields: dict[str, Any],
                expect: dict[str, object]) -> Envelope:
    """The envelope of a checked snapshot, refused when its identity is not `expect`."""
    for name, wanted in expect.items():
        if name not in IDENTITY:
            raise TypeError(f"not an identity field: {name}")
        found = fields.get(name)
        if wanted is not None and found is not None and found != wanted:
            said = ", ".join(f"{n} {fields[n]!r}" for n in IDENTITY if n in fields)
            raise SnapshotError(
                f"this {k.name} {_noun(k)} is of {said}, not of {name} {wanted!r}: it was "
                f"written for another {name} (kept under another key or file, or copied "
                f"from another deployment?). Restore the one of {name} {wanted!r} "
                f"{k.discard}")
    return Envelope(k.name, version, True, fields.get("stream"), fields.get("partition"),
                    fields.get("shard"), fields.get("generation"))  # IDENTITY's order


def _unchecked(k: Kind, version: int, fields: dict[str, Any], warn: bool = True) -> Envelope:
    if warn:
        warnings.warn(UncheckedSnapshot(
            f"this {k.name} {_noun(k)} has format version {version}, from before "
            f"checksums: restored without a check of its bytes (the next one written "
            f"carries a checksum)"), stacklevel=4)
    return Envelope(k.name, version, False, generation=fields.get("generation"))


def _noun(k: Kind) -> str:
    return "checkpoint" if k.json else "snapshot"


def _kind(name: str, json: bool) -> Kind:
    k = KINDS.get(name)
    if k is None or k.json != json:
        raise ValueError(f"no {'JSON checkpoint' if json else 'binary snapshot'} kind "
                         f"{name!r} (kinds: {', '.join(KINDS)})")
    return k


def _envelope(k: Kind, data: Binary) -> tuple[int, int, bool] | None:
    """(version, end of the kind and version, whether its checksum was verified) of data
    with an envelope of kind `k`; None for recognised version-0 bytes; else
    SnapshotError."""
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
    checksum = _CRC.match(first, found.end())
    if checksum is not None and version <= k.version:  # verified before anything is believed
        if version < k.checked_since:
            raise SnapshotError(f"this {k.name} {_noun(k)} is damaged: its header says format "
                                f"version {version}, which had no checksum, and carries one")
        _verify(k, data, checksum.end())
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
    if checksum is None and version >= k.checked_since:
        raise SnapshotError(f"this {k.name} {_noun(k)} is damaged: format version {version} "
                            f"always carries a checksum, its header has none (first bytes "
                            f"{first[:64]!r})")
    return version, found.end(), checksum is not None


def _verify(k: Kind, data: Binary, at: int) -> None:
    """Check the CRC-32 whose 8 hex digits begin at `at` against every other byte."""
    digits = _HEX.match(bytes(data[at:at + 9]))
    if digits is None:
        raise SnapshotError(f"this {k.name} snapshot is truncated or damaged: its checksum "
                            f"is not 8 hex digits (found {bytes(data[at:at + 9])!r})")
    view = memoryview(data)
    crc = zlib.crc32(view[at + 8:], zlib.crc32(view[:at]))
    said = int(digits.group(1), 16)
    if crc != said:
        _truncated(k, data)
        raise SnapshotError(
            f"this {k.name} {_noun(k)} is damaged: its bytes do not match its checksum "
            f"(crc32 {crc:08x} over its {len(data)} bytes, its header says {said:08x}): it "
            f"was changed after it was written (a bad disk or copy, an edit, a truncation). "
            f"Restore an undamaged copy or an earlier snapshot, {k.discard}")


def _truncated(k: Kind, data: Binary) -> None:
    """Refuse damaged bytes as truncated where that is what they look like: a binary
    snapshot whose header gives another length than follows it, a JSON checkpoint that
    does not parse."""
    if k.json:
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise SnapshotError(f"this {k.name} checkpoint is truncated or damaged "
                                f"({len(data)} bytes): {e}") from None
        return
    line_end = bytes(data[:HEADER_MAX]).find(b"\n")
    try:
        length = orjson.loads(bytes(data[:line_end]))["length"] if line_end > 0 else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return
    if isinstance(length, int) and length != len(data) - line_end - 1:
        _length(k, length, len(data) - line_end - 1)


@overload
def _migrate(k: Kind, version: int, payload: memoryview) -> bytes | memoryview: ...


@overload
def _migrate(k: Kind, version: int, payload: dict[str, Any]) -> dict[str, Any]: ...


def _migrate(k: Kind, version: int, payload: Payload) -> Payload:
    if version < k.version and isinstance(payload, memoryview):
        payload = bytes(payload)
    for v in range(version, k.version):
        payload = MIGRATIONS[(k.name, v)](payload)
    return payload
