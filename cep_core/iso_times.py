"""ISO-8601 texts as integer times, a column at a time, with the record decoder's rules.

`event_io.decode_record` reads a time written as text with `datetime.fromisoformat` (naive
times are UTC) and floors it to the stream's unit. `iso_times` gives the same without a
Python object per text: pyarrow's ISO-8601 cast reads the texts (`YYYY-MM-DD`, then `T` or
a space and `hh`, `hh:mm` or `hh:mm:ss`, a fraction of up to 9 digits, `Z` or an offset
`+hh`, `+hhmm`, `+hh:mm`), and where it reads a text, it reads it as Python does, except
year 0 (Python refuses it), which is left out; tests/test_iso_times.py holds both to that
with hypothesis. A text the cast refuses (another spelling, February 30, surrounding
blanks, more than 6 decimals outside 1677-2262) is a null, so that the record decoder
reads that row and gives its reason.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.arrow_numpy import from_numpy, is_null, to_numpy
from cep_core.schema import TimeUnit

I64 = npt.NDArray[np.int64]
Flags = npt.NDArray[np.bool_]
_MICROS_PER_UNIT = {TimeUnit.S: 1_000_000, TimeUnit.MS: 1_000, TimeUnit.US: 1}
_LONGEST_NS = np.iinfo(np.int64).max // 1000  # microseconds whose nanoseconds fit
_SMALLEST_PART = 64  # rows: a part the cast refuses is halved down to this, then left out
_SIGNS = np.zeros(256, bool)
_SIGNS[[ord("+"), ord("-")]] = True
_ZONE_FROM = 13  # a sign at this byte or later is a zone's (`YYYY-MM-DDThh` before it)


def iso_times(text: pa.Array | pa.ChunkedArray, time_unit: TimeUnit) -> pa.Array:
    """Texts as int64 times since the epoch in `time_unit` (s, ms, us, ns), as the
    record decoder converts them; a null where a text is null or one the cast refuses
    (and every row for a unit that is not a time: ticks)."""
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks() if text.num_chunks else pa.array([], pa.string())
    if pa.types.is_large_string(text.type):
        text = text.cast(pa.string())
    n = len(text)
    if not n or (time_unit not in _MICROS_PER_UNIT and time_unit != TimeUnit.NS):
        return pa.nulls(n, pa.int64())
    micros, known = _micros(text)
    if time_unit == TimeUnit.NS:
        known &= np.abs(micros) <= _LONGEST_NS
        units = micros * 1000
    else:
        units = np.floor_divide(micros, _MICROS_PER_UNIT[time_unit])
    if known.all():
        return from_numpy(units)
    validity = pa.py_buffer(np.packbits(known, bitorder="little"))
    return pa.Array.from_buffers(pa.int64(), n, [validity, from_numpy(units).buffers()[1]])


def _micros(text: pa.Array) -> tuple[I64, Flags]:
    """Microseconds since the epoch (UTC) of each text, and whether it was read."""
    n = len(text)
    known = ~to_numpy(pc.starts_with(text, "0000"))
    if text.null_count:
        known &= ~is_null(text)
    micros = np.zeros(n, np.int64)
    if not known.any():
        return micros, known
    zoned = _zoned(text)
    for kind in (False, True):  # the cast reads a zone into a zoned type only, and back
        rows = np.flatnonzero(known & (zoned == kind))
        if not len(rows):
            continue
        values, read = _cast(text if len(rows) == n else text.take(from_numpy(rows)),
                             "UTC" if kind else None)
        micros[rows] = values
        known[rows] = read
    return micros, known


def _zoned(text: pa.Array) -> Flags:
    """Whether each text ends in a zone: `Z`, or a sign 3, 5 or 6 bytes from its end and
    after its hour."""
    bounds = np.frombuffer(text.buffers()[1], np.int32, len(text) + 1, text.offset * 4)
    starts, ends = bounds[:-1].astype(np.int64), bounds[1:].astype(np.int64)
    data = text.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None and data.size else \
        np.zeros(1, np.uint8)

    def byte(back: int) -> npt.NDArray[np.uint8]:
        return np.take(data, ends - back, mode="clip")

    zoned: Flags = (byte(1) == ord("Z")) & (ends > starts)
    for back in (3, 5, 6):
        zoned |= _SIGNS[byte(back)] & (ends - back - starts >= _ZONE_FROM)
    return zoned


def _cast(text: pa.Array, tz: str | None) -> tuple[I64, Flags]:
    """The texts as microseconds (through nanoseconds where a fraction has more than 6
    digits: floored, as Python cuts them) and which were read: a part the cast refuses as
    a whole is halved until the halves pass."""
    for unit, per_micro in (("us", 1), ("ns", 1000)):  # Arrow's timestamp units
        try:
            parsed = pc.cast(text, pa.timestamp(unit, tz=tz))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        values = np.frombuffer(parsed.buffers()[1], np.int64, len(parsed), parsed.offset * 8)
        return (values // per_micro if per_micro > 1 else values), np.ones(len(text), bool)
    if len(text) <= _SMALLEST_PART:
        return np.zeros(len(text), np.int64), np.zeros(len(text), bool)
    half = len(text) // 2
    (first, first_read), (second, second_read) = (_cast(text.slice(0, half), tz),
                                                  _cast(text.slice(half), tz))
    return np.concatenate((first, second)), np.concatenate((first_read, second_read))
