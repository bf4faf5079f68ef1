"""What every jitted engine shares: the Engine interface, decoding results, snapshots."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from cep_core import snapshot_format
from cep_core.batch import Batch, StringDictionary, decode_value
from cep_core.checked import CheckedQuery
from cep_core.composite_batch import CompositeBatch, RowBatch, to_dicts

if TYPE_CHECKING:
    from cep_core.placement import Placement

Composite = dict[str, Any]  # a composite event as the reference interpreter gives it
Meta = dict[str, Any]  # the JSON part of a state or snapshot
Arrays = dict[str, npt.NDArray[Any]]  # the named arrays of a state (of several dtypes)


class Engine(ABC):
    """Runs one checked query over columnar batches, keeping per-key state between them.

    `process(batch)`, `punctuate(ts)` and `flush()` return composite events exactly as the
    reference interpreter would (same dicts); `process_columns(batch)` returns the same
    events as `CompositeBatch`es (columns, no dict per event). An engine implements one of
    the two `process` methods; the other is derived from it. `dead_letters` collects
    (seq, reason) of the events the engine rejected. `snapshot()` is the whole state as
    bytes; `restore(bytes)` puts it back into a new engine of the same query.
    """

    placement: Placement  # where it runs and why (set by cep_core.engine_factory.create_engine)

    def __init__(self, checked: CheckedQuery, strings: StringDictionary):
        kind = type(self)
        if kind.process is Engine.process and kind.process_columns is Engine.process_columns:
            # each defaults to the other: an engine with neither would recurse forever
            raise TypeError(f"{kind.__name__} implements neither process nor process_columns")
        self.checked = checked
        self.query = checked.query
        self.schema = checked.schema
        self.strings = strings
        self.dead_letters: list[tuple[int, str]] = []

    def process(self, batch: Batch) -> list[Composite]:
        return to_dicts(self.process_columns(batch))

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        rows = self.process(batch)
        return [RowBatch(rows)] if rows else []

    def punctuate(self, ts: int) -> list[Composite]:
        return []

    def flush(self) -> list[Composite]:
        return []

    def punctuate_columns(self, ts: int) -> list[CompositeBatch]:
        """`punctuate` as CompositeBatches (engines that decode columns override it)."""
        rows = self.punctuate(ts)
        return [RowBatch(rows)] if rows else []

    def flush_columns(self) -> list[CompositeBatch]:
        rows = self.flush()
        return [RowBatch(rows)] if rows else []

    @abstractmethod
    def state(self) -> tuple[Meta, Arrays]:
        """(JSON-able metadata, named numpy arrays) that make up the whole state."""

    @abstractmethod
    def load_state(self, meta: Meta, arrays: Arrays) -> None: ...

    # ------------------------------------------------------------ string compaction

    def string_codes(self) -> npt.NDArray[np.int64]:
        """Every string code the state holds (in keys, partial matches, buffered events,
        groups, ...), duplicates allowed: the strings `StringDictionary.compact` must keep."""
        raise NotImplementedError(f"{type(self).__name__} cannot compact its strings")

    def remap_strings(self, new_code: npt.NDArray[np.int64]) -> None:
        """Replace every string code `c` the state holds by `new_code[c]` (the dictionary
        has just been compacted; the renumbering keeps the order of codes), and drop
        anything derived from the old codes."""
        raise NotImplementedError(f"{type(self).__name__} cannot compact its strings")

    def snapshot(self, with_strings: bool = True) -> bytes:
        """`with_strings=False`: leave the string dictionary out (whoever restores puts
        the same dictionary back first, as StreamEngines does for all its queries)."""
        meta, arrays = self.state()
        meta = {"query": self.checked.name, "kind": self.query.kind, "strings":
                self.strings.strings if with_strings else None,
                "dead_letters": self.dead_letters, **meta}
        return snapshot_format.pack_arrays("engine", meta, arrays)

    def restore(self, data: bytes) -> None:
        meta, arrays = snapshot_format.unpack_arrays("engine", data)
        if meta["query"] != self.checked.name or meta["kind"] != self.query.kind:
            raise ValueError(f"snapshot of {meta['kind']} query {meta['query']!r} cannot "
                             f"restore {self.query.kind} query {self.checked.name!r}")
        if meta["strings"] is not None:
            for s in meta["strings"]:
                self.strings.code(s)
            if self.strings.strings[:len(meta["strings"])] != meta["strings"]:
                raise ValueError("snapshot was taken with another string dictionary")
        self.load_state(meta, arrays)  # (refused: nothing changed)
        self.dead_letters = [tuple(d) for d in meta["dead_letters"]]

    # ------------------------------------------------------------ decoding results

    def decode(self, kind: str, value: object) -> object:
        """A column or kernel value as the Python value the reference interpreter gives."""
        return decode_value(kind, value, self.strings)

    def decode_key(self, attrs: list[str], key: tuple[object, ...]) -> object:
        """A KeyIndex value as the composite event's `key` (None, a value, or a list)."""
        if not attrs:
            return None
        values = [self.decode(self.schema.attributes[a], v) for a, v in zip(attrs, key)]
        return values[0] if len(values) == 1 else values
