"""Partition keys -> dense ids, so per-key state lives in arrays indexed by id."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from cep_core.batch import Batch

Key = tuple[object, ...]  # a key's column values (string codes, ints, floats, bools)


class KeyIndex:
    """Dense ids 0, 1, 2, ... for the values of PARTITION BY / GROUP BY attributes.

    Ids are assigned in order of first appearance. `values[id]` is the key as columns hold it
    (a tuple of column values: string codes, ints, floats, bools); no attributes: one key.
    `release(ids)` forgets keys (their `values` become None); their ids go to new keys
    before fresh ones do, so `len()` (the id range) stays bounded by the keys live at once.
    """

    def __init__(self, attrs: list[str]):
        self.attrs = attrs
        self.ids: dict[Key, int] = {}
        self.values: list[Key | None] = []
        self.free: list[int] = []

    def __len__(self) -> int:
        return len(self.values)

    def assign(self, batch: Batch) -> npt.NDArray[np.int64]:
        """The key id of every event of the batch (int64)."""
        n = len(batch)
        if not self.attrs:
            if () not in self.ids:  # first use, or released while idle
                self._new(())
            return np.zeros(n, dtype=np.int64)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        columns = [batch.columns[a] for a in self.attrs]
        if len(columns) == 1:
            uniques, inverse = np.unique(columns[0], return_inverse=True)
            keys = [(u,) for u in uniques.tolist()]
        else:
            records = np.rec.fromarrays(columns)
            uniques, inverse = np.unique(records, return_inverse=True)
            keys = [tuple(u) for u in uniques.tolist()]
        # First appearance order: walk uniques by the first row each occurs in.
        first_row = np.full(len(keys), n, dtype=np.int64)
        np.minimum.at(first_row, inverse.reshape(-1), np.arange(n, dtype=np.int64))
        mapping = np.empty(len(keys), dtype=np.int64)
        for u in np.argsort(first_row, kind="stable"):
            key = keys[u]
            found = self.ids.get(key)
            mapping[u] = found if found is not None else self._new(key)
        return mapping[inverse.reshape(-1)]

    def _new(self, key: Key) -> int:
        if self.free:
            k = self.free.pop()
            self.values[k] = key
        else:
            k = len(self.values)
            self.values.append(key)
        self.ids[key] = k
        return k

    def release(self, ids: Iterable[int]) -> None:
        for k in ids:
            key = self.values[k]
            if key is None:
                raise KeyError(f"key id {k} is not in use")
            del self.ids[key]
            self.values[k] = None
            self.free.append(k)

    def string_codes(self, positions: list[int]) -> list[object]:
        """The string codes held at `positions` (the string attributes) of live keys."""
        return [key[i] for key in self.ids for i in positions]

    def remap_strings(self, positions: list[int], new_code: npt.NDArray[np.int64]) -> None:
        """Renumber the string codes at `positions` of every live key (see
        `StringDictionary.compact`); ids stay as they are."""
        if not positions:
            return
        strings = set(positions)
        table = new_code.tolist()

        def remapped(key: Key) -> Key:
            return tuple(table[v] if i in strings else v for i, v in enumerate(key))
        self.values = [None if key is None else remapped(key) for key in self.values]
        self.ids = {key: k for k, key in enumerate(self.values) if key is not None}

    def to_state(self) -> list[list[object] | None]:
        return [None if k is None else list(k) for k in self.values]

    @classmethod
    def from_state(cls, attrs: list[str], values: list[list[object] | None]) -> KeyIndex:
        index = cls(attrs)
        for k, key in enumerate(values):
            index.values.append(None if key is None else tuple(key))
            if key is None:
                index.free.append(k)
            else:
                index.ids[tuple(key)] = k
        index.free.reverse()  # the lowest free id is taken first
        return index
