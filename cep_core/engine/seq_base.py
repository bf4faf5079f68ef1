"""What both SEQ engines (CDP in `seq.py`, AIP in `seq_aip.py`) keep the same way: events
stored per channel and partition in arenas, pending matches (`pd`/`pk`), per-partition
bookkeeping, string constants, decoding, the snapshot of all that, and string compaction
(`string_codes`/`remap_strings`: the string codes are in partition keys and in stored
events; pending matches and automaton instances refer to stored rows).

A subclass sets `kernel` (with `module`, `layout`, `constants`, `source`, `record_width`)
and `plan` before calling `_setup`, and names its pending-record Kleene slots in
`pending_kleene_slots`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.arrow_numpy import segment_rows
from cep_core.batch import Batch
from cep_core.kernels.string_tables import StringTables
from cep_core.kernels.seq_layout import CTR_SIZE, ERR, INT64_MAX, INT64_MIN, PALIVE, PKN, PN, Row
from cep_core.kernels.seq_runtime import compact_pending
from cep_core.composite_batch import ColumnBatch
from cep_core.engine.base import Arrays, Engine, Meta
from cep_core.engine.keys import KeyIndex
from cep_core.engine.seq_idle import IdleKeys
from cep_core.engine.seq_output import SeqOutput
from cep_core.schema import AttrType, StreamSchema

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

BACKWARDS_TIME = "event time goes backwards"


def string_columns(layout: Any, schema: StreamSchema) -> list[int]:
    """The int columns of a SEQ channel row (`Layout`) that hold string codes."""
    return [col for name, (where, col) in layout.slots.items()
            if where == Row.INT and schema.attributes[name] == AttrType.STRING]


class Overflow(StrEnum):
    """What a SEQ engine does at its cap (`on_overflow`)."""

    ERROR = "error"  # stop the batch at the event that would exceed it, and raise
    COUNT = "count"  # drop the excess and count it


class SeqEngineBase(Engine):
    _PER_PARTITION = {"last_ts": INT64_MIN, "phead": -1, "ptail": -1, "pdec": INT64_MAX,
                      "pfirst": INT64_MAX}
    _PER_CHANNEL = ("base", "size", "cnt", "evicted")
    # Set by the subclass before `_setup`: the compiler's plan and kernel (the generated
    # module, its layout and string constants; cep_core.engine does not import the compiler).
    plan: Any
    kernel: Any
    algorithm: str
    pending_kleene_slots: I64
    # Set by `_setup`
    on_overflow: Overflow
    idle: IdleKeys
    module: Any  # the generated kernel module
    layout: Any  # the compiler's Layout of a channel row
    n_channels: int
    keys: KeyIndex
    uses_tables: bool
    _tables: StringTables | None
    output: SeqOutput
    # Set by `_reset_channels`: per partition (_PER_PARTITION, by name), per partition and
    # channel (_PER_CHANNEL, by name), per channel, and the kernels' shared arrays
    P: int
    last_ts: I64
    phead: I64
    ptail: I64
    pdec: I64
    pfirst: I64
    base: I64
    size: I64
    cnt: I64
    evicted: I64
    top: I64
    pd: I64
    pk: I64
    ctr: I64
    punct: int
    AI: list[I64]
    AF: list[F64]

    def _setup(self, idle_timeout: int | None, on_overflow: str) -> None:
        if on_overflow not in tuple(Overflow):
            raise ValueError("on_overflow is 'error' or 'count'")
        self.on_overflow = Overflow(on_overflow)
        self.idle = IdleKeys(idle_timeout)
        self.module = self.kernel.module
        self.layout = self.kernel.layout
        self.n_channels = len(self.plan.channels)
        self.keys = KeyIndex([a.name for a in self.query.partition_by])
        self.uses_tables = any(f"s_{t}[" in self.kernel.source
                               for t in ("rank", "lower", "upper", "length"))
        self._tables: StringTables | None = None
        self.output = SeqOutput(self)

    # ------------------------------------------------------------ state

    def _reset_channels(self) -> None:
        C = self.n_channels
        self.P = 0
        for name, fill in self._PER_PARTITION.items():
            setattr(self, name, np.full(0, fill, np.int64))
        for name in self._PER_CHANNEL:
            setattr(self, name, np.zeros((0, C), np.int64))
        self.top = np.zeros(C, np.int64)
        self.pd = np.zeros((16, self.kernel.record_width), np.int64)
        self.pk = np.zeros(16, np.int64)
        self.ctr = np.zeros(CTR_SIZE, np.int64)
        self.ctr[ERR] = -1
        self.punct = INT64_MIN
        nI, nF = self.layout.n_int, self.layout.n_float
        self.AI = [np.zeros((64, nI), np.int64) for _ in range(C)]
        self.AF = [np.zeros((64, nF), np.float64) for _ in range(C)]

    def _grow_partitions(self, P: int) -> None:
        """Per-partition arrays for partition ids < P (capacity grows by doubling)."""
        if P <= self.P:
            return
        cap = len(self.last_ts)
        if P > cap:
            extra = max(P, 2 * cap, 16) - cap
            for name, fill in self._PER_PARTITION.items():
                setattr(self, name, np.concatenate([getattr(self, name),
                                                    np.full(extra, fill, np.int64)]))
            for name in self._PER_CHANNEL:
                setattr(self, name, np.concatenate([
                    getattr(self, name), np.zeros((extra, self.n_channels), np.int64)]))
        self.P = P

    def _keyed(self, batch: Batch) -> I64 | None:
        """The partition of each event of a batch, the partitions grown to hold its new
        keys; None for an empty batch (what every SEQ engine, the GPU's too, does first)."""
        if len(batch) == 0:
            return None
        pid = self.keys.assign(batch)
        self._grow_partitions(len(self.keys))
        return pid

    def _strings(self) -> tuple[I64, tuple[I64, ...]]:
        sc = self.kernel.constants.codes(self.strings)
        if self.uses_tables:
            self._tables = StringTables.current(self._tables, self.strings)
            tables = self._tables.arrays()
        else:
            dummy = np.zeros(1, np.int64)
            tables = (dummy, dummy, dummy, dummy)
        return sc, tables

    def _arenas(self) -> list[I64 | F64]:
        out: list[I64 | F64] = []
        for c in range(self.n_channels):
            out += [self.AI[c], self.AF[c]]
        return out

    def _columns(self, batch: Batch) -> tuple[I64, F64]:
        """The batch as the kernels' event rows: ints (seq, ts, int attributes) and
        floats."""
        n = len(batch)
        EI = np.empty((n, self.layout.n_int), np.int64)
        EI[:, 0] = batch.seq
        EI[:, 1] = batch.ts
        for k, name in enumerate(self.layout.int_names):
            EI[:, 2 + k] = batch.columns[name]
        EF = np.zeros((n, self.layout.n_float), np.float64)
        for k, name in enumerate(self.layout.float_names):
            EF[:, k] = batch.columns[name]
        return EI, EF

    def _take_arenas(self, arenas: Sequence[Any]) -> None:
        self.AI = list(arenas[0::2])
        self.AF = list(arenas[1::2])

    def _release(self, parts: I64) -> None:
        """Give the ids of these partitions (empty and idle) to new keys, their rows reset
        to a new partition's; their arena segments are kept for them."""
        if len(parts):
            for name, fill in self._PER_PARTITION.items():  # as a new partition's
                getattr(self, name)[parts] = fill
            self.keys.release(parts.tolist())
            self.output.forget_keys(parts)
            self.idle.released += len(parts)

    def _reject_backwards(self, batch: Batch, dead: I64, n_dead: int) -> None:
        for t in dead[:n_dead].tolist():
            self.dead_letters.append((int(batch.seq[t]), BACKWARDS_TIME))

    def _maybe_compact_pending(self, force: bool = False) -> None:
        used, alive = int(self.ctr[PN]), int(self.ctr[PALIVE])
        if used == 0 or (not force and used - alive < max(1024, alive)):
            return
        self.pd, self.pk = compact_pending(
            self.pd, self.pk, self.phead[:self.P], self.ptail[:self.P], self.ctr,
            self.pending_kleene_slots, alive, int(self.ctr[PKN]))

    # ------------------------------------------------------------ string compaction

    def _string_columns(self) -> list[int]:
        """The int columns of a channel row that hold string codes."""
        return string_columns(self.layout, self.schema)

    def _key_string_positions(self) -> list[int]:
        return [i for i, a in enumerate(self.keys.attrs)
                if self.schema.attributes[a] == AttrType.STRING]

    def _stored_rows(self, c: int) -> I64:
        """Arena rows of channel c that hold stored events (every partition's)."""
        return segment_rows(self.base[:self.P, c], self.cnt[:self.P, c])

    def string_codes(self) -> I64:
        """Partition keys and the string attributes of stored events (pending matches and
        instances refer to stored rows; released partitions store none)."""
        out = [np.asarray(self.keys.string_codes(self._key_string_positions()), np.int64)]
        columns = self._string_columns()
        if columns:
            for c in range(self.n_channels):
                out.append(self.AI[c][self._stored_rows(c)][:, columns].ravel())
        return np.concatenate(out + self._more_string_codes())

    def remap_strings(self, new_code: I64) -> None:
        self.keys.remap_strings(self._key_string_positions(), new_code)
        columns = self._string_columns()
        if columns:
            for c in range(self.n_channels):
                rows = self._stored_rows(c)[:, None]
                self.AI[c][rows, columns] = new_code[self.AI[c][rows, columns]]
        self._remap_more_strings(new_code)

    def _more_string_codes(self) -> list[I64]:
        """A subclass's own string codes (beyond keys and stored events)."""
        return []

    def _remap_more_strings(self, new_code: I64) -> None:
        pass

    # ------------------------------------------------------------ decoding

    def _decode(self, n_out: int, n_el: int, om: I64, oe_i: I64, oe_f: F64, ovi: I64, ovf: F64,
                ovn: I64) -> ColumnBatch:
        return self.output.columns(n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn)

    # ------------------------------------------------------------ snapshots

    def _channel_state(self) -> tuple[Meta, Arrays]:
        """(meta, arrays) of what both engines keep: keys, clock, idle bookkeeping,
        per-partition arrays, ctr, pending matches and each partition's stored events."""
        P = self.P
        meta: Meta = {"keys": self.keys.to_state(), "punct": int(self.punct), "partitions": P,
                "algorithm": self.algorithm,
                "idle": self.idle.state()}
        arrays: Arrays = {name: getattr(self, name)[:P] for name in self._PER_PARTITION}
        arrays.update({"cnt": self.cnt[:P], "evicted": self.evicted[:P], "ctr": self.ctr,
                       "pd": self.pd[:int(self.ctr[PN])], "pk": self.pk[:int(self.ctr[PKN])]})
        nI, nF = self.layout.n_int, self.layout.n_float
        for c in range(self.n_channels):
            spans = [slice(self.base[p, c], self.base[p, c] + self.cnt[p, c])
                     for p in range(P)]
            arrays[f"ch{c}_i"] = np.concatenate([self.AI[c][s] for s in spans]) if spans \
                else np.zeros((0, nI), np.int64)
            arrays[f"ch{c}_f"] = np.concatenate([self.AF[c][s] for s in spans]) if spans \
                else np.zeros((0, nF))
        return meta, arrays

    def _load_channel_state(self, meta: Meta, arrays: Arrays) -> None:
        """Puts back `_channel_state` (after `_reset`); arenas get room to grow."""
        self.keys = KeyIndex.from_state(self.keys.attrs, meta["keys"])
        self.output.forget_keys()
        P = int(meta["partitions"])
        self._grow_partitions(P)
        self.punct = int(meta["punct"])
        self.idle.load_state(meta["idle"])
        for name in (*self._PER_PARTITION, "cnt", "evicted"):
            getattr(self, name)[:P] = arrays[name]
        self.ctr = arrays["ctr"].astype(np.int64).copy()
        pd, pk = arrays["pd"], arrays["pk"]
        self.pd = np.zeros((max(16, 2 * len(pd)), self.kernel.record_width), np.int64)
        self.pd[:len(pd)] = pd
        self.pk = np.zeros(max(16, 2 * len(pk)), np.int64)
        self.pk[:len(pk)] = pk
        nI, nF = self.layout.n_int, self.layout.n_float
        for c in range(self.n_channels):
            rows_i, rows_f = arrays[f"ch{c}_i"], arrays[f"ch{c}_f"]
            sizes = [max(8, 2 * int(k)) for k in self.cnt[:P, c]]
            total = max(64, 2 * sum(sizes))
            self.AI[c] = np.zeros((total, nI), np.int64)
            self.AF[c] = np.zeros((total, nF), np.float64)
            at = offset = 0
            for p in range(P):
                k = int(self.cnt[p, c])
                self.AI[c][at:at + k] = rows_i[offset:offset + k]
                self.AF[c][at:at + k] = rows_f[offset:offset + k]
                self.base[p, c] = at
                self.size[p, c] = sizes[p]
                at += sizes[p]
                offset += k
            self.top[c] = at
